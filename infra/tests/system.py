"""The system a deployed template describes, found by meaning rather than by logical id: which
function runs which binary, each function's role and what that role is allowed, the participant
deployments and their `live` aliases, the tables by name.

A function's binary is told by its environment: every binary of the code reads a set of variables
(`twopc::environment::FUNCTION_ENVIRONMENT`, printed by the contract example), and every deployment of it
must set exactly those. A function whose variables match no binary exactly is given the nearest one
(so that the other checks still find it) and check_environment reports it. Binaries built on the same
library may read the same variables (the generic participant and a service's own participant, such
as the example inventory): among those, the binary the function's code is built from tells (SAM:
its build metadata, `BuildProperties.Binary`; CDK: the metadata entry `twopc:binary`, which
test_cdk_code.py holds to the staged code).

The participant functions are those of every binary built on the participant library (it reads
SERVICE_NAME and DATA_TABLE_NAME: the service it serves and the table it owns), whichever binary that
is: each is one participant deployment. Among them, a resource participant's binary (the example
payments) drives a resource beyond DynamoDB through the library (its `main.rs` calls `with_resource`):
its table holds the library's barrier entries, not items.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from cfn import REPO, Stack, as_list, att_id, placeholder, ref_id

ALIAS_NAME = "live"
# The generic participant (functions/participant: the built-in operations only).
PARTICIPANT_BINARY = "participant"
# What the participant library reads, and so every binary built on it: the service and its table.
PARTICIPANT_VARIABLES = {"SERVICE_NAME", "DATA_TABLE_NAME"}
# The CDK app's metadata entry naming a function's binary (infra/cdk/lib/code.ts, BINARY_METADATA).
CDK_BINARY_METADATA = "twopc:binary"
# What a resource participant's main calls: the participant library driving a resource
# (twopc::participant::Participant::with_resource).
RESOURCE_CALL = ".with_resource("
FUNCTIONS_DIR = REPO / "functions"


# ----------------------------------------------------------------------------------------------
# Functions
# ----------------------------------------------------------------------------------------------


def functions(stack: Stack) -> list[str]:
    return sorted(stack.resources("AWS::Lambda::Function"))


def environment(stack: Stack, function: str) -> dict[str, Any]:
    variables = stack.props(function).get("Environment", {}).get("Variables", {})
    return variables if isinstance(variables, dict) else {}


def _distance(variables: set[str], wanted: set[str]) -> int:
    return len(variables ^ wanted)


def declared_binary(stack: Stack, function: str) -> str | None:
    """The binary the function's code is built from, as the template declares it: SAM's build
    metadata (`BuildProperties.Binary`, kept through the transform) or the CDK app's `twopc:binary`."""
    metadata = stack.template.get("Resources", {}).get(function, {}).get("Metadata") or {}
    declared = metadata.get(CDK_BINARY_METADATA) or (metadata.get("BuildProperties") or {}).get("Binary")
    return str(declared) if declared else None


def binary_candidates(stack: Stack, function: str) -> list[str]:
    """The binaries whose variables the function sets exactly; else the nearest ones (several when
    binaries read the same variables, or tie in distance)."""
    variables = set(environment(stack, function))
    wanted = {binary: set(names) for binary, names in stack.code["functionEnvironment"].items()}
    exact = [binary for binary, names in wanted.items() if names == variables]
    if exact or not wanted:
        return exact
    nearest = min(_distance(variables, names) for names in wanted.values())
    return [binary for binary, names in wanted.items() if _distance(variables, names) == nearest]


def binary_of(stack: Stack, function: str) -> str | None:
    """The binary whose variables the function sets exactly; else the single nearest one. Among
    binaries that read the same variables, the one the function declares it is built from; without
    such a declaration, the first exact one (check_environment reports the function)."""
    candidates = binary_candidates(stack, function)
    if len(candidates) == 1:
        return candidates[0]
    declared = declared_binary(stack, function)
    if declared in candidates:
        return declared
    variables = set(environment(stack, function))
    exact = [b for b in candidates if set(stack.code["functionEnvironment"][b]) == variables]
    return exact[0] if exact else None


