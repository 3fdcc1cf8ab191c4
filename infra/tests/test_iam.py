"""2. Least privilege, on both deployed templates: no action wildcards, no "*" resource except the
justified allow-list (template_checks.STAR_RESOURCE_ALLOWED: dynamodb:ListStreams and, with tracing
on, X-Ray's two actions, which IAM cannot scope), wildcards inside ARNs only as `bucket/*` and
`stage/POST/@connections/*` (the region's `log-group:*` only in the role API Gateway alone assumes, the
audit bucket's `s3-access/*` and `cloudtrail/...` only to the logging service writing there), no managed policies, one role per function, lambda:InvokeFunction only
on (and on every) registered participant's `live` alias; and the actions granted on each table are
exactly the SDK calls the code's store for that table makes, the other services' actions (Firehose,
WebSocket, Lambda, SQS, Secrets Manager: the message keys) exactly those the code calls."""

from __future__ import annotations

import shutil

import pytest

import breaking as b
from cfn import REPO, as_list
from system import allow_statements, binary_of, functions, role_of
from template_checks import (
    check_grants_match_code,
    check_iam,
    check_invoke_only_registered,
    check_participant_isolation,
    check_participants_cannot_decide,
    check_permissions_complete,
    with_jwt,
)


def test_no_wildcards_and_no_managed_policies(stack):
    assert check_iam(stack) == []


def test_invoke_only_registered_participants(stack):
    assert check_invoke_only_registered(stack) == []


def test_participants_reach_only_their_own_table(stack):
    assert check_participant_isolation(stack) == []


def test_no_participant_can_write_a_decision_or_reshape_a_record(stack):
    assert check_participants_cannot_decide(stack) == []


def _participant_records_statement(stack, binary, action):
    return b.statement(stack, binary, action, where="TransactionsTable")


@pytest.mark.parametrize("binary", ["participant", "inventory"])
def test_decision_check_catches_a_participant_that_may_update_a_record(stack, binary):
    # The grant issue 42 took away: a status flip to COMMITTING, operations rewritten.
    _participant_records_statement(stack, binary, "dynamodb:GetItem")["Action"] = ["dynamodb:GetItem", "dynamodb:UpdateItem"]
    assert any("UpdateItem" in p for p in check_participants_cannot_decide(stack))


@pytest.mark.parametrize("binary", ["participant", "inventory"])
def test_decision_check_catches_a_put_of_any_record(stack, binary):
    # PutItem without the key condition: any record overwritten, a held one as COMMITTING.
    _participant_records_statement(stack, binary, "dynamodb:PutItem").pop("Condition")
    assert any("PutItem" in p for p in check_participants_cannot_decide(stack))


def test_decision_check_catches_a_put_under_another_services_one_phase_ids(stack):
    statement = _participant_records_statement(stack, "participant", "dynamodb:PutItem")
    statement["Condition"] = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["1p~*"]}}
    assert any("PutItem" in p for p in check_participants_cannot_decide(stack))


def test_decision_check_catches_a_delete_of_records(stack):
    _participant_records_statement(stack, "participant", "dynamodb:GetItem")["Action"] = ["dynamodb:GetItem", "dynamodb:DeleteItem"]
    assert any("DeleteItem" in p for p in check_participants_cannot_decide(stack))


def test_permissions_cover_every_table(stack):
    assert check_permissions_complete(stack) == []


def test_grants_match_the_code(stack):
    assert check_grants_match_code(stack) == []


def test_grants_check_catches_a_dynamodb_grant_on_no_table_of_the_template(stack):
    statement = b.statement(stack, "coordinator", "dynamodb:PutItem")
    statement["Resource"].append("arn:aws:dynamodb:us-east-1:123456789012:table/elsewhere")
    assert check_grants_match_code(stack) != []


def _star_grants(stack) -> set[tuple[str, str]]:
    """(function's binary, action) of every grant on Resource "*"."""
    out = set()
    for function in functions(stack):
        for statement in allow_statements(stack, role_of(stack, function)):
            if "*" in statement["Resource"]:
                out |= {(binary_of(stack, function), str(a)) for a in statement["Action"]}
    return out


