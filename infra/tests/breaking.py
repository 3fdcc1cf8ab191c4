"""Helpers for the tests that break a deployed template (SAM or CDK) on purpose: they find the raw,
unresolved piece of the template to change by meaning, as the checks do, so the same breakage is
made in either template."""

from __future__ import annotations

import json
from typing import Any

from cfn import Stack, as_list, att_id, ref_id
from system import function_target, functions_of, participant_deployments, role_of, table_ids
from template_checks import with_jwt


def resource(stack: Stack, logical_id: str) -> dict:
    return stack.template["Resources"][logical_id]


def props(stack: Stack, logical_id: str) -> dict:
    return resource(stack, logical_id).setdefault("Properties", {})


def function(stack: Stack, binary: str, index: int = 0) -> str:
    return functions_of(stack, binary)[index]


def variables(stack: Stack, binary: str, index: int = 0) -> dict:
    return props(stack, function(stack, binary, index))["Environment"]["Variables"]


def table(stack: Stack, name: str) -> str:
    return table_ids(stack)[name]


def participant(stack: Stack, index: int) -> dict:
    """The index-th participant deployment (by service name), whichever binary it runs."""
    return [d for _, d in sorted(participant_deployments(stack).items())][index]


def deployment_of(stack: Stack, service: str) -> dict:
    """The participant deployment of a service."""
    return participant_deployments(stack)[service]


def other_participant(stack: Stack, function_id: str) -> dict:
    """The first participant deployment (by service name) that is not the function's own: what a
    breakage lets a participant reach beyond its own."""
    return next(d for _, d in sorted(participant_deployments(stack).items()) if d["function"] != function_id)


def raw_statements(stack: Stack, role: str) -> list[list]:
    """The raw statement lists of the role: its inline policies and the policies attached to it."""
    lists = []
    for policy in as_list(props(stack, role).get("Policies")):
        lists.append(policy["PolicyDocument"]["Statement"])
    for name, candidate in stack.template["Resources"].items():
        if candidate.get("Type") in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            if {"Ref": role} in as_list(candidate["Properties"].get("Roles")):
                document = candidate["Properties"]["PolicyDocument"]
                document["Statement"] = as_list(document["Statement"])
                lists.append(document["Statement"])
    return lists


def statement(stack: Stack, binary: str, action: str, index: int = 0, where: Any = None) -> dict:
    """The first raw Allow statement granting `action` in the role of a function of `binary`
    (and, with `where`, whose resolved resources contain that text)."""
    role = role_of(stack, function(stack, binary, index))
    for statements in raw_statements(stack, role):
        for candidate in statements:
            if not isinstance(candidate, dict) or candidate.get("Effect") != "Allow":
                continue
            actions = [str(a).lower() for a in as_list(candidate.get("Action"))]
            resolved = json.dumps(stack.resolve(candidate.get("Resource")))
            if action.lower() in actions and (where is None or where in resolved):
                candidate["Resource"] = as_list(candidate.get("Resource"))
                return candidate
    raise AssertionError(f"no statement granting {action} to {binary}")


def mapping_of(stack: Stack, table_name: str, binary: str = "stream-processor") -> str:
    """The event source mapping of a table's stream into the function of `binary` (the transactions
    table's stream has two: the stream processor's and the outcomes function's)."""
    table_id = table(stack, table_name)
    targets = set(functions_of(stack, binary))
    for name in sorted(stack.resources("AWS::Lambda::EventSourceMapping")):
        props_ = stack.props(name)
        if att_id(props_.get("EventSourceArn"), "StreamArn") == table_id and function_target(stack, props_.get("FunctionName")) in targets:
            return name
    raise AssertionError(f"no mapping of {table_name} into {binary}")


def stream_failure_queue(stack: Stack) -> str:
    """The on-failure queue of the stream processor's mappings (its DEAD_LETTER_QUEUE_URL; the outcomes
    function's mapping has a queue of its own)."""
    destination = stack.props(mapping_of(stack, "transactions"))["DestinationConfig"]["OnFailure"]["Destination"]
    queue = att_id(destination, "Arn")
    assert queue, f"no on-failure queue of the stream processor: {destination!r}"
    return queue