def functions_by_binary(stack: Stack) -> dict[str, list[str]]:
    by_binary: dict[str, list[str]] = {}
    for function in functions(stack):
        by_binary.setdefault(binary_of(stack, function) or "?", []).append(function)
    return by_binary


def functions_of(stack: Stack, binary: str) -> list[str]:
    return functions_by_binary(stack).get(binary, [])


def function_target(stack: Stack, text: Any) -> str | None:
    """The function a resolved reference names: `${Fn}`, `${Fn.Arn}`, an alias or version of it."""
    target = placeholder(text)
    if target is None:
        return None
    logical_id, attribute = target
    kind = stack.kind(logical_id)
    if kind == "AWS::Lambda::Function" and attribute in (None, "Arn"):
        return logical_id
    if kind in ("AWS::Lambda::Alias", "AWS::Lambda::Version") and attribute is None:
        return ref_id(stack.props(logical_id).get("FunctionName")) or att_id(
            stack.props(logical_id).get("FunctionName"), "Arn"
        )
    return None


# ----------------------------------------------------------------------------------------------
# Roles and what they allow
# ----------------------------------------------------------------------------------------------


def role_of(stack: Stack, function: str) -> str | None:
    role = att_id(stack.props(function).get("Role"), "Arn")
    return role if role and stack.kind(role) == "AWS::IAM::Role" else None


def _attached_policies(stack: Stack, role: str) -> list[tuple[str, dict]]:
    """(where, document) of the policy resources attached to the role (CDK writes a role's
    statements into an AWS::IAM::Policy of their own)."""
    out = []
    for kind in ["AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"]:
        for name in stack.resources(kind):
            props = stack.props(name)
            if "${%s}" % role in as_list(props.get("Roles")):
                out.append((name, props.get("PolicyDocument", {})))
    return out


def role_documents(stack: Stack, role: str) -> list[tuple[str, dict]]:
    inline = [
        (f"{role}/{policy.get('PolicyName')}", policy.get("PolicyDocument", {}))
        for policy in as_list(stack.props(role).get("Policies"))
    ]
    return inline + _attached_policies(stack, role)


def normalized_statement(statement: dict) -> dict:
    """Action and Resource as lists of strings."""
    return {
        **statement,
        "Action": [a for a in as_list(statement.get("Action")) if a is not None],
        "Resource": [r for r in as_list(statement.get("Resource")) if r is not None],
    }


def allow_statements(stack: Stack, role: str | None) -> list[dict]:
    if role is None:
        return []
    out = []
    for _, document in role_documents(stack, role):
        for statement in as_list(document.get("Statement")):
            if isinstance(statement, dict) and statement.get("Effect") == "Allow":
                out.append(normalized_statement(statement))
    return out


def granted(stack: Stack, role: str | None, action: str) -> list[str]:
    """Resources on which the role is allowed `action`."""
    out: list[str] = []
    for statement in allow_statements(stack, role):
        if action.lower() in [str(a).lower() for a in statement["Action"]]:
            out.extend(str(r) for r in statement["Resource"])
    return out


def policy_documents(stack: Stack) -> list[tuple[str, dict]]:
    """(where, document) of every IAM and resource policy of the template."""
    documents = []
    for role in stack.resources("AWS::IAM::Role"):
        for policy in as_list(stack.props(role).get("Policies")):
            documents.append((f"{role}/{policy.get('PolicyName')}", policy.get("PolicyDocument", {})))
    for kind in [
        "AWS::IAM::Policy",
        "AWS::IAM::ManagedPolicy",
        "AWS::IAM::RolePolicy",
        "AWS::S3::BucketPolicy",
        "AWS::SQS::QueuePolicy",
        "AWS::SNS::TopicPolicy",
    ]:
        for name in stack.resources(kind):
            documents.append((name, stack.props(name).get("PolicyDocument", {})))
    return documents


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------


def table_ids(stack: Stack) -> dict[str, str]:
    """Table name -> logical id."""
    return {stack.table_name(t): t for t in stack.resources("AWS::DynamoDB::Table")}


