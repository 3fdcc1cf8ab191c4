"""5. Authorization (issue 33), on both deployed templates: IAM by default, JSON Web Tokens when
JwtIssuer is set. Without a JwtIssuer every REST method (not the preflight) and the WebSocket $connect
are AWS_IAM, and no authorizer of any kind exists; with one, the authorizer function (functions/
authorizer: JWT_ISSUER, JWT_AUDIENCE, JWKS_URL and ACCESS_POLICY from the parameters, a role on its own log
group only, API Gateway allowed to invoke it for each API's authorizers) authorizes every REST method
(a REQUEST authorizer on the Authorization header, never cached) and $connect (a REQUEST authorizer
without an identity source: the token comes as the `token` query parameter or the Authorization
header). A rule refuses an issuer without an audience. AccessPolicy reaches the coordinator, the
connections function, the stream processor and the authorizer as ACCESS_POLICY, and no other function;
MaxConnectionsPerPrincipal the connections function as MAX_CONNECTIONS_PER_PRINCIPAL; the stream
processor may read its subscribers' connection items (BatchGetItem on the connections table, push-time
authorization). And every other check of infra/tests holds with JSON Web Tokens on too (the authorizer
has its logging, tracing, alarms and dashboard rows like every function)."""

from __future__ import annotations

import shutil

import pytest

import breaking as b
from cfn import CDK_TEMPLATE, REPO, as_list
from production_checks import (
    ACCESS_POLICY_READERS,
    ACCESS_POLICY_VARIABLE,
    MAX_CONNECTIONS_VARIABLE,
    check_access_policy,
    check_authorization,
    check_max_connections,
    check_subscriber_reads,
    max_connections_contract,
    rule_failures,
)
from system import role_of
from template_checks import (
    AUTHORIZER_BINARY,
    JWT_ISSUER_EXAMPLE,
    check_apis,
    check_environment,
    check_event_sources,
    check_functions,
    check_grants_match_code,
    check_iam,
    check_invoke_only_registered,
    check_lake,
    check_participant_isolation,
    check_permissions_complete,
    check_schedule,
    check_service_operations,
    check_storage,
    check_tables,
    jwt_enabled,
    rest_methods,
    with_jwt,
)
from test_cdk_code import build_dirs, check_cdk_code
from test_production import CHECKS as PRODUCTION_CHECKS
from test_sam_source import check_build_metadata

PARAMETERS = ["JwtIssuer", "JwtAudience", "JwksUrl", "AccessPolicy", "MaxConnectionsPerPrincipal"]

CHECKS = {
    "authorization": check_authorization,
    "access-policy": check_access_policy,
    "max-connections": check_max_connections,
    "subscriber-reads": check_subscriber_reads,
}


@pytest.mark.parametrize("check", CHECKS)
def test_authorization_detail(stack, check):
    assert CHECKS[check](stack) == []


def test_the_contract_names_the_authorization_variables(contract):
    environment = contract["functionEnvironment"]
    assert {"JWT_ISSUER", "JWT_AUDIENCE", "JWKS_URL", ACCESS_POLICY_VARIABLE} <= set(environment[AUTHORIZER_BINARY])
    assert {b for b, names in environment.items() if ACCESS_POLICY_VARIABLE in names} == set(ACCESS_POLICY_READERS)
    assert [b for b, names in environment.items() if MAX_CONNECTIONS_VARIABLE in names] == ["connections"]


def test_the_connection_cap_is_read_from_the_code():
    assert max_connections_contract() == {"variable": MAX_CONNECTIONS_VARIABLE, "default": 10}


def test_the_authorization_parameters_are_the_same_in_both_templates(sam, cdk):
    # The same deploy-time interface: name, type, default, bounds, pattern and description; the same rule.
    for name in PARAMETERS:
        assert sam.template["Parameters"][name] == cdk.template["Parameters"][name], name
    assert sam.template["Rules"] == cdk.template["Rules"]