def replace_in_strings(value: Any, old: str, new: str) -> Any:
    """Every string inside `value` with `old` replaced (for Sub texts and Join parts alike)."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [replace_in_strings(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: replace_in_strings(v, old, new) for k, v in value.items()}
    return value


def only(stack: Stack, kind: str) -> str:
    found = sorted(stack.resources(kind))
    assert found, f"no {kind}"
    return found[0]


def alarm_on(stack: Stack, metric: str, text: str = "") -> str:
    """An alarm whose (resolved) properties name `metric` (and `text`)."""
    for name in stack.resources("AWS::CloudWatch::Alarm"):
        resolved = json.dumps(stack.props(name))
        if f'"{metric}"' in resolved and text in resolved:
            return name
    raise AssertionError(f"no alarm on {metric} {text}")


def ref(logical_id: str) -> dict:
    return {"Ref": logical_id}


def getatt(logical_id: str, attribute: str) -> dict:
    return {"Fn::GetAtt": [logical_id, attribute]}


def join(*parts: Any) -> dict:
    return {"Fn::Join": ["", list(parts)]}


def stage_of_rest_api(stack: Stack) -> str:
    return only(stack, "AWS::ApiGateway::Stage")


def set_rest_authorization(stack: Stack, authorization: str) -> None:
    """Every REST method's authorization: Method resources (CDK) or the OpenAPI body (SAM)."""
    for name in stack.resources("AWS::ApiGateway::Method"):
        props(stack, name)["AuthorizationType"] = authorization
    for name in stack.resources("AWS::ApiGateway::RestApi"):
        body = props(stack, name).get("Body") or {}
        for operations in body.get("paths", {}).values():
            for operation in operations.values():
                operation["security"] = [] if authorization == "NONE" else operation.get("security")



# --- one REST method, in either form (a Method resource of CDK, an operation of SAM's OpenAPI body),
# named by its verb and the last part of its path ("commit": POST /transactions/{id}/commit) ----------


def _path_part(stack: Stack, method: str) -> str | None:
    resource_id = ref_id(stack.props(method).get("ResourceId"))
    if resource_id in stack.template["Resources"]:
        return props(stack, resource_id).get("PathPart")
    return None


def rest_method_parts(stack: Stack, verb: str, last_part: str) -> list[tuple[dict, str]]:
    """(the raw Method properties or OpenAPI operation, "method" or "body") of each REST method of
    `verb` on a path ending in `last_part`."""
    out: list[tuple[dict, str]] = []
    for name in _method_resources(stack, verb.upper()):
        if _path_part(stack, name) == last_part:
            out.append((props(stack, name), "method"))
    for operations, path in _body_operations(stack, verb):
        if path.rsplit("/", 1)[-1] == last_part:
            out.append((operations[verb.lower()], "body"))
    assert out, f"no REST {verb} on a path ending in {last_part}"
    return out


def remove_rest_method(stack: Stack, verb: str, last_part: str) -> None:
    """Removes the REST method (its Method resource, or its operation of the OpenAPI body)."""
    for name in _method_resources(stack, verb.upper()):
        if _path_part(stack, name) == last_part:
            del stack.template["Resources"][name]
    for operations, path in _body_operations(stack, verb):
        if path.rsplit("/", 1)[-1] == last_part:
            del operations[verb.lower()]


def set_rest_method_authorization(stack: Stack, verb: str, last_part: str, authorization: str) -> None:
    """One REST method's authorization: NONE, AWS_IAM, or CUSTOM (an authorizer of its own)."""
    for part, form in rest_method_parts(stack, verb, last_part):
        if form == "method":
            part["AuthorizationType"] = authorization
            if authorization == "CUSTOM":
                part["AuthorizerId"] = ref("OtherAuthorizer")
        else:
            part["security"] = {"NONE": [], "AWS_IAM": [{"AWS_IAM": []}], "CUSTOM": [{"OtherAuthorizer": []}]}[authorization]


def set_rest_method_target(stack: Stack, verb: str, last_part: str, old: str, new: str) -> None:
    """Points one REST method's integration elsewhere (`old` replaced by `new` in its integration)."""
    for part, form in rest_method_parts(stack, verb, last_part):
        key = "Integration" if form == "method" else "x-amazon-apigateway-integration"
        part[key] = replace_in_strings(part[key], old, new)


def remove_rest_invoke_permissions(stack: Stack, verb: str, last_part: str) -> None:
    """Removes the Lambda permissions that let API Gateway invoke a function for that REST method."""
    for name in sorted(stack.resources("AWS::Lambda::Permission")):
        resolved = stack.props(name)
        source = str(resolved.get("SourceArn"))
        if (
            resolved.get("Principal") == "apigateway.amazonaws.com"
            and f"/{verb.upper()}/" in source
            and source.rsplit("/", 1)[-1] == last_part
        ):
            del stack.template["Resources"][name]


# --- the REST API's preflight and gateway responses, in either form (Method and GatewayResponse
# resources of CDK, the OpenAPI body of SAM) ------------------------------------------------------