def table_of_arn(text: str) -> str | None:
    """The table a resolved table or index ARN (`${T.Arn}`, `${T.Arn}/index/...`) names."""
    if (table := att_id(text, "Arn")) is not None:
        return table
    match = re.match(r"^\$\{([A-Za-z0-9]+)\.Arn\}/index/", text)
    return match.group(1) if match else None


# ----------------------------------------------------------------------------------------------
# Participants, aliases, registries
# ----------------------------------------------------------------------------------------------


def aliases(stack: Stack, function: str) -> dict[str, str]:
    """Alias name -> logical id of the function's aliases."""
    out = {}
    for alias in stack.resources("AWS::Lambda::Alias"):
        if function_target(stack, stack.props(alias).get("FunctionName")) == function:
            out[str(stack.props(alias).get("Name"))] = alias
    return out


def participant_binaries(stack: Stack) -> list[str]:
    """The binaries built on the participant library (they read what it reads): the generic
    participant and every service's own participant (the example inventory)."""
    return [
        binary
        for binary, names in stack.code["functionEnvironment"].items()
        if PARTICIPANT_VARIABLES <= set(names)
    ]


@functools.lru_cache(maxsize=None)
def _drives_a_resource(binary: str, functions_dir: Path = FUNCTIONS_DIR) -> bool:
    main = functions_dir / binary / "src" / "main.rs"
    return main.is_file() and RESOURCE_CALL in main.read_text()


def resource_binaries(stack: Stack) -> list[str]:
    """The participant binaries that drive a resource beyond DynamoDB (their `main.rs` calls
    `with_resource`: the example payments): their tables hold the library's barrier entries."""
    return [binary for binary in participant_binaries(stack) if _drives_a_resource(binary)]


def participant_functions(stack: Stack) -> list[str]:
    """The functions of every participant binary."""
    by_binary = functions_by_binary(stack)
    return sorted(f for binary in participant_binaries(stack) for f in by_binary.get(binary, []))


def participant_deployments(stack: Stack) -> dict[str, dict]:
    """Service name -> {function, binary, resource, table, alias} of each participant deployment (a
    function of any participant binary; `resource`: its binary drives a resource)."""
    deployments = {}
    resources = set(resource_binaries(stack))
    for function in participant_functions(stack):
        env = environment(stack, function)
        binary = binary_of(stack, function)
        deployments[str(env.get("SERVICE_NAME"))] = {
            "function": function,
            "binary": binary,
            "resource": binary in resources,
            "table": str(env.get("DATA_TABLE_NAME")),
            "alias": aliases(stack, function).get(ALIAS_NAME),
        }
    return deployments


def alias_references(function: str, alias: str | None) -> set[str]:
    """How a registry may name a participant's `live` alias: the alias's ARN (`Ref` of the alias),
    `<function ARN>:live` or `<function name>:live` (Lambda Invoke accepts each)."""
    return alias_arns(function, alias) | {"${%s}:%s" % (function, ALIAS_NAME)}


def alias_arns(function: str, alias: str | None) -> set[str]:
    """How IAM may name the alias: its ARN, as `Ref` of the alias or `<function ARN>:live`."""
    return {"${%s.Arn}:%s" % (function, ALIAS_NAME)} | ({"${%s}" % alias} if alias else set())


def json_variable(stack: Stack, function: str, variable: str, problems: list[str]) -> dict | None:
    """A JSON-object-of-strings variable (a registry), parsed; problems when it is not one."""
    value = environment(stack, function).get(variable)
    if value is None:
        return None
    try:
        parsed = json.loads(str(value))
    except json.JSONDecodeError as error:
        problems.append(f"{function}: {variable} is not JSON ({error}): {value!r}")
        return None
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        problems.append(f"{function}: {variable} is not a JSON object of strings: {value!r}")
        return None
    return parsed


def log_group_of(stack: Stack, function: str) -> str | None:
    return ref_id(stack.props(function).get("LoggingConfig", {}).get("LogGroup"))