def test_the_defaults_are_iam_and_tokens_are_a_parameter_away(stack):
    assert not jwt_enabled(stack)
    assert rule_failures(stack) == []
    assert rule_failures(with_jwt(stack)) == []
    assert rule_failures(with_jwt(stack, audience="")) != []
    for jwt, authorization in [(False, "AWS_IAM"), (True, "CUSTOM")]:
        evaluated = with_jwt(stack) if jwt else stack
        methods = rest_methods(evaluated)
        assert {m["authorization"] for (verb, _), m in methods.items() if verb != "OPTIONS"} == {authorization}
        assert {m["authorization"] for (verb, _), m in methods.items() if verb == "OPTIONS"} == {"NONE"}


# --- every check of the deployment holds with JSON Web Tokens on ----------------------------------

EVERY_CHECK = {
    "tables": check_tables,
    "environment": check_environment,
    "service-operations": check_service_operations,
    "iam": check_iam,
    "invoke-only-registered": check_invoke_only_registered,
    "participant-isolation": check_participant_isolation,
    "permissions-complete": check_permissions_complete,
    "grants-match-code": check_grants_match_code,
    "functions": check_functions,
    "event-sources": check_event_sources,
    "storage": check_storage,
    "apis": check_apis,
    "lake": check_lake,
    "schedule": check_schedule,
    **PRODUCTION_CHECKS,
}


@pytest.mark.parametrize("check", EVERY_CHECK)
def test_every_check_holds_with_json_web_tokens(stack, check):
    assert EVERY_CHECK[check](with_jwt(stack)) == []


def test_sam_builds_the_authorizer_from_its_binary(raw, sam):
    assert raw["Resources"]["AuthorizerFunction"]["Metadata"]["BuildProperties"]["Binary"] == AUTHORIZER_BINARY
    assert check_build_metadata(raw, with_jwt(sam)) == []


def test_cdk_deploys_the_authorizers_binary(cdk):
    assert check_cdk_code(with_jwt(cdk), CDK_TEMPLATE.parent, build_dirs()) == []


# --- the checks can fail ----------------------------------------------------------------------------


def _parameters(stack) -> dict:
    return stack.template["Parameters"]


def _authorizer_variables(stack) -> dict:
    return b.variables_of(stack, b.authorizer_function(stack))


def _authorizer_role(stack) -> str:
    return role_of(with_jwt(stack), b.authorizer_function(stack))


def _route(stack, key: str) -> dict:
    return b.props(stack, b.websocket_route(stack, key))


def _drop_condition(stack, kind: str) -> None:
    for name in b.of_type(stack, kind):
        b.resource(stack, name).pop("Condition", None)


def _permissions_of_api(stack, api: str) -> list[str]:
    """The permissions on the authorizer whose SourceArn names the API (resolved with tokens on)."""
    jwt = with_jwt(stack)
    return [
        name
        for name in b.of_type(stack, "AWS::Lambda::Permission")
        if ":${%s}/authorizers/" % api in str(jwt.props(name).get("SourceArn"))
    ]


def _add_authorizer_permission(stack, principal, source=None) -> None:
    stack.template["Resources"]["ExtraAuthorizerPermission"] = {
        "Type": "AWS::Lambda::Permission",
        "Condition": "UseJwt",
        "Properties": {
            "Action": "lambda:InvokeFunction",
            "FunctionName": b.getatt(b.authorizer_function(stack), "Arn"),
            "Principal": principal,
            **({"SourceArn": source} if source else {}),
        },
    }


def _remove_grant(stack, binary: str, action: str) -> None:
    for statements in b.raw_statements(stack, role_of(stack, b.function(stack, binary))):
        for entry in list(statements):
            if isinstance(entry, dict) and action in as_list(entry.get("Action")):
                rest = [a for a in as_list(entry["Action"]) if a != action]
                if rest:
                    entry["Action"] = rest
                else:
                    statements.remove(entry)