def _body_operations(stack: Stack, verb: str) -> list[tuple[dict, str]]:
    """(the path's operations, path) of the OpenAPI bodies' paths that have `verb`."""
    out = []
    for name in stack.resources("AWS::ApiGateway::RestApi"):
        body = props(stack, name).get("Body") or {}
        for path, operations in body.get("paths", {}).items():
            if verb.lower() in operations:
                out.append((operations, path))
    return out


def _method_resources(stack: Stack, verb: str) -> list[str]:
    return [
        name for name in stack.resources("AWS::ApiGateway::Method") if str(props(stack, name).get("HttpMethod")).upper() == verb
    ]


def remove_preflight(stack: Stack, path_part: str | None = None) -> None:
    """Removes the OPTIONS methods (only those of paths ending in `path_part`, when given)."""
    for name in _method_resources(stack, "OPTIONS"):
        resource_id = props(stack, name).get("ResourceId", {}).get("Ref", "")
        part = props(stack, resource_id).get("PathPart") if resource_id in stack.template["Resources"] else None
        if path_part is None or part == path_part:
            del stack.template["Resources"][name]
    for operations, path in _body_operations(stack, "OPTIONS"):
        if path_part is None or path.endswith("/" + path_part):
            del operations["options"]


def set_preflight_authorization(stack: Stack, authorization: str) -> None:
    for name in _method_resources(stack, "OPTIONS"):
        props(stack, name)["AuthorizationType"] = authorization
    for operations, _ in _body_operations(stack, "OPTIONS"):
        operations["options"]["security"] = [] if authorization == "NONE" else [{"AWS_IAM": []}]


def preflight_response_parameters(stack: Stack) -> list[dict]:
    """The raw response parameters of every preflight's integration responses."""
    out = []
    for name in _method_resources(stack, "OPTIONS"):
        for response in props(stack, name).get("Integration", {}).get("IntegrationResponses", []):
            out.append(response.setdefault("ResponseParameters", {}))
    for operations, _ in _body_operations(stack, "OPTIONS"):
        for response in operations["options"].get("x-amazon-apigateway-integration", {}).get("responses", {}).values():
            out.append(response.setdefault("responseParameters", {}))
    return out


def set_preflight_header(stack: Stack, header: str, value: Any) -> None:
    """Sets (None: removes) a header of every preflight's answer."""
    for parameters in preflight_response_parameters(stack):
        parameters.pop(f"method.response.header.{header}", None)
        if value is not None:
            parameters[f"method.response.header.{header}"] = value


def set_preflight_template(stack: Stack, template: str) -> None:
    """Gives every preflight's answer this application/json mapping template."""
    for name in _method_resources(stack, "OPTIONS"):
        for response in props(stack, name).get("Integration", {}).get("IntegrationResponses", []):
            response["ResponseTemplates"] = {"application/json": template}
    for operations, _ in _body_operations(stack, "OPTIONS"):
        for response in operations["options"].get("x-amazon-apigateway-integration", {}).get("responses", {}).values():
            response["responseTemplates"] = {"application/json": template}


def gateway_response_parameters(stack: Stack, kind: str) -> list[dict]:
    """The raw response parameters of the REST API's gateway responses of type `kind`."""
    out = []
    for name in stack.resources("AWS::ApiGateway::GatewayResponse"):
        if props(stack, name).get("ResponseType") == kind:
            out.append(props(stack, name).setdefault("ResponseParameters", {}))
    for api in stack.resources("AWS::ApiGateway::RestApi"):
        responses = (props(stack, api).get("Body") or {}).get("x-amazon-apigateway-gateway-responses", {})
        if kind in responses:
            out.append(responses[kind].setdefault("responseParameters", {}))
    assert out, f"no gateway response {kind}"
    return out


def remove_gateway_response(stack: Stack, kind: str) -> None:
    for name in stack.resources("AWS::ApiGateway::GatewayResponse"):
        if props(stack, name).get("ResponseType") == kind:
            del stack.template["Resources"][name]
    for api in stack.resources("AWS::ApiGateway::RestApi"):
        (props(stack, api).get("Body") or {}).get("x-amazon-apigateway-gateway-responses", {}).pop(kind, None)


# --- the WebSocket API's routes and route responses ----------------------------------------------


def websocket_route(stack: Stack, key: str) -> str:
    """The logical id of the WebSocket route with this RouteKey."""
    for name in stack.resources("AWS::ApiGatewayV2::Route"):
        if props(stack, name).get("RouteKey") == key:
            return name
    raise AssertionError(f"no WebSocket route {key}")