# ListStreams for the stream readers' event source mappings: the stream processor's (every table's
# stream) and the outcomes function's (the transactions table's). Lambda's DynamoDB event source
# mapping needs dynamodb:ListStreams in the function's role beside the stream reads (Lambda's
# documented execution-role permissions for DynamoDB streams), and IAM has no resource type for it:
# it can only be granted on "*", and only lists stream ARNs.
LIST_STREAMS = {("stream-processor", "dynamodb:ListStreams"), ("outcomes", "dynamodb:ListStreams")}


def test_the_only_star_resources_are_list_streams_and_tracing(stack):
    # With JSON Web Tokens on, so that every binary is deployed (the authorizer too).
    stack = with_jwt(stack)
    # Without tracing: ListStreams, for the stream readers' event sources, and nothing else.
    assert _star_grants(stack.with_parameters(TracingMode="PassThrough")) == LIST_STREAMS
    # With tracing: X-Ray's two actions for every function as well.
    traced = _star_grants(stack.with_parameters(TracingMode="Active"))
    binaries = set(stack.code["functionEnvironment"])
    xray = {(binary, action) for binary in binaries for action in ["xray:PutTraceSegments", "xray:PutTelemetryRecords"]}
    assert traced == xray | LIST_STREAMS


# --- the checks can fail: broken copies of each template ----------------------------------------


def _break_iam(stack, breakage: str) -> None:
    if breakage == "action-wildcard":
        b.statement(stack, "coordinator", "dynamodb:GetItem")["Action"] = ["dynamodb:*"]
    elif breakage == "action-prefix":
        b.statement(stack, "coordinator", "dynamodb:GetItem")["Action"] = ["dynamodb:Get*"]
    elif breakage == "star-resource":
        # a "*" resource for an action that can be scoped
        b.statement(stack, "stream-processor", "firehose:PutRecordBatch")["Resource"] = "*"
    elif breakage == "every-index":
        # every index of the table instead of the one used
        connections = b.table(stack, "connections")
        b.statement(stack, "stream-processor", "dynamodb:Query", where="/index/by-topic")["Resource"] = [
            b.join(b.getatt(connections, "Arn"), "/index/*")
        ]
    elif breakage == "every-route":
        # every route of the WebSocket API instead of @connections
        api = b.only(stack, "AWS::ApiGatewayV2::Api")
        b.statement(stack, "stream-processor", "execute-api:ManageConnections")["Resource"] = [
            {"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${%s}/prod/*" % api}
        ]
    elif breakage == "managed-policy":
        role = role_of(stack, b.function(stack, "stream-processor"))
        b.props(stack, role)["ManagedPolicyArns"] = [
            "arn:aws:iam::aws:policy/service-role/AWSLambdaDynamoDBExecutionRole"
        ]
    elif breakage == "shared-role":
        first, second = b.participant(stack, 0), b.participant(stack, 1)
        b.props(stack, second["function"])["Role"] = b.getatt(role_of(stack, first["function"]), "Arn")
    elif breakage == "star-beside-tracing":
        # The X-Ray actions may take "*"; another action beside them in the same statement may not.
        role = role_of(stack, b.function(stack, "connections"))
        b.raw_statements(stack, role)[0].append(
            {"Effect": "Allow", "Action": ["xray:PutTraceSegments", "xray:GetTraceSummaries"], "Resource": "*"}
        )
    # The shapes accepted only for a service: in a function's role, or in a role another may assume.
    elif breakage == "log-groups-in-function-role":
        role = role_of(stack, b.function(stack, "coordinator"))
        b.raw_statements(stack, role)[0].append({
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": {"Fn::Sub": "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:*"},
        })
    elif breakage in ("s3-access-prefix-in-function-role", "cloudtrail-prefix-in-function-role"):
        prefix = "s3-access/" if breakage.startswith("s3-access") else "cloudtrail/AWSLogs/${AWS::AccountId}/"
        role = role_of(stack, b.function(stack, "stream-processor"))
        b.raw_statements(stack, role)[0].append({
            "Effect": "Allow",
            "Action": ["s3:PutObject"],
            "Resource": {"Fn::Sub": "${%s.Arn}/%s*" % (b.only(stack, "AWS::S3::Bucket"), prefix)},
        })
    elif breakage == "log-groups-role-assumed-by-lambda":
        # API Gateway's role, which Lambda may assume too.
        role = next(
            r for r in stack.resources("AWS::IAM::Role")
            if "apigateway.amazonaws.com" in str(stack.props(r).get("AssumeRolePolicyDocument"))
        )
        b.props(stack, role)["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Service"] = [
            "apigateway.amazonaws.com",
            "lambda.amazonaws.com",
        ]