def _another_function_uri(stack) -> dict:
    coordinator = b.function(stack, "coordinator")
    return {"Fn::Sub": "arn:${AWS::Partition}:apigateway:${AWS::Region}:lambda:path/2015-03-31/functions/${%s.Arn}/invocations" % coordinator}


BREAKAGES = {
    # the parameters and the rule
    "no-jwt-issuer-parameter": ("authorization", lambda s: _parameters(s).pop("JwtIssuer")),
    "jwt-issuer-default-set": ("authorization", lambda s: _parameters(s)["JwtIssuer"].update(Default=JWT_ISSUER_EXAMPLE)),
    "jwt-issuer-takes-http": ("authorization", lambda s: _parameters(s)["JwtIssuer"].update(AllowedPattern=".*")),
    "jwt-audience-a-number": ("authorization", lambda s: _parameters(s)["JwtAudience"].update(Type="Number")),
    "no-audience-rule": ("authorization", lambda s: s.template.pop("Rules")),
    "audience-rule-always-fails": (
        "authorization",
        lambda s: [r.pop("RuleCondition") for r in s.template["Rules"].values()]
        + [a.update(Assert={"Fn::Equals": ["a", "b"]}) for r in s.template["Rules"].values() for a in r["Assertions"]],
    ),
    # without tokens: IAM, no authorizer
    "websocket-authorizer-without-jwt": ("authorization", lambda s: _drop_condition(s, "AWS::ApiGatewayV2::Authorizer")),
    "authorizer-function-without-jwt": ("authorization", lambda s: b.resource(s, b.authorizer_function(s)).pop("Condition")),
    "connect-custom-without-jwt": ("authorization", lambda s: _route(s, "$connect").update(AuthorizationType="CUSTOM")),
    "rest-method-of-another-authorizer": ("authorization", lambda s: b.set_rest_method_authorization(s, "POST", "commit", "CUSTOM")),
    # with tokens: the REST API's authorizer
    "rest-method-iam-with-jwt": ("authorization", lambda s: b.set_rest_method_authorization(s, "GET", "{id}", "AWS_IAM")),
    "rest-authorizer-cached": ("authorization", lambda s: b.set_rest_authorizer(s, "ttl", 300)),
    "rest-authorizer-default-cache": ("authorization", lambda s: b.set_rest_authorizer(s, "ttl", None)),
    "rest-authorizer-token-type": ("authorization", lambda s: b.set_rest_authorizer(s, "type", "TOKEN")),
    "rest-authorizer-other-header": (
        "authorization",
        lambda s: b.set_rest_authorizer(s, "identitySource", "method.request.header.X-Token"),
    ),
    "rest-authorizer-another-function": ("authorization", lambda s: b.set_rest_authorizer(s, "uri", _another_function_uri(s))),
    "preflight-authorized-with-jwt": ("authorization", lambda s: b.set_preflight_authorization(s, "AWS_IAM")),
    # with tokens: the WebSocket API's authorizer
    "connect-iam-with-jwt": (
        "authorization",
        lambda s: [_route(s, "$connect").update(AuthorizationType="AWS_IAM"), _route(s, "$connect").pop("AuthorizerId")],
    ),
    "connect-authorizer-identity-source": (
        "authorization",
        lambda s: [
            b.props(s, a).update(IdentitySource=["route.request.header.Authorization"])
            for a in b.of_type(s, "AWS::ApiGatewayV2::Authorizer")
        ],
    ),
    "connect-authorizer-jwt-type": (
        "authorization",
        lambda s: [b.props(s, a).update(AuthorizerType="JWT") for a in b.of_type(s, "AWS::ApiGatewayV2::Authorizer")],
    ),
    "subscribe-authorized-too": ("authorization", lambda s: _route(s, "subscribe").update(AuthorizationType="AWS_IAM")),
    # with tokens: the authorizer function
    "authorizer-issuer-hard-coded": ("authorization", lambda s: _authorizer_variables(s).update(JWT_ISSUER=JWT_ISSUER_EXAMPLE)),
    "authorizer-audience-from-the-issuer": ("authorization", lambda s: _authorizer_variables(s).update(JWT_AUDIENCE=b.ref("JwtIssuer"))),
    "authorizer-keys-hard-coded": ("authorization", lambda s: _authorizer_variables(s).update(JWKS_URL="")),
    "no-jwks-url-parameter": ("authorization", lambda s: _parameters(s).pop("JwksUrl")),
    "authorizer-role-reads-a-table": (
        "authorization",
        lambda s: b.raw_statements(s, _authorizer_role(s))[0].append(
            {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": b.getatt(b.table(s, "connections"), "Arn")}
        ),
    ),
    "authorizer-role-writes-another-log-group": (
        "authorization",
        lambda s: b.raw_statements(s, _authorizer_role(s))[0].append(
            {
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": b.getatt("CoordinatorLogGroup", "Arn"),
            }
        ),
    ),
    "no-rest-api-permission": (
        "authorization",
        lambda s: [s.template["Resources"].pop(p) for p in _permissions_of_api(s, "RestApi")],
    ),
    "no-websocket-api-permission": (
        "authorization",
        lambda s: [s.template["Resources"].pop(p) for p in _permissions_of_api(s, b.only(s, "AWS::ApiGatewayV2::Api"))],
    ),
    "authorizer-invokable-by-anyone": ("authorization", lambda s: _add_authorizer_permission(s, "*")),
    "authorizer-invokable-for-every-route": (
        "authorization",
        lambda s: _add_authorizer_permission(
            s,
            "apigateway.amazonaws.com",
            {"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${RestApi}/*"},
        ),
    ),
    "jwt-issuer-on-the-coordinator": ("authorization", lambda s: b.variables(s, "coordinator").update(JWT_ISSUER=b.ref("JwtIssuer"))),
    # the access policy
    "no-access-policy-parameter": ("access-policy", lambda s: _parameters(s).pop("AccessPolicy")),
    "access-policy-default": ("access-policy", lambda s: _parameters(s)["AccessPolicy"].update(Default='{"allowCredits": false}')),
    # The default of older versions: credits to nothing named (issue 42 names the wallets' balances).
    "access-policy-default-names-no-credits": ("access-policy", lambda s: _parameters(s)["AccessPolicy"].update(Default="{}")),
    "access-policy-pattern-refuses-a-policy": ("access-policy", lambda s: _parameters(s)["AccessPolicy"].update(AllowedPattern="\\{\\}")),
    "access-policy-missing-on-the-stream-processor": (
        "access-policy",
        lambda s: b.variables(s, "stream-processor").pop(ACCESS_POLICY_VARIABLE),
    ),
    "access-policy-missing-on-the-authorizer": ("access-policy", lambda s: _authorizer_variables(s).pop(ACCESS_POLICY_VARIABLE)),
    "access-policy-hard-coded": ("access-policy", lambda s: b.variables(s, "coordinator").update(ACCESS_POLICY="{}")),
    "access-policy-on-the-sweeper": ("access-policy", lambda s: b.variables(s, "sweeper").update(ACCESS_POLICY=b.ref("AccessPolicy"))),
    "access-policy-in-another-variable": (
        "access-policy",
        lambda s: b.variables(s, "connections").update(MAX_TOPICS_PER_CONNECTION=b.ref("AccessPolicy")),
    ),
    # the connections one caller may hold
    "no-max-connections-parameter": ("max-connections", lambda s: _parameters(s).pop("MaxConnectionsPerPrincipal")),
    "max-connections-hard-coded": (
        "max-connections",
        lambda s: b.variables(s, "connections").update(MAX_CONNECTIONS_PER_PRINCIPAL="10"),
    ),
    "max-connections-default": ("max-connections", lambda s: _parameters(s)["MaxConnectionsPerPrincipal"].update(Default=100)),
    "max-connections-unbounded": ("max-connections", lambda s: _parameters(s)["MaxConnectionsPerPrincipal"].pop("MaxValue")),
    "max-connections-zero-allowed": ("max-connections", lambda s: _parameters(s)["MaxConnectionsPerPrincipal"].update(MinValue=0)),
    "max-connections-on-the-stream-processor": (
        "max-connections",
        lambda s: b.variables(s, "stream-processor").update(MAX_CONNECTIONS_PER_PRINCIPAL=b.ref("MaxConnectionsPerPrincipal")),
    ),
    # push-time authorization: the stream processor reads its subscribers' connection items
    "stream-processor-cannot-read-subscribers": (
        "subscriber-reads",
        lambda s: _remove_grant(s, "stream-processor", "dynamodb:BatchGetItem"),
    ),
    "stream-processor-batch-reads-another-table": (
        "subscriber-reads",
        lambda s: b.statement(s, "stream-processor", "dynamodb:BatchGetItem")["Resource"].append(
            b.getatt(b.table(s, "transactions"), "Arn")
        ),
    ),
    "connections-function-batch-reads-the-table": (
        "subscriber-reads",
        lambda s: b.statement(s, "connections", "dynamodb:Query").update(
            Action=[*as_list(b.statement(s, "connections", "dynamodb:Query")["Action"]), "dynamodb:BatchGetItem"]
        ),
    ),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_authorization_check_catches(breakage, stack):
    check, damage = BREAKAGES[breakage]
    damage(stack)
    assert CHECKS[check](stack) != []


# The deployment's own checks see the same breakages when tokens are on: the APIs' (check_apis) and the
# environment's (check_environment).
JWT_API_BREAKAGES = [
    "rest-method-iam-with-jwt",
    "rest-authorizer-cached",
    "rest-authorizer-default-cache",
    "rest-authorizer-token-type",
    "rest-authorizer-other-header",
    "rest-authorizer-another-function",
    "connect-iam-with-jwt",
    "connect-authorizer-identity-source",
    "connect-authorizer-jwt-type",
]


@pytest.mark.parametrize("breakage", JWT_API_BREAKAGES)
def test_api_check_catches_with_json_web_tokens(breakage, stack):
    BREAKAGES[breakage][1](stack)
    assert check_apis(with_jwt(stack)) != []


def test_api_check_catches_a_custom_connect_without_json_web_tokens(stack):
    _route(stack, "$connect").update(AuthorizationType="CUSTOM")
    assert check_apis(stack) != []


@pytest.mark.parametrize(
    "breakage,jwt",
    [
        # deployed without a JwtIssuer: nothing could invoke it, and it means the condition is lost
        ("authorizer-function-without-jwt", False),
        ("access-policy-missing-on-the-authorizer", True),
        ("jwt-issuer-on-the-coordinator", True),
        ("max-connections-on-the-stream-processor", False),
    ],
)
def test_environment_check_catches(breakage, jwt, stack):
    BREAKAGES[breakage][1](stack)
    assert check_environment(with_jwt(stack) if jwt else stack) != []


def test_environment_check_catches_a_missing_authorizer_with_json_web_tokens(stack):
    del stack.template["Resources"][b.authorizer_function(stack)]
    problems = check_environment(with_jwt(stack))
    assert any(repr(AUTHORIZER_BINARY) in p for p in problems), problems
    # Without tokens nobody misses it.
    assert check_environment(stack) == []


def test_grant_check_holds_the_subscriber_read_to_the_code(tmp_path, stack):
    # The stream processor's BatchGetItem on the connections table is granted for the connections
    # store's push-time read of its subscribers (functions/fanout/src/connections.rs): when the
    # store stops calling it, the grant is left over.
    functions_dir = tmp_path / "functions"
    shutil.copytree(REPO / "functions", functions_dir, ignore=shutil.ignore_patterns("target", "*.zip"))
    store = functions_dir / "fanout" / "src" / "connections.rs"
    store.write_text(store.read_text().replace(".batch_get_item()", ".batch_read()"))
    problems = check_grants_match_code(stack, functions_dir)
    assert "dynamodb:BatchGetItem is granted on the connections table(s), the code never calls it" in problems, problems