def route_responses_of(stack: Stack, route: str) -> list[str]:
    """The route responses whose RouteId is (a Ref of) the route."""
    return [
        name
        for name in stack.resources("AWS::ApiGatewayV2::RouteResponse")
        if props(stack, name).get("RouteId") == {"Ref": route}
    ]


# --- the participants' message keys and resource policies -----------------------------------------


def key_secret(stack: Stack, index: int) -> str:
    """The logical id of the index-th participant's key secret (what its PARTICIPANT_KEY names)."""
    return key_secret_of(stack, participant(stack, index)["function"])


def key_secret_of(stack: Stack, function_id: str) -> str:
    """The logical id of a participant function's key secret (what its PARTICIPANT_KEY names)."""
    value = stack.resolve(variables_of(stack, function_id).get("PARTICIPANT_KEY"))
    secret = ref_id(value)
    assert secret and stack.kind(secret) == "AWS::SecretsManager::Secret", f"no key secret: {value!r}"
    return secret


def variables_of(stack: Stack, function_id: str) -> dict:
    """The raw environment variables of a function (by logical id)."""
    return props(stack, function_id)["Environment"]["Variables"]


def role_arn(stack: Stack, binary: str) -> dict:
    """`Fn::GetAtt <role>.Arn` of the role of the (first) function of `binary`."""
    return getatt(role_of(stack, function(stack, binary)), "Arn")


def participant_permissions(stack: Stack, index: int, caller: str | None = None) -> list[str]:
    """The AWS::Lambda::Permission resources on the index-th participant (function, alias or version),
    only those naming the role of `caller` (a binary) when given."""
    target = participant(stack, index)["function"]
    wanted = stack.resolve(role_arn(stack, caller)) if caller else None
    out = []
    for name in sorted(stack.resources("AWS::Lambda::Permission")):
        resolved = stack.props(name)
        if function_target(stack, resolved.get("FunctionName")) == target and (
            wanted is None or resolved.get("Principal") == wanted
        ):
            out.append(name)
    assert out, f"no permission on participant {index} ({caller})"
    return out


# --- the authorizer (JwtIssuer set): its resources whatever their condition, the REST API's Lambda
# authorizer in either form (an AWS::ApiGateway::Authorizer of CDK, a security definition of SAM's
# OpenAPI body) ------------------------------------------------------------------------------------

# A REST Lambda authorizer's settings: (the resource's key, the OpenAPI body's key).
REST_AUTHORIZER_KEYS = {
    "type": ("Type", "type"),
    "identitySource": ("IdentitySource", "identitySource"),
    "ttl": ("AuthorizerResultTtlInSeconds", "authorizerResultTtlInSeconds"),
    "uri": ("AuthorizerUri", "authorizerUri"),
}


def of_type(stack: Stack, kind: str) -> list[str]:
    """Every resource of a type, whatever its condition (sorted logical ids)."""
    return sorted(name for name, r in stack.template["Resources"].items() if r.get("Type") == kind)


def _branch(value: Any) -> Any:
    """The value of a `Fn::If` when its condition holds (the value itself when it is no `Fn::If`)."""
    if isinstance(value, dict) and list(value) == ["Fn::If"]:
        return value["Fn::If"][1]
    return value


def set_rest_authorizer(stack: Stack, key: str, value: Any) -> None:
    """Sets one setting (type, identitySource, ttl, uri) of every REST Lambda authorizer; None removes it.
    The body's type is lower case (as API Gateway's extension writes it)."""
    resource_key, body_key = REST_AUTHORIZER_KEYS[key]
    found = False
    for name in of_type(stack, "AWS::ApiGateway::Authorizer"):
        props(stack, name).pop(resource_key, None)
        if value is not None:
            props(stack, name)[resource_key] = value
        found = True
    for name in of_type(stack, "AWS::ApiGateway::RestApi"):
        definitions = (props(stack, name).get("Body") or {}).get("securityDefinitions", {})
        for definition in definitions.values():
            settings = _branch(definition).get("x-amazon-apigateway-authorizer") if isinstance(_branch(definition), dict) else None
            if isinstance(settings, dict):
                settings.pop(body_key, None)
                if value is not None:
                    settings[body_key] = value.lower() if key == "type" and isinstance(value, str) else value
                found = True
    assert found, "no REST Lambda authorizer"


def authorizer_function(stack: Stack) -> str:
    """The logical id of the function whose binary is the authorizer (evaluated with tokens on)."""
    return function(with_jwt(stack), "authorizer")