@pytest.mark.parametrize(
    "breakage",
    [
        "action-wildcard",
        "action-prefix",
        "star-resource",
        "every-index",
        "every-route",
        "managed-policy",
        "shared-role",
        "star-beside-tracing",
        "log-groups-in-function-role",
        "s3-access-prefix-in-function-role",
        "cloudtrail-prefix-in-function-role",
        "log-groups-role-assumed-by-lambda",
    ],
)
def test_iam_check_catches(breakage, stack):
    _break_iam(stack, breakage)
    assert check_iam(stack) != []


def test_invoke_check_catches_an_unregistered_target(stack):
    statement = b.statement(stack, "coordinator", "lambda:InvokeFunction")
    statement["Resource"].append(b.getatt(b.function(stack, "sweeper"), "Arn"))
    assert check_invoke_only_registered(stack) != []


def test_invoke_check_catches_the_function_instead_of_its_alias(stack):
    # Invoking the unqualified function would reach $LATEST, not the alias the registry names.
    statement = b.statement(stack, "coordinator", "lambda:InvokeFunction")
    statement["Resource"] = [b.getatt(b.participant(stack, i)["function"], "Arn") for i in range(2)]
    assert check_invoke_only_registered(stack) != []


def test_invoke_check_catches_a_registered_participant_it_cannot_invoke(stack):
    b.statement(stack, "sweeper", "lambda:InvokeFunction")["Resource"].pop()
    assert check_invoke_only_registered(stack) != []


@pytest.mark.parametrize(
    "binary,action", [("participant", "dynamodb:BatchGetItem"), ("inventory", "dynamodb:BatchGetItem"), ("payments", "dynamodb:PutItem")]
)
def test_isolation_check_catches_a_participant_reaching_another_table(stack, binary, action):
    # The generic participant, a service's own (the inventory) or a resource participant (the
    # payments), reaching another service's table.
    statement = b.statement(stack, binary, action)
    other = b.other_participant(stack, b.function(stack, binary))
    statement["Resource"].append(b.getatt(b.table(stack, other["table"]), "Arn"))
    assert check_participant_isolation(stack) != []


@pytest.mark.parametrize(
    "binary,action,where",
    [
        ("sweeper", "dynamodb:Query", "locks-by-expiry"),
        ("stream-processor", "dynamodb:GetRecords", None),
        ("outcomes", "dynamodb:GetRecords", None),
    ],
)
def test_completeness_check_catches_a_missing_grant(stack, binary, action, where):
    b.statement(stack, binary, action, where=where)["Resource"].pop()
    assert check_permissions_complete(stack) != []


def test_grant_check_catches_a_send_the_code_makes_that_no_role_may(stack):
    # The stream processor sends what it gives up on to its dead-letter queue (SqsDeadLetters::put). The
    # outcomes function's role may send to its own on-failure queue too (Lambda's on-failure records of
    # its mapping), so every role loses the grant here; the stream processor's own grant on its queue
    # is held by check_dead_letter_replay.
    for function in functions(stack):
        for statements in b.raw_statements(stack, role_of(stack, function)):
            statements[:] = [s for s in statements if not (isinstance(s, dict) and "sqs:SendMessage" in as_list(s.get("Action")))]
    assert "the code calls sqs:SendMessage, no role may" in check_grants_match_code(stack)


