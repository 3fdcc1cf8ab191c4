"""Checks of infra/template.yaml, written as functions that return a list of problems (empty: fine).

The tests run them on the real template and on deliberately broken copies, so every check is shown
to pass on the template and to fail when the property it guards is broken.

The template is read with cfn-lint's own YAML decoder (it understands !Ref, !Sub, !GetAtt) and, for
the checks that must see what CloudFormation will deploy, transformed with the SAM translator that
cfn-lint bundles (the same transform `cfn-lint` lints). Checking the transformed template matters
for IAM: SAM adds policies of its own (for example AWSLambdaDynamoDBExecutionRole, Resource "*",
to a generated role of a function with a DynamoDB stream event).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from cfnlint.decode import cfn_yaml
from cfnlint.template.transforms._sam import Transform

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "infra" / "template.yaml"

# Variables a function may have beyond what the code reads (functions/twopc/src/config.rs).
EXTRA_ENVIRONMENT = {"RUST_LOG"}

# The only actions that may be granted on Resource "*", each with the reason.
STAR_RESOURCE_ALLOWED = {
    # IAM defines no resource type for dynamodb:ListStreams (Service Authorization Reference, and
    # cfn-lint's copy of it): it can only be granted on "*". It lists stream ARNs and reads nothing.
    # Lambda's DynamoDB event source mapping needs it in the function's execution role.
    "dynamodb:liststreams": "IAM has no resource type for ListStreams; only stream ARNs are listed",
}

# A "*" inside a resource ARN is accepted only in these shapes (resource names stay fixed):
WILDCARD_RESOURCE_PATTERNS = [
    # Objects of one bucket of this template: `${Bucket.Arn}/*`.
    re.compile(r"^\$\{(?P<bucket>[A-Za-z0-9]+)\.Arn\}/\*$"),
    # Posting to (or deleting) connections of one stage of one WebSocket API of this template.
    re.compile(
        r"^arn:\$\{AWS::Partition\}:execute-api:\$\{AWS::Region\}:\$\{AWS::AccountId\}:"
        r"\$\{(?P<api>[A-Za-z0-9]+)\}/\$\{[A-Za-z0-9]+\}/(POST|DELETE)/@connections/\*$"
    ),
]

# The coordinator's Lambda timeout must exceed the longest transaction it accepts (the contract's
# maxTransactionTimeoutMs, twopc::model::MAX_TIMEOUT_MS) by at least this much, for the commit phase.
COMMIT_PHASE_MARGIN_MS = 10_000

# What the deployed code calls, read from its source: (file under functions/, SDK call) -> IAM action.
# The files are the stores of one table each, so the actions are checked per table.
CODE_TABLE_STORES = {
    "twopc/src/record.rs": "transactions",  # TransactionStore
    "twopc/src/items.rs": "participant",  # DataTable, every participant data table
    "twopc/src/fanout/connections.rs": "connections",  # ConnectionStore
}
# Calls of a store that go to another table: (file, call) -> table group.
CODE_TABLE_EXCEPTIONS = {
    # The one-phase commit puts the COMMITTED transaction record in the same TransactWriteItems as
    # the participant's items (DataTable::apply_one_phase).
    ("twopc/src/items.rs", "Put::builder()"): "transactions",
}
# Files that call the SDK but never run in a deployed function.
CODE_NOT_DEPLOYED = {
    "twopc/src/tables.rs": "creates tables for the local stack and the tests (CloudFormation does it in AWS)",
}
SDK_CALLS = {
    # DynamoDB (TransactWriteItems is authorized per item: its Put/Update/Delete/ConditionCheck)
    ".get_item()": "dynamodb:GetItem",
    ".put_item()": "dynamodb:PutItem",
    ".update_item()": "dynamodb:UpdateItem",
    ".delete_item()": "dynamodb:DeleteItem",
    ".query()": "dynamodb:Query",
    ".scan()": "dynamodb:Scan",
    ".batch_get_item()": "dynamodb:BatchGetItem",
    ".batch_write_item()": "dynamodb:BatchWriteItem",
    "Put::builder()": "dynamodb:PutItem",
    "Update::builder()": "dynamodb:UpdateItem",
    "Delete::builder()": "dynamodb:DeleteItem",
    "ConditionCheck::builder()": "dynamodb:ConditionCheckItem",
    "Get::builder()": "dynamodb:GetItem",
    # the rest
    ".put_record_batch()": "firehose:PutRecordBatch",
    ".put_record()": "firehose:PutRecord",
    ".post_to_connection()": "execute-api:ManageConnections",
    ".delete_connection()": "execute-api:ManageConnections",
    ".get_connection()": "execute-api:ManageConnections",
    ".invoke()": "lambda:InvokeFunction",
}
# SDK calls that are not for IAM to grant to a function (table administration, local only).
SDK_IGNORED = {".transact_write_items()", ".transact_get_items()"}
SDK_ADMIN = {".create_table()", ".describe_table()", ".update_time_to_live()", ".delete_table()"}
# Services whose actions a function's code calls (the stream-read, log and on-failure queue actions
# are Lambda's own, for the event source mapping and logging).
CODE_SERVICES = ("dynamodb", "firehose", "execute-api", "lambda")
CODE_NOT_CALLED = {
    "dynamodb:DescribeStream",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:ListStreams",
}


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def load(path: Path = TEMPLATE) -> dict:
    return cfn_yaml.load(str(path))


def transform(template: dict, filename: str = str(TEMPLATE)) -> dict:
    """The template after the SAM transform (what CloudFormation deploys)."""
    sam = Transform(filename, copy.deepcopy(template), "us-east-1")
    errors = sam.transform_template()
    if errors:
        raise AssertionError(f"SAM transform failed: {[str(e) for e in errors]}")
    return sam.template()


def contract() -> dict:
    """The code's tables and function environment, printed by functions/twopc/examples/contract.rs."""
    result = subprocess.run(
        ["cargo", "run", "-q", "-p", "twopc", "--example", "contract"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"cargo run --example contract failed:\n{result.stderr}")
    return json.loads(result.stdout)


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def resources(template: dict, kind: str) -> dict[str, dict]:
    return {name: r for name, r in template.get("Resources", {}).items() if r.get("Type") == kind}


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def getatt_target(value: Any) -> tuple[str, str] | None:
    """(resource, attribute) of a Fn::GetAtt, else None."""
    if isinstance(value, dict) and list(value) == ["Fn::GetAtt"]:
        target = value["Fn::GetAtt"]
        if isinstance(target, str):
            resource, _, attribute = target.partition(".")
            return resource, attribute
        return target[0], target[1]
    return None


def ref_target(value: Any) -> str | None:
    if isinstance(value, dict) and list(value) == ["Ref"]:
        return value["Ref"]
    return None


def sub_text(value: Any) -> str | None:
    """The text of a Fn::Sub (its variables left in place), else None."""
    if isinstance(value, dict) and list(value) == ["Fn::Sub"]:
        sub = value["Fn::Sub"]
        return sub if isinstance(sub, str) else sub[0]
    return None


def resolve(value: Any, template: dict) -> Any:
    """Evaluates a value with the parameters' defaults. A table resource resolves to its name; any
    other resource to `<LogicalId>`, an attribute to `<LogicalId.Attribute>`, a pseudo parameter to
    `<AWS::Name>`. Enough to compare names, not a full CloudFormation evaluator."""
    parameters = template.get("Parameters", {})
    all_resources = template.get("Resources", {})

    def ref(name: str) -> str:
        if name in parameters:
            return str(parameters[name].get("Default", f"<{name}>"))
        resource = all_resources.get(name)
        if resource and resource.get("Type") == "AWS::DynamoDB::Table":
            return str(resolve(resource["Properties"]["TableName"], template))
        return f"<{name}>"

    if isinstance(value, str):
        return value
    if (name := ref_target(value)) is not None:
        return ref(name)
    if (target := getatt_target(value)) is not None:
        return f"<{target[0]}.{target[1]}>"
    if isinstance(value, dict) and "Fn::Sub" in value:
        sub = value["Fn::Sub"]
        text, variables = (sub, {}) if isinstance(sub, str) else (sub[0], sub[1])

        def substitute(match: re.Match) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                return str(resolve(variables[name], template))
            if "." in name and not name.startswith("AWS::"):
                resource, _, attribute = name.partition(".")
                return f"<{resource}.{attribute}>"
            return ref(name)

        return re.sub(r"\$\{([^}]+)\}", substitute, text)
    return value


def functions_by_binary(raw: dict) -> dict[str, list[str]]:
    """Binary name (functions/<name>) -> logical ids of the functions built from it."""
    by_binary: dict[str, list[str]] = {}
    for name, resource in resources(raw, "AWS::Serverless::Function").items():
        binary = resource.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
        by_binary.setdefault(binary, []).append(name)
    return by_binary


def environment(transformed: dict, function: str) -> dict:
    props = transformed["Resources"][function]["Properties"]
    return props.get("Environment", {}).get("Variables", {})


# ----------------------------------------------------------------------------------------------
# 1. The template against the code's contract
# ----------------------------------------------------------------------------------------------


def _key_schema(schema: list, definitions: dict) -> tuple[list | None, list | None]:
    hash_key = range_key = None
    for element in schema:
        name = element["AttributeName"]
        pair = [name, definitions.get(name)]
        if element["KeyType"] == "HASH":
            hash_key = pair
        elif element["KeyType"] == "RANGE":
            range_key = pair
    return hash_key, range_key


def template_table_spec(table: dict, template: dict) -> dict:
    """A template table in the contract's shape."""
    props = table["Properties"]
    definitions = {d["AttributeName"]: d["AttributeType"] for d in props.get("AttributeDefinitions", [])}
    hash_key, range_key = _key_schema(props.get("KeySchema", []), definitions)
    indexes = []
    for index in props.get("GlobalSecondaryIndexes", []):
        index_hash, index_range = _key_schema(index.get("KeySchema", []), definitions)
        indexes.append(
            {
                "name": index.get("IndexName"),
                "hashKey": index_hash,
                "rangeKey": index_range,
                "projection": index.get("Projection", {}).get("ProjectionType"),
            }
        )
    stream = props.get("StreamSpecification")
    ttl = props.get("TimeToLiveSpecification")
    used = {k[0] for k in [hash_key, range_key] if k} | {
        k[0] for i in indexes for k in [i["hashKey"], i["rangeKey"]] if k
    }
    return {
        "name": resolve(props.get("TableName"), template),
        "hashKey": hash_key,
        "rangeKey": range_key,
        "indexes": sorted(indexes, key=lambda i: i["name"] or ""),
        "streamViewType": stream.get("StreamViewType") if stream else None,
        "ttlAttribute": ttl.get("AttributeName") if ttl and ttl.get("Enabled") is True else None,
        "unusedAttributeDefinitions": sorted(set(definitions) - used),
    }


def check_tables(raw: dict, code: dict) -> list[str]:
    problems = []
    tables = {}
    for logical_id, table in resources(raw, "AWS::DynamoDB::Table").items():
        spec = template_table_spec(table, raw)
        tables[spec["name"]] = (logical_id, spec)
    wanted = list(code["tables"])
    expected_names = {t["name"] for t in wanted}
    # A deployment may register more participant services than the default two: a table that is a
    # participant deployment's DATA_TABLE_NAME must have the shape of the code's participant table.
    participant_shape = next(t for t in wanted if t["name"] in code["participantTables"])
    data_tables = {
        resolve(f["Properties"].get("Environment", {}).get("Variables", {}).get("DATA_TABLE_NAME"), raw)
        for name, f in resources(raw, "AWS::Serverless::Function").items()
        if name in functions_by_binary(raw).get("participant", [])
    }
    for name in sorted(set(tables) - expected_names):
        if name in data_tables:
            wanted.append({**participant_shape, "name": name})
        else:
            problems.append(f"table {name} ({tables[name][0]}) is not one of the code's tables {sorted(expected_names)}")
    for want in wanted:
        name = want["name"]
        if name not in tables:
            problems.append(f"no table named {name} (by its name parameter's default) in the template")
            continue
        logical_id, got = tables[name]
        where = f"{logical_id} ({name})"
        for field in ["hashKey", "rangeKey"]:
            if got[field] != want[field]:
                problems.append(f"{where}: {field} is {got[field]}, the code uses {want[field]}")
        want_indexes = sorted(want["indexes"], key=lambda i: i["name"])
        if got["indexes"] != want_indexes:
            problems.append(f"{where}: indexes are {got['indexes']}, the code uses {want_indexes}")
        want_stream = "NEW_AND_OLD_IMAGES" if want["stream"] else None
        if got["streamViewType"] != want_stream:
            problems.append(f"{where}: stream is {got['streamViewType']}, the code needs {want_stream}")
        if got["ttlAttribute"] != want["ttlAttribute"]:
            problems.append(f"{where}: TTL attribute is {got['ttlAttribute']}, the code uses {want['ttlAttribute']}")
        if got["unusedAttributeDefinitions"]:
            problems.append(f"{where}: attribute definitions not used by any key: {got['unusedAttributeDefinitions']}")
    return problems


def check_environment(raw: dict, transformed: dict, code: dict) -> list[str]:
    """Every variable each function reads is set on every deployment of that function (after the
    Globals merge); nothing unknown is set; the registry and table names agree with each other."""
    problems = []
    by_binary = functions_by_binary(raw)
    wanted = code["functionEnvironment"]
    for binary in sorted(set(by_binary) - set(wanted)):
        problems.append(f"functions {by_binary[binary]} build binary {binary!r}, which the code does not list")
    for binary, variables in wanted.items():
        deployments = by_binary.get(binary, [])
        if not deployments:
            problems.append(f"no function in the template builds {binary!r}")
        for function in deployments:
            env = environment(transformed, function)
            for variable in variables:
                if variable not in env:
                    problems.append(f"{function} ({binary}) does not set {variable}")
            for variable in sorted(set(env) - set(variables) - EXTRA_ENVIRONMENT):
                problems.append(f"{function} ({binary}) sets {variable}, which {binary} does not read")
    return problems + check_registry(raw, transformed)


def _json_env(transformed: dict, function: str, variable: str, problems: list[str]) -> dict | None:
    value = environment(transformed, function).get(variable)
    if value is None:
        return None
    text = resolve(value, transformed)
    try:
        parsed = json.loads(text)
    except (TypeError, json.JSONDecodeError) as error:
        problems.append(f"{function}: {variable} is not JSON ({error}): {text!r}")
        return None
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        problems.append(f"{function}: {variable} is not a JSON object of strings: {text!r}")
        return None
    return parsed


def participant_deployments(raw: dict, transformed: dict) -> dict[str, dict]:
    """Service name -> {function, table, transactions} of each participant deployment."""
    deployments = {}
    for function in functions_by_binary(raw).get("participant", []):
        env = environment(transformed, function)
        service = resolve(env.get("SERVICE_NAME"), transformed)
        deployments[service] = {
            "function": function,
            "table": resolve(env.get("DATA_TABLE_NAME"), transformed),
        }
    return deployments


def check_registry(raw: dict, transformed: dict) -> list[str]:
    problems = []
    deployments = participant_deployments(raw, transformed)
    table_names = {
        resolve(t["Properties"]["TableName"], raw) for t in resources(raw, "AWS::DynamoDB::Table").values()
    }
    for service, deployment in deployments.items():
        if deployment["table"] not in table_names:
            problems.append(f"participant {service}: DATA_TABLE_NAME {deployment['table']!r} is not a table of the template")
    by_binary = functions_by_binary(raw)
    expected_registry = {s: f"<{d['function']}.Arn>" for s, d in deployments.items()}
    expected_tables = {s: d["table"] for s, d in deployments.items()}
    for binary in ["coordinator", "sweeper"]:
        for function in by_binary.get(binary, []):
            registry = _json_env(transformed, function, "PARTICIPANTS", problems)
            if registry is not None and registry != expected_registry:
                problems.append(
                    f"{function}: PARTICIPANTS {registry} is not the participant deployments {expected_registry}"
                )
    for binary in ["sweeper", "stream-processor"]:
        for function in by_binary.get(binary, []):
            tables = _json_env(transformed, function, "PARTICIPANT_TABLES", problems)
            if tables is not None and tables != expected_tables:
                problems.append(
                    f"{function}: PARTICIPANT_TABLES {tables} is not the participant deployments {expected_tables}"
                )
    # Single-table variables name the table the code expects by default.
    for variable, default in [("TRANSACTIONS_TABLE_NAME", "transactions"), ("CONNECTIONS_TABLE_NAME", "connections")]:
        for function in resources(transformed, "AWS::Lambda::Function"):
            value = environment(transformed, function).get(variable)
            if value is not None and resolve(value, transformed) != default:
                problems.append(f"{function}: {variable} resolves to {resolve(value, transformed)!r}, not {default!r}")
    return problems


# ----------------------------------------------------------------------------------------------
# 2. Least privilege
# ----------------------------------------------------------------------------------------------


def policy_documents(template: dict) -> list[tuple[str, dict]]:
    """(where, policy document) of every IAM and resource policy in the (transformed) template."""
    documents = []
    for name, role in resources(template, "AWS::IAM::Role").items():
        for policy in role["Properties"].get("Policies", []):
            documents.append((f"{name}/{policy.get('PolicyName')}", policy["PolicyDocument"]))
    for kind in ["AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::RolePolicy"]:
        for name, policy in resources(template, kind).items():
            documents.append((name, policy["Properties"]["PolicyDocument"]))
    for kind in ["AWS::S3::BucketPolicy", "AWS::SQS::QueuePolicy", "AWS::SNS::TopicPolicy"]:
        for name, policy in resources(template, kind).items():
            documents.append((name, policy["Properties"]["PolicyDocument"]))
    return documents


def check_iam(transformed: dict) -> list[str]:
    """No action wildcard and no "*" resource in any Allow statement (except the allow-list); a "*"
    inside an ARN only in the allowed shapes; no managed policies; one role per function.

    Deny statements may be broad (the bucket's TLS-only policy denies s3:* without TLS): a wider
    deny only takes permissions away."""
    problems = []
    for where, document in policy_documents(transformed):
        for index, statement in enumerate(as_list(document.get("Statement", []))):
            at = f"{where} statement {statement.get('Sid', index)}"
            if statement.get("Effect") != "Allow":
                continue
            if "NotAction" in statement or "NotResource" in statement:
                problems.append(f"{at}: NotAction/NotResource in an Allow grants everything else")
            actions = [a for a in as_list(statement.get("Action", [])) if isinstance(a, str)]
            if any(not isinstance(a, str) for a in as_list(statement.get("Action", []))):
                problems.append(f"{at}: actions must be literal strings")
            for action in actions:
                if "*" in action or "?" in action:
                    problems.append(f"{at}: action wildcard {action!r}")
            for resource in as_list(statement.get("Resource", [])):
                if resource == "*":
                    not_allowed = [a for a in actions if a.lower() not in STAR_RESOURCE_ALLOWED]
                    if not_allowed:
                        problems.append(f'{at}: Resource "*" for {not_allowed} (only {sorted(STAR_RESOURCE_ALLOWED)})')
                    continue
                text = resource if isinstance(resource, str) else sub_text(resource)
                if text is not None and "*" in text:
                    if not any(p.match(text) for p in WILDCARD_RESOURCE_PATTERNS):
                        problems.append(f"{at}: wildcard resource {text!r}")
            # Principals of resource policies in Allow statements must not be "*" either.
            if statement.get("Principal") == "*" or statement.get("Principal") == {"AWS": "*"}:
                problems.append(f'{at}: Allow to Principal "*"')
    for name, role in resources(transformed, "AWS::IAM::Role").items():
        managed = role["Properties"].get("ManagedPolicyArns", [])
        if managed:
            problems.append(f"{name}: managed policies {managed} (their statements are not reviewed here; inline them)")
    roles_used: dict[str, list[str]] = {}
    for name, function in resources(transformed, "AWS::Lambda::Function").items():
        role = getatt_target(function["Properties"].get("Role"))
        if role is None or role[0] not in transformed["Resources"]:
            problems.append(f"{name}: its role is not a role of this template")
            continue
        roles_used.setdefault(role[0], []).append(name)
    for role, users in roles_used.items():
        if len(users) > 1:
            problems.append(f"role {role} is shared by {users}: each function gets its own")
    return problems


def _allow_statements(template: dict, role: str) -> list[dict]:
    out = []
    for policy in template["Resources"][role]["Properties"].get("Policies", []):
        for statement in as_list(policy["PolicyDocument"].get("Statement", [])):
            if statement.get("Effect") == "Allow":
                out.append(statement)
    return out


def granted(template: dict, role: str, action: str) -> list:
    """Resources on which the role is allowed `action`."""
    out = []
    for statement in _allow_statements(template, role):
        if action.lower() in [a.lower() for a in as_list(statement.get("Action", []))]:
            out.extend(as_list(statement.get("Resource", [])))
    return out


def check_invoke_only_registered(raw: dict, transformed: dict) -> list[str]:
    """lambda:InvokeFunction is granted only on the participant functions of the registry, only to
    the functions that hold the registry (coordinator, sweeper), and on every registered one."""
    problems = []
    participants = {d["function"] for d in participant_deployments(raw, transformed).values()}
    registry_holders = set(functions_by_binary(raw).get("coordinator", [])) | set(
        functions_by_binary(raw).get("sweeper", [])
    )
    for name, function in resources(transformed, "AWS::Lambda::Function").items():
        role = getatt_target(function["Properties"].get("Role"))
        if role is None:
            continue
        targets = granted(transformed, role[0], "lambda:InvokeFunction")
        if targets and name not in registry_holders:
            problems.append(f"{name} may invoke {targets} but holds no participant registry")
        invokable = set()
        for target in targets:
            attribute = getatt_target(target)
            if attribute is None or attribute[1] != "Arn" or attribute[0] not in participants:
                problems.append(f"{name} may invoke {target}, which is not a registered participant function")
            else:
                invokable.add(attribute[0])
        if name in registry_holders and invokable != participants:
            problems.append(f"{name} may invoke {sorted(invokable)}, the registry has {sorted(participants)}")
    return problems


def _table_ids(template: dict) -> dict[str, str]:
    """Table name (resolved) -> logical id."""
    return {
        resolve(t["Properties"]["TableName"], template): name
        for name, t in resources(template, "AWS::DynamoDB::Table").items()
    }


def _role_of(template: dict, function: str) -> str | None:
    role = getatt_target(template["Resources"][function]["Properties"].get("Role"))
    return role[0] if role else None


def _normalized(resource: Any) -> Any:
    """A GetAtt as (resource, attribute), a Sub as its text, anything else as is."""
    if (target := getatt_target(resource)) is not None:
        return target
    if (text := sub_text(resource)) is not None:
        return text
    return resource


def check_participant_isolation(raw: dict, transformed: dict) -> list[str]:
    """A participant's role reaches its own data table and the transactions table, no other table."""
    problems = []
    ids = _table_ids(raw)
    transactions = ids.get("transactions")
    for service, deployment in participant_deployments(raw, transformed).items():
        own = ids.get(deployment["table"])
        role = _role_of(transformed, deployment["function"])
        allowed = {(own, "Arn"), (transactions, "Arn")}
        for statement in _allow_statements(transformed, role) if role else []:
            if not any(str(a).startswith("dynamodb:") for a in as_list(statement.get("Action", []))):
                continue
            for resource in as_list(statement.get("Resource", [])):
                if _normalized(resource) not in allowed:
                    problems.append(f"participant {service} ({role}) reaches {resource}, not only its own table")
    return problems


def check_permissions_complete(raw: dict, transformed: dict) -> list[str]:
    """The other direction: each function may do what its job needs on every table of the
    deployment (a registered service whose index the sweeper cannot query is never swept)."""
    problems = []
    ids = _table_ids(raw)
    deployments = participant_deployments(raw, transformed)
    for sweeper in functions_by_binary(raw).get("sweeper", []):
        role = _role_of(transformed, sweeper)
        queries = {_normalized(r) for r in granted(transformed, role, "dynamodb:Query")} if role else set()
        needed = {"${%s.Arn}/index/open-transactions" % ids.get("transactions")} | {
            "${%s.Arn}/index/locks-by-expiry" % ids.get(d["table"]) for d in deployments.values()
        }
        for index in sorted(needed - queries):
            problems.append(f"{sweeper} may not query {index}")
    for processor in functions_by_binary(raw).get("stream-processor", []):
        role = _role_of(transformed, processor)
        sources = {
            getatt_target(m["Properties"].get("EventSourceArn"))
            for m in resources(transformed, "AWS::Lambda::EventSourceMapping").values()
            if ref_target(m["Properties"].get("FunctionName")) == processor
        }
        for action in ["dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"]:
            readable = {_normalized(r) for r in granted(transformed, role, action)} if role else set()
            for source in sorted(s for s in sources - readable if s):
                problems.append(f"{processor} may not {action} on {source[0]}.{source[1]}")
    return problems


def code_calls(functions_dir: Path = REPO / "functions") -> tuple[dict[str, set[str]], set[str], list[str]]:
    """(table group -> DynamoDB actions its store calls, other actions the code calls, problems)
    read from the Rust source of the deployed functions and the library."""
    per_table: dict[str, set[str]] = {group: set() for group in set(CODE_TABLE_STORES.values())}
    other: set[str] = set()
    problems = []
    call = re.compile(r"\.[a-z_]+\(\)|\b[A-Z][A-Za-z]*::builder\(\)")
    known = set(SDK_CALLS) | SDK_IGNORED | SDK_ADMIN
    for path in sorted(functions_dir.glob("*/src/**/*.rs")):
        relative = path.relative_to(functions_dir).as_posix()
        text = path.read_text()
        found = [c for c in call.findall(text) if c in known]
        if not found:
            continue
        if relative in CODE_NOT_DEPLOYED:
            continue
        admin = sorted({c for c in found if c in SDK_ADMIN})
        if admin:
            problems.append(f"functions/{relative} calls {admin}: no deployed function may administer tables")
        for c in found:
            action = SDK_CALLS.get(c)
            if action is None:
                continue
            if action.startswith("dynamodb:"):
                group = CODE_TABLE_EXCEPTIONS.get((relative, c), CODE_TABLE_STORES.get(relative))
                if group is None:
                    problems.append(
                        f"functions/{relative} calls DynamoDB ({c}) outside the table stores "
                        f"{sorted(CODE_TABLE_STORES)}: add it to CODE_TABLE_STORES with its table"
                    )
                    continue
                per_table[group].add(action)
            else:
                other.add(action)
    return per_table, other, problems


def check_grants_match_code(raw: dict, transformed: dict, functions_dir: Path = REPO / "functions") -> list[str]:
    """The actions granted on each table (over all roles) are exactly what the code's store for that
    table calls, and the other services' actions exactly what the code calls: a grant the code never
    uses is not least privilege, a call nobody may make fails in AWS only."""
    per_table, other, problems = code_calls(functions_dir)
    ids = _table_ids(raw)
    groups = {
        "transactions": {ids.get("transactions")},
        "connections": {ids.get("connections")},
        "participant": {ids.get(d["table"]) for d in participant_deployments(raw, transformed).values()},
    }
    granted_per_group: dict[str, set[str]] = {group: set() for group in groups}
    granted_other: set[str] = set()
    for role in resources(transformed, "AWS::IAM::Role"):
        for statement in _allow_statements(transformed, role):
            actions = [a for a in as_list(statement.get("Action", [])) if isinstance(a, str)]
            for resource in as_list(statement.get("Resource", [])):
                target = _normalized(resource)
                table = None
                if isinstance(target, tuple) and target[1] == "Arn":
                    table = target[0]
                elif isinstance(target, str) and (m := re.match(r"^\$\{([A-Za-z0-9]+)\.Arn\}/index/", target)):
                    table = m.group(1)
                for action in actions:
                    if action.split(":")[0] not in CODE_SERVICES or action in CODE_NOT_CALLED:
                        continue
                    if action.startswith("dynamodb:"):
                        for group, members in groups.items():
                            if table in members:
                                granted_per_group[group].add(action)
                    else:
                        granted_other.add(action)
    for group in groups:
        code, grant = per_table.get(group, set()), granted_per_group[group]
        for action in sorted(code - grant):
            problems.append(f"the code calls {action} on the {group} table(s), no role may")
        for action in sorted(grant - code):
            problems.append(f"{action} is granted on the {group} table(s), the code never calls it")
    for action in sorted(other - granted_other):
        problems.append(f"the code calls {action}, no role may")
    for action in sorted(granted_other - other):
        problems.append(f"{action} is granted, the code never calls it")
    return problems


# ----------------------------------------------------------------------------------------------
# 3. Sanity
# ----------------------------------------------------------------------------------------------


def check_functions(raw: dict, transformed: dict, max_transaction_timeout_ms: int) -> list[str]:
    problems = []
    for name in resources(raw, "AWS::Serverless::Function"):
        metadata = raw["Resources"][name].get("Metadata", {})
        if metadata.get("BuildMethod") != "rust-cargolambda":
            problems.append(f"{name}: BuildMethod is {metadata.get('BuildMethod')!r}, not rust-cargolambda")
        if not metadata.get("BuildProperties", {}).get("Binary"):
            problems.append(f"{name}: no BuildProperties.Binary (the workspace has several binaries)")
    functions = resources(transformed, "AWS::Lambda::Function")
    if not functions:
        problems.append("no functions")
    for name, function in functions.items():
        props = function["Properties"]
        if props.get("Runtime") != "provided.al2023":
            problems.append(f"{name}: runtime {props.get('Runtime')!r}, not provided.al2023")
        if props.get("Architectures") != ["arm64"]:
            problems.append(f"{name}: architectures {props.get('Architectures')!r}, not [arm64]")
        if props.get("Handler") != "bootstrap":
            problems.append(f"{name}: handler {props.get('Handler')!r}, not bootstrap")
        if props.get("LoggingConfig", {}).get("LogFormat") != "JSON":
            problems.append(f"{name}: log format is not JSON")
        if name not in resources(raw, "AWS::Serverless::Function"):
            problems.append(f"{name}: not built by SAM (AWS::Serverless::Function with rust-cargolambda)")
    needed_ms = max_transaction_timeout_ms + COMMIT_PHASE_MARGIN_MS
    for name in functions_by_binary(raw).get("coordinator", []):
        timeout = functions.get(name, {}).get("Properties", {}).get("Timeout", 3)
        if not isinstance(timeout, int) or timeout * 1000 < needed_ms:
            problems.append(
                f"{name}: timeout {timeout} s; transactions may take {max_transaction_timeout_ms} ms to prepare, "
                f"so it needs at least {needed_ms // 1000} s"
            )
    return problems


def _queue_encrypted(queue: dict) -> bool:
    props = queue.get("Properties", {})
    return props.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in props


def check_event_sources(raw: dict, transformed: dict) -> list[str]:
    """Every stream event source reports item failures, bisects, retries a bounded number of times,
    drops records past a bounded age to an encrypted queue; every streamed table feeds the stream
    processor."""
    problems = []
    mappings = resources(transformed, "AWS::Lambda::EventSourceMapping")
    stream_processors = set(functions_by_binary(raw).get("stream-processor", []))
    fed: set[str] = set()
    for name, mapping in mappings.items():
        props = mapping["Properties"]
        source = getatt_target(props.get("EventSourceArn"))
        if source is None or source[1] != "StreamArn":
            continue
        fed.add(source[0])
        target = ref_target(props.get("FunctionName")) or (getatt_target(props.get("FunctionName")) or [None])[0]
        if target not in stream_processors:
            problems.append(f"{name}: the stream of {source[0]} goes to {target}, not the stream processor")
        if "ReportBatchItemFailures" not in props.get("FunctionResponseTypes", []):
            problems.append(f"{name}: no ReportBatchItemFailures")
        if props.get("BisectBatchOnFunctionError") is not True:
            problems.append(f"{name}: BisectBatchOnFunctionError is not true")
        retries = props.get("MaximumRetryAttempts")
        if not isinstance(retries, int) or not 0 <= retries <= 10:
            problems.append(f"{name}: MaximumRetryAttempts {retries!r} is not bounded (0..10)")
        age = props.get("MaximumRecordAgeInSeconds")
        if not isinstance(age, int) or not 60 <= age <= 86400:
            problems.append(f"{name}: MaximumRecordAgeInSeconds {age!r} is not bounded (60..86400)")
        if props.get("StartingPosition") not in ("TRIM_HORIZON", "LATEST"):
            problems.append(f"{name}: StartingPosition {props.get('StartingPosition')!r}")
        destination = getatt_target(props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination"))
        queue = transformed["Resources"].get(destination[0]) if destination else None
        if queue is None or queue.get("Type") != "AWS::SQS::Queue":
            problems.append(f"{name}: no SQS on-failure destination")
        elif not _queue_encrypted(queue):
            problems.append(f"{name}: on-failure queue {destination[0]} is not encrypted")
        else:
            function = transformed["Resources"].get(target, {}) if target else {}
            role = getatt_target(function.get("Properties", {}).get("Role"))
            allowed = [getatt_target(r) for r in granted(transformed, role[0], "sqs:SendMessage")] if role else []
            if (destination[0], "Arn") not in allowed:
                problems.append(f"{name}: the function's role may not send to the on-failure queue {destination[0]}")
    for table, resource in resources(transformed, "AWS::DynamoDB::Table").items():
        if "StreamSpecification" in resource["Properties"] and table not in fed:
            problems.append(f"the stream of {table} feeds no stream processor")
    return problems


def check_storage(transformed: dict) -> list[str]:
    """Tables: on demand, point-in-time recovery, encrypted. Buckets: private, encrypted, owner-
    enforced, TLS-only. Queues: encrypted."""
    problems = []
    for name, table in resources(transformed, "AWS::DynamoDB::Table").items():
        props = table["Properties"]
        if props.get("BillingMode") != "PAY_PER_REQUEST":
            problems.append(f"{name}: billing mode is not PAY_PER_REQUEST")
        if props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled") is not True:
            problems.append(f"{name}: point-in-time recovery is off")
        if props.get("SSESpecification", {}).get("SSEEnabled") is not True:
            problems.append(f"{name}: SSE (KMS) is not enabled")
    bucket_policies = resources(transformed, "AWS::S3::BucketPolicy")
    for name, bucket in resources(transformed, "AWS::S3::Bucket").items():
        props = bucket["Properties"]
        block = props.get("PublicAccessBlockConfiguration", {})
        for setting in ["BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"]:
            if block.get(setting) is not True:
                problems.append(f"{name}: {setting} is not true")
        if not props.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration"):
            problems.append(f"{name}: no default encryption")
        owners = [r.get("ObjectOwnership") for r in props.get("OwnershipControls", {}).get("Rules", [])]
        if owners != ["BucketOwnerEnforced"]:
            problems.append(f"{name}: object ownership {owners}, not BucketOwnerEnforced")
        tls_only = False
        for policy in bucket_policies.values():
            if ref_target(policy["Properties"].get("Bucket")) != name:
                continue
            for statement in as_list(policy["Properties"]["PolicyDocument"].get("Statement", [])):
                condition = statement.get("Condition", {}).get("Bool", {})
                if statement.get("Effect") == "Deny" and str(condition.get("aws:SecureTransport")).lower() == "false":
                    tls_only = True
        if not tls_only:
            problems.append(f"{name}: no bucket policy denying requests without TLS")
    for name, queue in resources(transformed, "AWS::SQS::Queue").items():
        if not _queue_encrypted(queue):
            problems.append(f"{name}: queue is not encrypted")
    return problems


def check_apis(raw: dict) -> list[str]:
    problems = []
    for name, api in resources(raw, "AWS::Serverless::Api").items():
        if api["Properties"].get("Auth", {}).get("DefaultAuthorizer") != "AWS_IAM":
            problems.append(f"{name}: DefaultAuthorizer is not AWS_IAM")
    routes = {
        r["Properties"].get("RouteKey"): r["Properties"] for r in resources(raw, "AWS::ApiGatewayV2::Route").values()
    }
    for key in ["$connect", "$disconnect", "subscribe", "unsubscribe"]:
        if key not in routes:
            problems.append(f"WebSocket route {key} is missing")
    if routes.get("$connect", {}).get("AuthorizationType") not in ("AWS_IAM", "CUSTOM"):
        problems.append("WebSocket $connect has no authorization")
    for name, api in resources(raw, "AWS::ApiGatewayV2::Api").items():
        if api["Properties"].get("RouteSelectionExpression") != "$request.body.action":
            problems.append(f"{name}: route selection is not $request.body.action")
    return problems


def check_lake(transformed: dict) -> list[str]:
    problems = []
    streams = resources(transformed, "AWS::KinesisFirehose::DeliveryStream")
    if len(streams) != 1:
        problems.append(f"expected one delivery stream, found {sorted(streams)}")
    for name, stream in streams.items():
        props = stream["Properties"]
        s3 = props.get("ExtendedS3DestinationConfiguration", {})
        if props.get("DeliveryStreamType") != "DirectPut":
            problems.append(f"{name}: not DirectPut")
        if "!{timestamp:yyyy}" not in str(s3.get("Prefix")) or "!{timestamp:HH}" not in str(s3.get("Prefix")):
            problems.append(f"{name}: prefix {s3.get('Prefix')!r} is not partitioned by date and hour")
        if "!{firehose:error-output-type}" not in str(s3.get("ErrorOutputPrefix")):
            problems.append(f"{name}: no ErrorOutputPrefix with the error type")
        if not props.get("DeliveryStreamEncryptionConfigurationInput"):
            problems.append(f"{name}: not encrypted at rest")
    return problems


def check_schedule(raw: dict) -> list[str]:
    problems = []
    for function in functions_by_binary(raw).get("sweeper", []):
        events = raw["Resources"][function]["Properties"].get("Events", {})
        schedules = [e["Properties"].get("Schedule") for e in events.values() if e.get("Type") == "Schedule"]
        if schedules != ["rate(1 minute)"]:
            problems.append(f"{function}: schedules {schedules}, expected [rate(1 minute)]")
    return problems


def check_alarms(transformed: dict) -> list[str]:
    problems = []
    alarms = list(resources(transformed, "AWS::CloudWatch::Alarm").values())
    metrics = {(a["Properties"].get("Namespace"), a["Properties"].get("MetricName")) for a in alarms}
    for metric in [("AWS/SQS", "ApproximateNumberOfMessagesVisible"), ("TwoPhaseCommit", "StuckTransactions")]:
        if metric not in metrics:
            problems.append(f"no alarm on {metric[0]} {metric[1]}")
    return problems