def test_grant_check_catches_a_key_read_the_code_makes_that_no_role_may(stack):
    # The coordinator, the sweeper and the participants read the message keys (auth::SecretsManagerKeys).
    for function in functions(stack):
        for statements in b.raw_statements(stack, role_of(stack, function)):
            statements[:] = [
                s for s in statements if not (isinstance(s, dict) and "secretsmanager:GetSecretValue" in as_list(s.get("Action")))
            ]
    assert "the code calls secretsmanager:GetSecretValue, no role may" in check_grants_match_code(stack)


def test_grant_check_catches_a_key_grant_the_code_no_longer_uses(tmp_path, stack):
    # The code stops reading keys from Secrets Manager: the GetSecretValue grants are left over.
    functions_dir = tmp_path / "functions"
    shutil.copytree(REPO / "functions", functions_dir, ignore=shutil.ignore_patterns("target", "*.zip"))
    auth = functions_dir / "twopc" / "src" / "auth.rs"
    auth.write_text(auth.read_text().replace(".get_secret_value()", ".secret_value_of()"))
    assert "secretsmanager:GetSecretValue is granted, the code never calls it" in check_grants_match_code(stack, functions_dir)


def test_grant_check_catches_a_grant_the_code_never_uses(stack):
    statement = b.statement(stack, "participant", "dynamodb:BatchGetItem")
    statement["Action"] = [*as_list(statement["Action"]), "dynamodb:PutItem"]
    assert check_grants_match_code(stack) != []


@pytest.mark.parametrize("binary", ["participant", "inventory"])
def test_grant_check_catches_the_barriers_put_on_an_item_participants_table(stack, binary):
    # PutItem is the barrier's (a resource participant's entries): an item participant never puts.
    statement = b.statement(stack, binary, "dynamodb:BatchGetItem")
    statement["Action"] = [*as_list(statement["Action"]), "dynamodb:PutItem"]
    problems = check_grants_match_code(stack)
    assert any("dynamodb:PutItem is granted on the item participant table" in p for p in problems), problems


def test_grant_check_catches_a_barrier_call_no_role_may(stack):
    # The payments' role loses PutItem: no first barrier entry, no try, every charge refused.
    statement = b.statement(stack, "payments", "dynamodb:PutItem")
    statement["Action"] = [a for a in as_list(statement["Action"]) if a != "dynamodb:PutItem"]
    problems = check_grants_match_code(stack)
    assert any("the barrier calls dynamodb:PutItem" in p for p in problems), problems


def test_grant_check_reads_the_barrier_as_a_resource_participants_store(tmp_path, stack):
    # The barrier starts deleting its entries: no role may (and on no item participant's table).
    functions_dir = tmp_path / "functions"
    shutil.copytree(REPO / "functions", functions_dir, ignore=shutil.ignore_patterns("target", "*.zip"))
    with open(functions_dir / "twopc" / "src" / "participant" / "barrier.rs", "a") as source:
        source.write("\n// added by the test\nfn _probe() { client.delete_item(); }\n")
    problems = check_grants_match_code(stack, functions_dir)
    assert any("the barrier calls dynamodb:DeleteItem" in p for p in problems), problems


@pytest.mark.parametrize(
    "path,call",
    [
        # a participant starts writing its table with BatchWriteItem: no role may
        ("twopc/src/participant/store.rs", "client.batch_write_item()"),
        # the transactions store starts deleting records: no role may
        ("twopc/src/record/store.rs", "client.delete_item()"),
        # a function starts calling DynamoDB outside the known table stores
        ("twopc/src/sweeper.rs", "client.scan()"),
        # the stream processor starts closing connections through the management API: allowed
        # (ManageConnections is granted), so this one must NOT be reported
        ("fanout/src/realtime.rs", "client.delete_connection()"),
    ],
)
def test_grant_check_reads_the_source(tmp_path, stack, path, call):
    functions_dir = tmp_path / "functions"
    shutil.copytree(REPO / "functions", functions_dir, ignore=shutil.ignore_patterns("target", "*.zip"))
    with open(functions_dir / path, "a") as source:
        source.write(f"\n// added by the test\nfn _probe() {{ {call}; }}\n")
    problems = check_grants_match_code(stack, functions_dir)
    if "delete_connection" in call:
        assert problems == []
    else:
        assert problems != []
