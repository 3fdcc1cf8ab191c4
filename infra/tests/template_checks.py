"""Checks of a deployed template (the SAM template after the transform, or the CDK app's synthesized
template), written as functions that return a list of problems (empty: fine).

Every check finds what it needs by meaning (resource types, properties, references: see system.py
and cfn.py), never by a logical id, so the same check runs on both templates. The tests run each
check on both templates and on deliberately broken copies of both, so every check is shown to pass
on the templates and to fail when the property it guards is broken.
"""

from __future__ import annotations

import json
import re
import subprocess
import warnings
from pathlib import Path
from typing import Any

from cfn import REPO, Stack, as_list, att_id, number, ref_id
from system import (
    PARTICIPANT_BINARY,
    alias_arns,
    allow_statements,
    binary_candidates,
    binary_of,
    declared_binary,
    environment,
    function_target,
    functions,
    functions_by_binary,
    functions_of,
    granted,
    json_variable,
    log_group_of,
    participant_deployments,
    participant_functions,
    alias_references,
    policy_documents,
    role_of,
    table_ids,
    table_of_arn,
)

# The only actions that may be granted on Resource "*", each with the reason.
STAR_RESOURCE_ALLOWED = {
    # IAM defines no resource type for dynamodb:ListStreams (Service Authorization Reference, and
    # cfn-lint's copy of it): it can only be granted on "*". It lists stream ARNs and reads nothing.
    # Lambda's DynamoDB event source mapping needs it in the function's execution role (the stream
    # processor's and the outcomes function's).
    "dynamodb:liststreams": "IAM has no resource type for ListStreams; only stream ARNs are listed",
    # X-Ray defines no resource types for these two: a traced function sends its segments with them.
    "xray:puttracesegments": "IAM has no resource type for X-Ray trace segments",
    "xray:puttelemetryrecords": "IAM has no resource type for X-Ray telemetry",
}

# A "*" inside a resource ARN is accepted only in these shapes (resource names stay fixed), each for
# whom it names: None, any grantee; else only grants to these AWS service principals and nobody beside
# them (the services a role's trust policy names; a resource policy statement's Principal).
WILDCARD_RESOURCE_PATTERNS: list[tuple[re.Pattern, frozenset[str] | None]] = [
    # Objects of one bucket of this template: `${Bucket.Arn}/*`.
    (re.compile(r"^\$\{(?P<bucket>[A-Za-z0-9]+)\.Arn\}/\*$"), None),
    # Under one prefix of the audit bucket, for the logging service that writes there only: S3 server
    # access logging under `s3-access/`, CloudTrail under `cloudtrail/AWSLogs/${AWS::AccountId}/`.
    (re.compile(r"^\$\{(?P<bucket>[A-Za-z0-9]+)\.Arn\}/s3-access/\*$"), frozenset({"logging.s3.amazonaws.com"})),
    (
        re.compile(r"^\$\{(?P<bucket>[A-Za-z0-9]+)\.Arn\}/cloudtrail/AWSLogs/\$\{AWS::AccountId\}/\*$"),
        frozenset({"cloudtrail.amazonaws.com"}),
    ),
    # The log groups of this account and region: API Gateway's account CloudWatch role only (one per
    # account and region, serving the access and execution logs of every API there;
    # ApiGatewayAccountRole=Create), a role no one but API Gateway may assume.
    (
        re.compile(r"^arn:\$\{AWS::Partition\}:logs:\$\{AWS::Region\}:\$\{AWS::AccountId\}:log-group:\*$"),
        frozenset({"apigateway.amazonaws.com"}),
    ),
    # Posting to (or deleting) connections of one stage of one WebSocket API of this template.
    (
        re.compile(
            r"^arn:\$\{AWS::Partition\}:execute-api:\$\{AWS::Region\}:\$\{AWS::AccountId\}:"
            r"\$\{(?P<api>[A-Za-z0-9]+)\}/[^/*]+/(POST|DELETE)/@connections/\*$"
        ),
        None,
    ),
]

# The coordinator's Lambda timeout must exceed the longest transaction it accepts (the contract's
# maxTransactionTimeoutMs, twopc::model::MAX_TIMEOUT_MS) by at least this much, for the commit phase.
COMMIT_PHASE_MARGIN_MS = 10_000

# What the deployed code calls, read from its source: (file under functions/, SDK call) -> IAM action.
# The files are the stores of one table each, so the actions are checked per table.
CODE_TABLE_STORES = {
    "twopc/src/record/store.rs": "transactions",  # TransactionStore
    # the chain of attempts' writes (decide_abort, claim_age, fence_attempt): transactions records only
    "twopc/src/attempts.rs": "transactions",
    "twopc/src/participant/store.rs": "participant",  # DataTable, every participant data table
    # Barrier, a resource participant's entries in its own table (the example payments' payments-data):
    # the tables of resource participants only.
    "twopc/src/participant/barrier.rs": "barrier",
    "fanout/src/connections.rs": "connections",  # ConnectionStore
    "fanout/src/connections/topics.rs": "connections",  # ConnectionStore: subscribe, unsubscribe
}
# Calls of a store that go to another table: (file, call) -> table group.
CODE_TABLE_EXCEPTIONS = {
    # The one-phase commit puts the COMMITTED transaction record in the same TransactWriteItems as
    # the participant's items (DataTable::apply_one_phase).
    ("twopc/src/participant/store.rs", "Write::put("): "transactions",
}
# The one conditional write (`twopc::store::write`), the sharded-index query and the batched read
# (`twopc::store`): they send what the stores build, so their SDK calls are the stores', each read where a
# store asks for it (`Write::put(`, `.due_before(`, `store::batch_get(`, ...), on that store's table.
CODE_FOR_THE_STORES = {"twopc/src/store/write.rs", "twopc/src/store.rs"}
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
    # a store's conditional write, sent by twopc::store::write (alone, or in a TransactWriteItems)
    "Write::put(": "dynamodb:PutItem",
    "Write::update(": "dynamodb:UpdateItem",
    "Write::delete(": "dynamodb:DeleteItem",
    "Write::check(": "dynamodb:ConditionCheckItem",
    # a store's query of its sharded sparse index (the open records, the locks), sent by twopc::store
    ".due_before(": "dynamodb:Query",
    # a store's batched read (the records of a page, the items a record names), sent by twopc::store
    "store::batch_get(": "dynamodb:BatchGetItem",
    # the rest
    ".put_record_batch()": "firehose:PutRecordBatch",
    ".put_record()": "firehose:PutRecord",
    ".post_to_connection()": "execute-api:ManageConnections",
    ".delete_connection()": "execute-api:ManageConnections",
    ".get_connection()": "execute-api:ManageConnections",
    ".invoke()": "lambda:InvokeFunction",
    # the stream processor's dead-letter queue: the records it gives up on itself (with their
    # content), and the replay of what it and its event sources gave up on
    ".send_message()": "sqs:SendMessage",
    ".receive_message()": "sqs:ReceiveMessage",
    ".delete_message()": "sqs:DeleteMessage",
    ".get_queue_attributes()": "sqs:GetQueueAttributes",
    # the participant message keys (twopc::auth, SecretsManagerKeys): the coordinator and the sweeper
    # read every service's key to sign, a participant its own to verify
    ".get_secret_value()": "secretsmanager:GetSecretValue",
    # the outcome events (twopc_fanout::outcomes, aws-sdk-eventbridge): the outcomes function's one
    # event per outcome and the sweeper's "open too long" alerts, on the outcomes bus
    ".put_events()": "events:PutEvents",
    # the operators' outcome history (GET /admin/outcomes, the coordinator's outcome_log): the log
    # group the outcomes bus's rule writes, read back
    ".filter_log_events()": "logs:FilterLogEvents",
}
# SDK calls that are not for IAM to grant to a function (table administration, local only).
SDK_IGNORED = {".transact_write_items()", ".transact_get_items()"}
SDK_ADMIN = {".create_table()", ".describe_table()", ".update_time_to_live()", ".delete_table()"}
# Services whose actions a function's code calls (the stream-read, log and X-Ray actions are
# Lambda's own, for the event source mapping, logging and tracing).
CODE_SERVICES = ("dynamodb", "firehose", "execute-api", "lambda", "sqs", "secretsmanager", "events", "logs")
CODE_NOT_CALLED = {
    # Lambda's own: the event source mappings read the streams with the function's role.
    "dynamodb:DescribeStream",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:ListStreams",
    # Lambda's own logging into each function's log group, Firehose's into its error log stream and API
    # Gateway's (its account role) into the access and execution logs: the services', never the code's.
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "logs:CreateLogGroup",
    "logs:DescribeLogGroups",
    "logs:DescribeLogStreams",
}
# Actions Lambda itself also takes with a function's role, so granted even where the code does not
# call them: the event sources' on-failure destination (sqs:SendMessage; the stream processor's code
# sends to the same queue, so a grant missing for the code's call is still reported).
LAMBDA_ALSO_USES = {"sqs:SendMessage"}

# The outcomes function (functions/outcomes): the transactions table's second stream reader, beside
# the stream processor; it sends one EventBridge event per outcome to the stack's outcomes bus.
OUTCOMES_BINARY = "outcomes"
# The functions whose event source mappings read table streams (with the stream-read grants and
# dynamodb:ListStreams their mappings need).
STREAM_READERS = ("stream-processor", OUTCOMES_BINARY)

# Binaries deployed only when a parameter is set (not empty): the JWT authorizer (functions/authorizer)
# exists only with JwtIssuer. Without it, no function of the template runs them, and none may.
CONDITIONAL_BINARIES = {"authorizer": "JwtIssuer"}
# The parameter that turns JSON Web Tokens on (both APIs then use the authorizer), and values of it
# and of JwtAudience for the checks that evaluate the templates with tokens on.
JWT_ISSUER_PARAMETER = "JwtIssuer"
JWT_AUDIENCE_PARAMETER = "JwtAudience"
JWT_ISSUER_EXAMPLE = "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_Example1"
JWT_AUDIENCE_EXAMPLE = "example-app-client-id"
AUTHORIZER_BINARY = "authorizer"
# The REST API's Lambda authorizer: a REQUEST authorizer on the Authorization header whose answers
# are never cached (an expired token is refused at once).
REST_AUTHORIZER = {"type": "REQUEST", "identitySource": "method.request.header.Authorization", "ttl": 0}


def jwt_enabled(stack: Stack) -> bool:
    """Whether the template, evaluated with its parameter values, takes JSON Web Tokens (JwtIssuer set)."""
    return bool(stack.parameter(JWT_ISSUER_PARAMETER))


def with_jwt(stack: Stack, issuer: str = JWT_ISSUER_EXAMPLE, audience: str = JWT_AUDIENCE_EXAMPLE) -> Stack:
    """The same template evaluated with JSON Web Tokens on (JwtIssuer and JwtAudience set)."""
    return stack.with_parameters(**{JWT_ISSUER_PARAMETER: issuer, JWT_AUDIENCE_PARAMETER: audience})


def binary_deployed(stack: Stack, binary: str) -> bool:
    """Whether the template, with its parameter values, must deploy a function of `binary`."""
    parameter = CONDITIONAL_BINARIES.get(binary)
    return parameter is None or bool(stack.parameter(parameter))


# Values the code expects of single-table variables (its defaults: the tables keep these names).
TABLE_VARIABLES = {"TRANSACTIONS_TABLE_NAME": "transactions", "CONNECTIONS_TABLE_NAME": "connections"}
# The CloudWatch namespace of the coordinator's and sweeper's metrics: one per stack.
METRICS_NAMESPACE = "TwoPhaseCommit/${AWS::StackName}"


# ----------------------------------------------------------------------------------------------
# The code's contract
# ----------------------------------------------------------------------------------------------


def contract() -> dict:
    """The code's tables and function environment, printed by functions/twopc/examples/contract.rs,
    held to what the binaries' sources show (`with_source_facts`)."""
    result = subprocess.run(
        ["cargo", "run", "-q", "--locked", "-p", "twopc", "--example", "contract"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"cargo run --example contract failed:\n{result.stderr}")
    return with_source_facts(json.loads(result.stdout))


# A binary whose main installs the embedded-metric-format recorder from its environment reads
# METRICS_NAMESPACE (twopc::telemetry::install_emf_from_env).
EMF_FROM_ENVIRONMENT = "install_emf_from_env("
METRICS_NAMESPACE_VARIABLE = "METRICS_NAMESPACE"
# The names of the metrics each function writes (twopc::telemetry), by the contract's key.
TELEMETRY_SOURCE = REPO / "functions" / "twopc" / "src" / "telemetry.rs"
TELEMETRY_LISTS = {
    "coordinatorCounts": "COORDINATOR_COUNTS",
    "coordinatorLatencies": "COORDINATOR_LATENCIES",
    "sweeperCounts": "SWEEPER_COUNTS",
    "sweeperGauges": "SWEEPER_GAUGES",
    "streamProcessorCounts": "STREAM_PROCESSOR_COUNTS",
}


def telemetry_names(source: Path = TELEMETRY_SOURCE) -> dict[str, list[str]]:
    """The contract's metric lists as `twopc::telemetry` declares them (`pub const X: &[&str] =
    &[NAME, ...]`, each NAME a `pub const NAME: &str = "...";` of the same file)."""
    text = source.read_text()
    names = dict(re.findall(r'^\s*pub const (\w+): &str = "([^"]*)";', text, re.M))
    out = {}
    for key, constant in TELEMETRY_LISTS.items():
        match = re.search(r"pub const %s: &\[&str\] =\s*&\[([^\]]*)\];" % constant, text)
        if match is None:
            raise AssertionError(f"no constant {constant} in {source}")
        items = [item.strip() for item in match.group(1).split(",") if item.strip()]
        unknown = [item for item in items if item not in names]
        if unknown:
            raise AssertionError(f"{constant} in {source} names {unknown}, which are not string constants of the file")
        out[key] = [names[item] for item in items]
    return out


# twopc's modules, each naming the variables it reads, read by a `pub fn` of the same file
# (`twopc::hold::policy_from_env` reads HOLD_POLICY and MAX_HOLD_MS).
TWOPC_SOURCES = REPO / "functions" / "twopc" / "src"


def env_readers(sources: Path = TWOPC_SOURCES) -> dict[str, list[str]]:
    """The top-level `pub fn`s of twopc's modules (`sources`: a folder, or one file) that read variables
    named by constants of their own file (`std::env::var(NAME)`, NAME a `pub const NAME: &str = "..."`),
    as `module::function` (the file's name, or its folder's for a `mod.rs`), with the variables each
    reads. Functions that read the variable their caller names (`required(name)`) are not among them:
    their callers name it, and FUNCTION_ENVIRONMENT lists it."""
    files = [sources] if sources.is_file() else sorted(sources.rglob("*.rs"))
    readers: dict[str, list[str]] = {}
    for source in files:
        text = source.read_text()
        module = source.parent.name if source.stem == "mod" else source.stem
        names = dict(re.findall(r'^pub const (\w+): &str = "([^"]*)";', text, re.M))
        # Each top-level `pub fn`, up to its closing brace (the first `}` alone at the start of a line).
        for match in re.finditer(r"^pub (?:async )?fn (\w+)\b(.*?)^\}", text, re.M | re.S):
            read = [names[c] for c in re.findall(r"std::env::var\((\w+)\)", match.group(2)) if c in names]
            if read:
                readers[f"{module}::{match.group(1)}"] = sorted(set(read))
    return readers


def variables_read_through_readers(
    binaries: list[str], functions_dir: Path = REPO / "functions", sources: Path = TWOPC_SOURCES
) -> dict[str, list[str]]:
    """binary -> the variables it reads through the readers of twopc its sources call
    (`hold::policy_from_env()` reads HOLD_POLICY and MAX_HOLD_MS)."""
    readers = env_readers(sources)
    out: dict[str, list[str]] = {}
    for binary in binaries:
        sources_of_binary = sorted((functions_dir / binary / "src").rglob("*.rs"))
        text = "\n".join(s.read_text() for s in sources_of_binary)
        called = {f"{m}::{f}" for m, f in re.findall(r"\b(\w+)::(\w+)\s*\(", text)}
        read = sorted({v for reader in called & set(readers) for v in readers[reader]})
        if read:
            out[binary] = read
    return out


def with_source_facts(code: dict, functions_dir: Path = REPO / "functions", sources: Path = TWOPC_SOURCES) -> dict:
    """The contract, held to what the sources show: each binary whose `main.rs` calls
    `install_emf_from_env` must list METRICS_NAMESPACE, and each metric list of `twopc::telemetry` must be
    printed, as the source declares it (a difference fails: the contract is what the templates follow).
    A variable a binary reads through a reader of twopc (`hold::policy_from_env()`) that
    FUNCTION_ENVIRONMENT does not list yet is added to the binary's variables, with a warning: the
    templates must set what the code reads, whether or not the list says so yet."""
    environment = code.get("functionEnvironment", {})
    for binary, read in variables_read_through_readers(sorted(environment), functions_dir, sources).items():
        missing = [v for v in read if v not in environment[binary]]
        if missing:
            warnings.warn(
                f"{binary} reads {missing} through twopc's readers (functions/{binary}/src), which "
                "twopc::environment::FUNCTION_ENVIRONMENT does not list: the templates are held to them all the same",
                stacklevel=2,
            )
            environment[binary] = [*environment[binary], *missing]
    for main in sorted(functions_dir.glob("*/src/main.rs")):
        binary = main.parent.parent.name
        if binary in environment and EMF_FROM_ENVIRONMENT in main.read_text():
            if METRICS_NAMESPACE_VARIABLE not in environment[binary]:
                raise AssertionError(
                    f"{binary} reads {METRICS_NAMESPACE_VARIABLE} (functions/{binary}/src/main.rs calls "
                    f"install_emf_from_env), which twopc::environment::FUNCTION_ENVIRONMENT does not list"
                )
    metrics = code.get("metrics", {})
    for key, names in telemetry_names().items():
        if key not in metrics:
            raise AssertionError(f"the contract prints no metrics.{key} (twopc::telemetry::{TELEMETRY_LISTS[key]})")
        if sorted(metrics[key]) != sorted(names):
            raise AssertionError(
                f"the contract's metrics.{key} {metrics[key]} is not {TELEMETRY_LISTS[key]} of {TELEMETRY_SOURCE}: {names}"
            )
    return code


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


def template_table_spec(props: dict) -> dict:
    """A template table (resolved properties) in the contract's shape."""
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
    ttl_enabled = ttl and str(ttl.get("Enabled")).lower() == "true"
    used = {k[0] for k in [hash_key, range_key] if k} | {
        k[0] for i in indexes for k in [i["hashKey"], i["rangeKey"]] if k
    }
    return {
        "hashKey": hash_key,
        "rangeKey": range_key,
        "indexes": sorted(indexes, key=lambda i: i["name"] or ""),
        "streamViewType": stream.get("StreamViewType") if stream else None,
        "ttlAttribute": ttl.get("AttributeName") if ttl_enabled else None,
        "unusedAttributeDefinitions": sorted(set(definitions) - used),
    }


def check_tables(stack: Stack) -> list[str]:
    problems = []
    code = stack.code
    tables = {name: (t, template_table_spec(stack.props(t))) for name, t in table_ids(stack).items()}
    wanted = list(code["tables"])
    expected_names = {t["name"] for t in wanted}
    # A deployment may register more participant services than the default two: a table that is a
    # participant deployment's DATA_TABLE_NAME must have the shape of the code's participant table.
    participant_shape = next(t for t in wanted if t["name"] in code["participantTables"])
    data_tables = {d["table"] for d in participant_deployments(stack).values()}
    for name in sorted(set(tables) - expected_names):
        if name in data_tables:
            wanted.append({**participant_shape, "name": name})
        else:
            problems.append(f"table {name} ({tables[name][0]}) is not one of the code's tables {sorted(expected_names)}")
    for want in wanted:
        name = want["name"]
        if name not in tables:
            problems.append(f"no table named {name} (a literal name or a parameter's default) in the template")
            continue
        logical_id, got = tables[name]
        where = f"{logical_id} ({name})"
        for key in ["hashKey", "rangeKey"]:
            if got[key] != want[key]:
                problems.append(f"{where}: {key} is {got[key]}, the code uses {want[key]}")
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


def check_environment(stack: Stack) -> list[str]:
    """Every function sets exactly the variables its binary reads (so each binary is deployed and
    told apart by its environment); the registries and names agree with the deployments."""
    problems = []
    wanted = {binary: set(names) for binary, names in stack.code["functionEnvironment"].items()}
    by_binary = functions_by_binary(stack)
    for function in functions(stack):
        variables = set(environment(stack, function))
        binary = binary_of(stack, function)
        if binary is None:
            problems.append(f"{function}: its variables {sorted(variables)} match no binary of the code")
            continue
        candidates = binary_candidates(stack, function)
        declared = declared_binary(stack, function)
        if len(candidates) > 1 and declared not in candidates:
            # Binaries that read the same variables are told apart by the code the function runs.
            problems.append(
                f"{function}: its variables are those of {candidates}, and its code names none of them "
                f"({declared!r}: SAM's BuildProperties.Binary, CDK's twopc:binary)"
            )
        elif declared is not None and declared != binary:
            # Its code is another binary's (the payments' environment, the generic participant's code).
            problems.append(
                f"{function}: its code is {declared!r} (SAM's BuildProperties.Binary, CDK's twopc:binary), "
                f"its variables are those of {binary!r}"
            )
        for variable in sorted(wanted[binary] - variables):
            problems.append(f"{function} ({binary}) does not set {variable}")
        for variable in sorted(variables - wanted[binary]):
            problems.append(f"{function} ({binary}) sets {variable}, which {binary} does not read")
    for binary in sorted(set(wanted) - set(by_binary)):
        if binary_deployed(stack, binary):
            problems.append(f"no function of the template runs {binary!r}")
    for binary in sorted(set(by_binary) & set(CONDITIONAL_BINARIES)):
        if not binary_deployed(stack, binary):
            problems.append(
                f"{by_binary[binary]} run {binary!r}, which is deployed only when {CONDITIONAL_BINARIES[binary]} "
                "is set (it is empty)"
            )
    return problems + check_registry(stack) + check_named_resources(stack)


def check_registry(stack: Stack) -> list[str]:
    """PARTICIPANTS names each participant deployment's `live` alias; PARTICIPANT_TABLES each
    deployment's table; DATA_TABLE_NAME is a table of the template."""
    problems = []
    deployments = participant_deployments(stack)
    if len(deployments) != len(participant_functions(stack)):
        problems.append("two participant deployments share a SERVICE_NAME: one of them is hidden from every check")
    names = set(table_ids(stack))
    for service, deployment in deployments.items():
        if deployment["table"] not in names:
            problems.append(f"participant {service}: DATA_TABLE_NAME {deployment['table']!r} is not a table of the template")
        if deployment["alias"] is None:
            problems.append(f"participant {service} ({deployment['function']}) has no alias 'live'")
    for binary in ["coordinator", "sweeper"]:
        for function in functions_of(stack, binary):
            registry = json_variable(stack, function, "PARTICIPANTS", problems)
            if registry is None:
                continue
            if set(registry) != set(deployments):
                problems.append(f"{function}: PARTICIPANTS names {sorted(registry)}, the deployments are {sorted(deployments)}")
            for service, target in registry.items():
                deployment = deployments.get(service)
                if deployment and target not in alias_references(deployment["function"], deployment["alias"]):
                    problems.append(
                        f"{function}: PARTICIPANTS[{service}] is {target!r}, not the 'live' alias of "
                        f"{deployment['function']} (so a deploy could reach a participant's new version early)"
                    )
    expected_tables = {s: d["table"] for s, d in deployments.items()}
    for binary in ["sweeper", "stream-processor"]:
        for function in functions_of(stack, binary):
            tables = json_variable(stack, function, "PARTICIPANT_TABLES", problems)
            if tables is not None and tables != expected_tables:
                problems.append(f"{function}: PARTICIPANT_TABLES {tables} is not the participant deployments {expected_tables}")
    return problems


def check_named_resources(stack: Stack) -> list[str]:
    """The other variables name what the code expects: its default table names, this stack's
    delivery stream, event bus, outcome history log group, WebSocket stage and metrics namespace."""
    problems = []
    streams = {"${%s}" % s for s in stack.resources("AWS::KinesisFirehose::DeliveryStream")}
    buses = {"${%s}" % s for s in stack.resources("AWS::Events::EventBus")}
    function_groups = {group for f in functions(stack) if (group := log_group_of(stack, f))}
    log_groups = {"${%s}" % g for g in stack.resources("AWS::Logs::LogGroup") if g not in function_groups}
    apis = "|".join(re.escape(a) for a in stack.resources("AWS::ApiGatewayV2::Api")) or "-"
    endpoint = re.compile(
        r"^https://\$\{(%s)\}\.execute-api\.\$\{AWS::Region\}\.(\$\{AWS::URLSuffix\}|amazonaws\.com)/[^/]+$" % apis
    )
    for function in functions(stack):
        env = environment(stack, function)
        for variable, default in TABLE_VARIABLES.items():
            if variable in env and env[variable] != default:
                problems.append(f"{function}: {variable} is {env[variable]!r}, not {default!r}")
        if "FIREHOSE_STREAM_NAME" in env and env["FIREHOSE_STREAM_NAME"] not in streams:
            problems.append(f"{function}: FIREHOSE_STREAM_NAME {env['FIREHOSE_STREAM_NAME']!r} is not a delivery stream of the template")
        if "OUTCOME_LOG_GROUP" in env and env["OUTCOME_LOG_GROUP"] not in log_groups:
            problems.append(f"{function}: OUTCOME_LOG_GROUP {env['OUTCOME_LOG_GROUP']!r} is not the name (Ref) of a log group of the template (no function's own)")
        if "EVENT_BUS_NAME" in env and env["EVENT_BUS_NAME"] not in buses:
            problems.append(f"{function}: EVENT_BUS_NAME {env['EVENT_BUS_NAME']!r} is not the name (Ref) of an event bus of the template")
        if "WEBSOCKET_ENDPOINT" in env and not endpoint.match(str(env["WEBSOCKET_ENDPOINT"])):
            problems.append(f"{function}: WEBSOCKET_ENDPOINT {env['WEBSOCKET_ENDPOINT']!r} is not a stage URL of the WebSocket API")
        if "METRICS_NAMESPACE" in env and env["METRICS_NAMESPACE"] != METRICS_NAMESPACE:
            problems.append(f"{function}: METRICS_NAMESPACE is {env['METRICS_NAMESPACE']!r}, not {METRICS_NAMESPACE!r}")
    return problems


# The services' own operation schemas, which the coordinator validates (its SERVICE_OPERATIONS): the
# file both templates take them from (CDK reads it at synthesis, SAM inlines it), which a test of the
# repository holds to what the services declare (tests/tests/inventory.rs).
SERVICE_OPERATIONS_FILE = REPO / "infra" / "service-operations.json"
SERVICE_OPERATIONS_VARIABLE = "SERVICE_OPERATIONS"


def service_operations_file(path: Path = SERVICE_OPERATIONS_FILE) -> Any:
    return json.loads(path.read_text())


def check_service_operations(stack: Stack, expected: Any = None) -> list[str]:
    """The coordinator's SERVICE_OPERATIONS is the JSON of infra/service-operations.json (`expected`
    when given); every service it names is in the coordinator's PARTICIPANTS (the coordinator refuses
    to start otherwise) and is deployed with a participant of its own (not the generic `participant`,
    which knows the built-in operations only and would refuse every one of those)."""
    expected = service_operations_file() if expected is None else expected
    variable, source = SERVICE_OPERATIONS_VARIABLE, SERVICE_OPERATIONS_FILE.relative_to(REPO)
    problems: list[str] = []
    coordinators = functions_of(stack, "coordinator")
    if not coordinators:
        problems.append("no coordinator")
    deployments = participant_deployments(stack)
    for function in coordinators:
        value = environment(stack, function).get(variable)
        if value is None:
            problems.append(f"{function}: no {variable} (the services' own operation schemas, {source})")
            continue
        try:
            operations = json.loads(str(value))
        except json.JSONDecodeError as error:
            problems.append(f"{function}: {variable} is not JSON ({error}): {value!r}")
            continue
        if operations != expected:
            problems.append(f"{function}: {variable} {operations!r} is not the JSON of {source}: {expected!r}")
        if not isinstance(operations, dict):
            problems.append(f"{function}: {variable} is not a JSON object of services' operation schemas")
            continue
        registry = json_variable(stack, function, "PARTICIPANTS", problems) or {}
        for service in sorted(operations):
            if service not in registry:
                problems.append(
                    f"{function}: {variable} names {service!r}, which is not in its PARTICIPANTS {sorted(registry)} "
                    "(the coordinator refuses to start)"
                )
            deployment = deployments.get(service)
            if deployment is not None and deployment["binary"] == PARTICIPANT_BINARY:
                problems.append(
                    f"{function}: {variable} names {service!r}, whose participant {deployment['function']} runs the "
                    f"generic {PARTICIPANT_BINARY!r} binary, which knows none of those operations"
                )
            # A resource's operations (`"resource": true`: never committed in one phase) are a resource
            # participant's, and a resource participant's operations are all a resource's.
            schemas = operations[service] if isinstance(operations[service], list) else []
            marked = {bool(s.get("resource")) for s in schemas if isinstance(s, dict)}
            if deployment is not None and marked and marked != {deployment["resource"]}:
                kind = "drives a resource" if deployment["resource"] else "drives no resource"
                problems.append(
                    f"{function}: {variable} gives {service!r} operations with resource {sorted(marked)}, and its "
                    f"participant {deployment['function']} ({deployment['binary']!r}) {kind}"
                )
    return problems


# ----------------------------------------------------------------------------------------------
# 2. Least privilege
# ----------------------------------------------------------------------------------------------


def _principals(principal: Any) -> set[str]:
    """Who a Principal names: each AWS service by its name (`apigateway.amazonaws.com`), anything else
    as `<kind>:<value>` (`AWS:...`, `Federated:...`, `*:*`), which no service set matches."""
    if isinstance(principal, dict):
        return {str(v) if kind == "Service" else f"{kind}:{v}" for kind, values in principal.items() for v in as_list(values)}
    return {f"*:{principal}"}


def _trusted(stack: Stack, role: str) -> set[str]:
    """Who may assume a role: the principals of its trust policy's Allow statements."""
    document = stack.props(role).get("AssumeRolePolicyDocument") or {}
    return set().union(*[
        _principals(s.get("Principal"))
        for s in as_list(document.get("Statement"))
        if isinstance(s, dict) and s.get("Effect") == "Allow"
    ])


def _grantees(stack: Stack, where: str) -> set[str] | None:
    """Who the statements of a policy document of `policy_documents` grant to: the principals that may
    assume its role (or roles); None for a resource policy, whose statements each name a Principal."""
    name = where.split("/")[0]
    kind = stack.kind(name)
    if kind == "AWS::IAM::Role":
        return _trusted(stack, name)
    if kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::RolePolicy"):
        props = stack.props(name)
        out: set[str] = set()
        for role in as_list(props.get("Roles")) + as_list(props.get("RoleName")):
            role_id = ref_id(role)
            out |= _trusted(stack, role_id) if role_id and stack.kind(role_id) == "AWS::IAM::Role" else {f"role:{role}"}
        return out or {"unknown:no role"}
    return None


def _check_statement(at: str, statement: dict, grantees: set[str]) -> list[str]:
    """`grantees`: who the statement grants to (`_principals`), for the wildcard shapes that are
    accepted only for some services."""
    problems = []
    if "NotAction" in statement or "NotResource" in statement:
        problems.append(f"{at}: NotAction/NotResource in an Allow grants everything else")
    actions = as_list(statement.get("Action"))
    if any(not isinstance(a, str) or a.startswith("${") for a in actions):
        problems.append(f"{at}: actions must be literal strings")
    actions = [a for a in actions if isinstance(a, str)]
    for action in actions:
        if "*" in action or "?" in action:
            problems.append(f"{at}: action wildcard {action!r}")
    for resource in as_list(statement.get("Resource")):
        text = str(resource)
        if text == "*":
            not_allowed = [a for a in actions if a.lower() not in STAR_RESOURCE_ALLOWED]
            if not_allowed:
                problems.append(f'{at}: Resource "*" for {not_allowed} (only {sorted(STAR_RESOURCE_ALLOWED)})')
        elif "*" in text:
            shapes = [services for pattern, services in WILDCARD_RESOURCE_PATTERNS if pattern.match(text)]
            if not shapes:
                problems.append(f"{at}: wildcard resource {text!r}")
            elif not any(services is None or (grantees and grantees <= services) for services in shapes):
                allowed = sorted(set().union(*[s for s in shapes if s is not None]))
                problems.append(f"{at}: wildcard resource {text!r} granted to {sorted(grantees)}, only for {allowed}")
    # Principals of resource policies in Allow statements must not be "*" either.
    if statement.get("Principal") in ("*", {"AWS": "*"}):
        problems.append(f'{at}: Allow to Principal "*"')
    return problems


def check_iam(stack: Stack) -> list[str]:
    """No action wildcard and no "*" resource in any Allow statement (except the allow-list); a "*"
    inside an ARN only in the allowed shapes, each only for the grantees it names (every log group:
    only in a role no one but API Gateway may assume; the audit bucket's prefixes: only to the logging
    service that writes there); no managed policies; one role per function.

    Deny statements may be broad (the bucket's TLS-only policy denies s3:* without TLS): a wider
    deny only takes permissions away. Checked with tracing on, so that conditional grants are seen."""
    traced = stack.with_parameters(TracingMode="Active") if "TracingMode" in stack.template.get("Parameters", {}) else stack
    problems = []
    for where, document in policy_documents(traced):
        grantees = _grantees(traced, where)
        for index, statement in enumerate(as_list(document.get("Statement"))):
            if isinstance(statement, dict) and statement.get("Effect") == "Allow":
                who = grantees if grantees is not None else _principals(statement.get("Principal"))
                problems += _check_statement(f"{where} statement {statement.get('Sid', index)}", statement, who)
    for name in traced.resources("AWS::IAM::Role"):
        managed = traced.props(name).get("ManagedPolicyArns", [])
        if managed:
            problems.append(f"{name}: managed policies {managed} (their statements are not reviewed here; inline them)")
    roles_used: dict[str, list[str]] = {}
    for function in functions(traced):
        role = role_of(traced, function)
        if role is None:
            problems.append(f"{function}: its role is not a role of this template")
            continue
        roles_used.setdefault(role, []).append(function)
    for role, users in roles_used.items():
        if len(users) > 1:
            problems.append(f"role {role} is shared by {users}: each function gets its own")
    return problems


def check_invoke_only_registered(stack: Stack) -> list[str]:
    """lambda:InvokeFunction is granted only on the `live` aliases of the registered participants,
    only to the functions that hold the registry (coordinator, sweeper), and on every one of them."""
    problems = []
    deployments = participant_deployments(stack).values()
    allowed = {arn: d["function"] for d in deployments for arn in alias_arns(d["function"], d["alias"])}
    participants = {d["function"] for d in deployments}
    holders = set(functions_of(stack, "coordinator")) | set(functions_of(stack, "sweeper"))
    for function in functions(stack):
        targets = granted(stack, role_of(stack, function), "lambda:InvokeFunction")
        if targets and function not in holders:
            problems.append(f"{function} may invoke {targets} but holds no participant registry")
        invokable = set()
        for target in targets:
            if target not in allowed:
                problems.append(f"{function} may invoke {target}, which is not a registered participant's 'live' alias")
            else:
                invokable.add(allowed[target])
        if function in holders and invokable != participants:
            problems.append(f"{function} may invoke {sorted(invokable)}, the registry has {sorted(participants)}")
    return problems


def check_participant_isolation(stack: Stack) -> list[str]:
    """A participant's role reaches its own data table and the transactions table, no other table."""
    problems = []
    ids = table_ids(stack)
    for service, deployment in participant_deployments(stack).items():
        role = role_of(stack, deployment["function"])
        allowed = {"${%s.Arn}" % ids.get(deployment["table"]), "${%s.Arn}" % ids.get("transactions")}
        for statement in allow_statements(stack, role):
            if not any(str(a).startswith("dynamodb:") for a in statement["Action"]):
                continue
            for resource in statement["Resource"]:
                if resource not in allowed:
                    problems.append(f"participant {service} ({role}) reaches {resource}, not only its own table")
    return problems


def check_participants_cannot_decide(stack: Stack) -> list[str]:
    """No participant role can write a decision or overwrite a record (issue 42). On the transactions
    table a participant may read records (GetItem: lock resolution follows an owner's decision) and put
    a record only under its own service's one-phase ids (PutItem with the one condition
    `ForAllValues:StringLike` `dynamodb:LeadingKeys` = ["1p~<service>~*"]: the record of its own one-phase
    commit); nothing else: no UpdateItem (a status, the operations), no DeleteItem, no batch write."""
    problems = []
    ids = table_ids(stack)
    transactions = "${%s.Arn}" % ids.get("transactions")
    for service, deployment in participant_deployments(stack).items():
        role = role_of(stack, deployment["function"])
        for statement in allow_statements(stack, role):
            if not any(str(r).startswith(transactions) for r in statement["Resource"]):
                continue
            for action in (str(a) for a in statement["Action"]):
                if action == "dynamodb:GetItem":
                    continue
                if action == "dynamodb:PutItem":
                    condition = stack.resolve(statement.get("Condition") or {})
                    expected = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [f"1p~{service}~*"]}}
                    if condition != expected:
                        problems.append(
                            f"participant {service} ({role}) may PutItem on the transactions table under "
                            f"{json.dumps(condition)}: only under its own one-phase ids, {json.dumps(expected)}"
                        )
                    continue
                problems.append(
                    f"participant {service} ({role}) may {action} on the transactions table: only the "
                    "coordinator and the sweeper may write a decision or change a record"
                )
    return problems


def stream_sources(stack: Stack, function: str) -> set[str]:
    """Stream ARNs (`${Table.StreamArn}`) of the function's event source mappings."""
    return {
        str(props.get("EventSourceArn"))
        for m in stack.resources("AWS::Lambda::EventSourceMapping")
        if function_target(stack, (props := stack.props(m)).get("FunctionName")) == function
    }


def check_permissions_complete(stack: Stack) -> list[str]:
    """The other direction: each function may do what its job needs on every table of the
    deployment (a registered service whose index the sweeper cannot query is never swept)."""
    problems = []
    ids = table_ids(stack)
    deployments = participant_deployments(stack)
    for sweeper in functions_of(stack, "sweeper"):
        queries = set(granted(stack, role_of(stack, sweeper), "dynamodb:Query"))
        needed = {"${%s.Arn}/index/open-transactions" % ids.get("transactions")} | {
            "${%s.Arn}/index/locks-by-expiry" % ids.get(d["table"]) for d in deployments.values()
        }
        for index in sorted(needed - queries):
            problems.append(f"{sweeper} may not query {index}")
    for processor in [f for binary in STREAM_READERS for f in functions_of(stack, binary)]:
        role = role_of(stack, processor)
        for action in ["dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"]:
            readable = set(granted(stack, role, action))
            for source in sorted(stream_sources(stack, processor) - readable):
                problems.append(f"{processor} may not {action} on {source}")
    return problems


def code_calls(functions_dir: Path = REPO / "functions") -> tuple[dict[str, set[str]], set[str], list[str]]:
    """(table group -> DynamoDB actions its store calls, other actions the code calls, problems)
    read from the Rust source of the deployed functions and the library."""
    per_table: dict[str, set[str]] = {group: set() for group in set(CODE_TABLE_STORES.values())}
    other: set[str] = set()
    problems = []
    call = re.compile(r"\.[a-z_]+\(\)|\b[A-Z][A-Za-z]*::builder\(\)|\bWrite::[a-z]+\(|\.due_before\(|\bstore::batch_get\(")
    known = set(SDK_CALLS) | SDK_IGNORED | SDK_ADMIN
    for path in sorted(functions_dir.glob("*/src/**/*.rs")):
        relative = path.relative_to(functions_dir).as_posix()
        text = path.read_text()
        found = [c for c in call.findall(text) if c in known]
        if not found or relative in CODE_NOT_DEPLOYED or relative in CODE_FOR_THE_STORES:
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


def check_grants_match_code(stack: Stack, functions_dir: Path = REPO / "functions") -> list[str]:
    """The actions granted on each table (over all roles) are exactly what the code's store for that
    table calls, and the other services' actions exactly what the code calls: a grant the code never
    uses is not least privilege, a call nobody may make fails in AWS only. The participant tables are
    DataTable's (participant/store.rs); the barrier's calls (participant/barrier.rs) are granted on
    every resource participant's table and on no item participant's."""
    per_table, other, problems = code_calls(functions_dir)
    ids = table_ids(stack)
    deployments = participant_deployments(stack).values()
    groups = {
        "transactions": {ids[n] for n in ["transactions"] if n in ids},
        "connections": {ids[n] for n in ["connections"] if n in ids},
        # Every participant table: DataTable's (the participant's own on an item table, the sweeper's
        # lock listing and reading on any), and the barrier's where a resource participant is deployed.
        "participant": {ids[d["table"]] for d in deployments if d["table"] in ids},
    }
    barrier_tables = {ids[d["table"]] for d in deployments if d["table"] in ids and d["resource"]}
    item_tables = groups["participant"] - barrier_tables
    barrier_calls = per_table.pop("barrier", set())
    item_calls = set(per_table.get("participant", set()))
    per_table["participant"] = item_calls | (barrier_calls if barrier_tables else set())
    granted_per_table: dict[str, set[str]] = {}
    granted_per_group: dict[str, set[str]] = {group: set() for group in groups}
    granted_other: set[str] = set()
    for role in stack.resources("AWS::IAM::Role"):
        for statement in allow_statements(stack, role):
            actions = [a for a in statement["Action"] if isinstance(a, str)]
            for resource in statement["Resource"]:
                table = table_of_arn(str(resource))
                for action in actions:
                    if action.split(":")[0] not in CODE_SERVICES or action in CODE_NOT_CALLED:
                        continue
                    if action.startswith("dynamodb:"):
                        if table is None:
                            problems.append(f"{role}: {action} on {resource}, which is no table or index of the template")
                            continue
                        granted_per_table.setdefault(table, set()).add(action)
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
    # The barrier's calls (a resource participant's entries) on the resource participants' tables, and
    # only there: an item participant's table is written by DataTable alone.
    for table in sorted(item_tables):
        for action in sorted(granted_per_table.get(table, set()) - item_calls):
            problems.append(
                f"{action} is granted on the item participant table {table}, which DataTable never calls "
                "(the barrier's calls belong on a resource participant's table only)"
            )
    for table in sorted(barrier_tables):
        for action in sorted(barrier_calls - granted_per_table.get(table, set())):
            problems.append(f"the barrier calls {action} on the resource participant table {table}, no role may")
    for action in sorted(other - granted_other):
        problems.append(f"the code calls {action}, no role may")
    for action in sorted(granted_other - other - LAMBDA_ALSO_USES):
        problems.append(f"{action} is granted, the code never calls it")
    return problems


# ----------------------------------------------------------------------------------------------
# 3. Sanity
# ----------------------------------------------------------------------------------------------


def check_functions(stack: Stack) -> list[str]:
    """arm64 Rust functions on provided.al2023; the coordinator outlives the longest transaction."""
    problems = []
    if not functions(stack):
        problems.append("no functions")
    for function in functions(stack):
        props = stack.props(function)
        if props.get("Runtime") != "provided.al2023":
            problems.append(f"{function}: runtime {props.get('Runtime')!r}, not provided.al2023")
        if props.get("Architectures") != ["arm64"]:
            problems.append(f"{function}: architectures {props.get('Architectures')!r}, not [arm64]")
        if props.get("Handler") != "bootstrap":
            problems.append(f"{function}: handler {props.get('Handler')!r}, not bootstrap")
        if props.get("PackageType", "Zip") != "Zip":
            problems.append(f"{function}: package type {props.get('PackageType')!r}, not Zip")
    maximum_ms = stack.code["maxTransactionTimeoutMs"]
    needed_ms = maximum_ms + COMMIT_PHASE_MARGIN_MS
    # An answer on the decision (`Prefer: respond-async`) is followed, in the same invocation, by its
    # second phase: the invocation may last the answer budget and the after-answer budget together.
    answered_ms = stack.code["answerBudgetMs"] + stack.code["afterAnswerBudgetMs"]
    for function in functions_of(stack, "coordinator"):
        timeout = number(stack.props(function).get("Timeout", 3))
        if timeout is None or timeout * 1000 < needed_ms:
            problems.append(
                f"{function}: timeout {timeout} s; transactions may take {maximum_ms} ms to prepare, "
                f"so it needs at least {needed_ms // 1000} s"
            )
        elif timeout * 1000 <= answered_ms:
            problems.append(
                f"{function}: timeout {timeout} s; an answer on the decision may take {stack.code['answerBudgetMs']} ms "
                f"and its second phase {stack.code['afterAnswerBudgetMs']} ms more in the same invocation, "
                f"so it needs more than {answered_ms // 1000} s"
            )
    return problems


def _queue_encrypted(props: dict) -> bool:
    return str(props.get("SqsManagedSseEnabled")).lower() == "true" or "KmsMasterKeyId" in props


def _check_mapping(stack: Stack, mapping: str, props: dict, processors: set[str], outcomes: set[str] = frozenset()) -> list[str]:
    problems = []
    function = function_target(stack, props.get("FunctionName"))
    transactions = table_ids(stack).get("transactions")
    on_transactions = att_id(props.get("EventSourceArn"), "StreamArn") == transactions
    if function not in processors and not (function in outcomes and on_transactions):
        problems.append(
            f"{mapping}: the stream {props.get('EventSourceArn')} goes to {function}, not the stream processor "
            "(nor the outcomes function, which reads the transactions table's stream only)"
        )
    if "ReportBatchItemFailures" not in as_list(props.get("FunctionResponseTypes")):
        problems.append(f"{mapping}: no ReportBatchItemFailures")
    if str(props.get("BisectBatchOnFunctionError")).lower() != "true":
        problems.append(f"{mapping}: BisectBatchOnFunctionError is not true")
    # -1 retries until the record ages out: the record age must then be bounded, and it is, always
    # (within the stream's 24 h retention), so no batch is retried forever.
    retries = number(props.get("MaximumRetryAttempts"))
    if retries is None or not (retries == -1 or 0 <= retries <= 10000):
        problems.append(f"{mapping}: MaximumRetryAttempts {props.get('MaximumRetryAttempts')!r} is not -1 or 0..10000")
    age = number(props.get("MaximumRecordAgeInSeconds"))
    if age is None or not 60 <= age <= 86400:
        problems.append(f"{mapping}: MaximumRecordAgeInSeconds {props.get('MaximumRecordAgeInSeconds')!r} is not bounded (60..86400)")
    if props.get("StartingPosition") not in ("TRIM_HORIZON", "LATEST"):
        problems.append(f"{mapping}: StartingPosition {props.get('StartingPosition')!r}")
    queue = att_id(props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination"), "Arn")
    if queue is None or stack.kind(queue) != "AWS::SQS::Queue":
        problems.append(f"{mapping}: no SQS on-failure destination")
    elif not _queue_encrypted(stack.props(queue)):
        problems.append(f"{mapping}: on-failure queue {queue} is not encrypted")
    elif function and "${%s.Arn}" % queue not in granted(stack, role_of(stack, function), "sqs:SendMessage"):
        problems.append(f"{mapping}: the function's role may not send to the on-failure queue {queue}")
    return problems


def check_event_sources(stack: Stack) -> list[str]:
    """Every stream event source reports item failures, bisects, retries (-1: until the record ages
    out, or a count of at most 10000) records of a bounded age (at most the stream's 24 h) and then
    describes them in an encrypted queue; every streamed table feeds the stream processor, and the
    transactions table's stream the outcomes function too (its only stream)."""
    problems = []
    processors = set(functions_of(stack, "stream-processor"))
    outcomes = set(functions_of(stack, OUTCOMES_BINARY))
    fed: set[str] = set()
    for mapping in stack.resources("AWS::Lambda::EventSourceMapping"):
        props = stack.props(mapping)
        table = att_id(props.get("EventSourceArn"), "StreamArn")
        if table is None:
            problems.append(f"{mapping}: source {props.get('EventSourceArn')!r} is not the stream of a table of the template")
            continue
        if function_target(stack, props.get("FunctionName")) in processors:
            fed.add(table)
        problems += _check_mapping(stack, mapping, props, processors, outcomes)
    for table in stack.resources("AWS::DynamoDB::Table"):
        if "StreamSpecification" in stack.props(table) and table not in fed:
            problems.append(f"the stream of {table} feeds no stream processor")
    transactions = table_ids(stack).get("transactions")
    for function in sorted(outcomes):
        if stream_sources(stack, function) != {"${%s.StreamArn}" % transactions}:
            problems.append(f"{function} (outcomes): reads {sorted(stream_sources(stack, function))}, not the transactions table's stream alone")
    return problems


def _tls_only(stack: Stack, bucket: str) -> bool:
    for policy in stack.resources("AWS::S3::BucketPolicy"):
        props = stack.props(policy)
        if ref_id(props.get("Bucket")) != bucket:
            continue
        for statement in as_list(props.get("PolicyDocument", {}).get("Statement")):
            condition = statement.get("Condition", {}).get("Bool", {})
            if statement.get("Effect") == "Deny" and str(condition.get("aws:SecureTransport")).lower() == "false":
                return True
    return False


def check_storage(stack: Stack) -> list[str]:
    """Tables: on demand, point-in-time recovery, encrypted. Buckets: private, encrypted, owner-
    enforced, TLS-only. Queues: encrypted."""
    problems = []
    for name in stack.resources("AWS::DynamoDB::Table"):
        props = stack.props(name)
        if props.get("BillingMode") != "PAY_PER_REQUEST":
            problems.append(f"{name}: billing mode is not PAY_PER_REQUEST")
        pitr = props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled")
        if str(pitr).lower() != "true":
            problems.append(f"{name}: point-in-time recovery is off")
        if str(props.get("SSESpecification", {}).get("SSEEnabled")).lower() != "true":
            problems.append(f"{name}: SSE (KMS) is not enabled")
    for name in stack.resources("AWS::S3::Bucket"):
        props = stack.props(name)
        block = props.get("PublicAccessBlockConfiguration", {})
        for setting in ["BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"]:
            if str(block.get(setting)).lower() != "true":
                problems.append(f"{name}: {setting} is not true")
        if not props.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration"):
            problems.append(f"{name}: no default encryption")
        owners = [r.get("ObjectOwnership") for r in props.get("OwnershipControls", {}).get("Rules", [])]
        if owners != ["BucketOwnerEnforced"]:
            problems.append(f"{name}: object ownership {owners}, not BucketOwnerEnforced")
        if not _tls_only(stack, name):
            problems.append(f"{name}: no bucket policy denying requests without TLS")
    for name in stack.resources("AWS::SQS::Queue"):
        if not _queue_encrypted(stack.props(name)):
            problems.append(f"{name}: queue is not encrypted")
    return problems


def _resource_path(stack: Stack, resource: str | None, api: str) -> str | None:
    """The path of an AWS::ApiGateway::Resource (its PathParts up to the API's root)."""
    parts: list[str] = []
    current = resource
    for _ in range(20):
        if current is None:
            return None
        if current == "${%s.RootResourceId}" % api:
            return "/" + "/".join(reversed(parts))
        logical_id = ref_id(current)
        if logical_id is None or stack.kind(logical_id) != "AWS::ApiGateway::Resource":
            return None
        props = stack.props(logical_id)
        parts.append(str(props.get("PathPart")))
        current = props.get("ParentId")
    return None


def _header_names(parameters: Any, prefix: str = "method.response.header.") -> set[str]:
    """The (lower-case) header names of a method response's parameters."""
    return {str(k)[len(prefix):].lower() for k in (parameters or {}) if str(k).lower().startswith(prefix)}


def _authorizer_function(stack: Stack, uri: Any) -> str | None:
    """The function an authorizer's URI (`arn:...:lambda:path/2015-03-31/functions/<ARN>/invocations`)
    invokes, when it is one of the template."""
    match = re.search(r"/functions/(\$\{[A-Za-z0-9]+(?:\.Arn)?\})/invocations$", str(uri))
    return function_target(stack, match.group(1)) if match else None


def _lambda_authorizer(stack: Stack, settings: dict, uri: Any) -> dict:
    """A REST API's Lambda authorizer in one shape: {type (upper case), identitySource, ttl, function}."""
    ttl = number(settings.get("ttl"))
    return {
        "type": str(settings.get("type")).upper(),
        "identitySource": settings.get("identitySource"),
        # API Gateway caches an authorizer's answers 300 s unless told otherwise.
        "ttl": 300 if ttl is None else int(ttl),
        "function": _authorizer_function(stack, uri),
    }


def _rest_authorizer_resource(stack: Stack, value: Any) -> dict | None:
    """The Lambda authorizer an AWS::ApiGateway::Method's AuthorizerId names (CDK)."""
    authorizer = ref_id(value)
    if authorizer is None or stack.kind(authorizer) != "AWS::ApiGateway::Authorizer" or not stack.exists(authorizer):
        return None
    props = stack.props(authorizer)
    settings = {
        "type": props.get("Type"),
        "identitySource": props.get("IdentitySource"),
        "ttl": props.get("AuthorizerResultTtlInSeconds"),
    }
    return _lambda_authorizer(stack, settings, props.get("AuthorizerUri"))


def rest_methods(stack: Stack) -> dict[tuple[str, str], dict]:
    """(HTTP method, path) -> {api, authorization (AWS_IAM, CUSTOM or NONE), lambda authorizer (None, or
    {type, identitySource, ttl, function} of a CUSTOM method), integration uri, integration type (lower
    case), integration responses [{selection (None: the default), status, parameters, templates}],
    method responses {status: declared header names (lower case)}}, from AWS::ApiGateway::Method
    resources (CDK) and from OpenAPI bodies of the REST APIs (SAM)."""
    methods = {}
    for method in stack.resources("AWS::ApiGateway::Method"):
        props = stack.props(method)
        api = ref_id(props.get("RestApiId"))
        path = _resource_path(stack, props.get("ResourceId"), api or "")
        integration = props.get("Integration", {})
        methods[(str(props.get("HttpMethod")).upper(), path or "?")] = {
            "api": api,
            "authorization": props.get("AuthorizationType"),
            "lambda_authorizer": (
                _rest_authorizer_resource(stack, props.get("AuthorizerId")) if props.get("AuthorizationType") == "CUSTOM" else None
            ),
            # Everything that decides who may call it (to compare two methods' authorization).
            "authorizer": {k: props.get(k) for k in ["AuthorizationType", "AuthorizerId", "AuthorizationScopes", "ApiKeyRequired"]},
            "uri": str(integration.get("Uri")),
            "integration_type": str(integration.get("Type")).lower(),
            "integration_responses": [
                {
                    "selection": response.get("SelectionPattern") or None,
                    "status": str(response.get("StatusCode")),
                    "parameters": response.get("ResponseParameters") or {},
                    "templates": response.get("ResponseTemplates") or {},
                }
                for response in as_list(integration.get("IntegrationResponses"))
            ],
            "method_responses": {
                str(response.get("StatusCode")): _header_names(response.get("ResponseParameters"))
                for response in as_list(props.get("MethodResponses"))
            },
        }
    for api in stack.resources("AWS::ApiGateway::RestApi"):
        body = stack.props(api).get("Body") or {}
        definitions = body.get("securityDefinitions", {})
        sigv4 = {name for name, scheme in definitions.items() if scheme.get("x-amazon-apigateway-authtype") == "awsSigv4"}
        custom = {
            name: scheme["x-amazon-apigateway-authorizer"]
            for name, scheme in definitions.items()
            if isinstance(scheme.get("x-amazon-apigateway-authorizer"), dict)
        }
        for path, operations in body.get("paths", {}).items():
            for verb, operation in operations.items():
                names = {name for requirement in as_list(operation.get("security")) for name in requirement}
                integration = operation.get("x-amazon-apigateway-integration", {})
                # Anything but signatures is a custom authorization (an authorizer of the body, or a name
                # the body does not define: API Gateway refuses that, and no check may take it for IAM).
                authorization = "NONE" if not names else "AWS_IAM" if names <= sigv4 else "CUSTOM"
                lambda_authorizer = None
                if authorization == "CUSTOM" and len(names) == 1 and next(iter(names)) in custom:
                    settings = custom[next(iter(names))]
                    lambda_authorizer = _lambda_authorizer(
                        stack,
                        {
                            "type": settings.get("type"),
                            "identitySource": settings.get("identitySource"),
                            "ttl": settings.get("authorizerResultTtlInSeconds"),
                        },
                        settings.get("authorizerUri"),
                    )
                methods[(verb.upper(), path)] = {
                    "api": api,
                    "authorization": authorization,
                    "lambda_authorizer": lambda_authorizer,
                    "authorizer": {"security": operation.get("security")},
                    "uri": str(integration.get("uri")),
                    "integration_type": str(integration.get("type")).lower(),
                    "integration_responses": [
                        {
                            "selection": None if pattern == "default" else pattern,
                            "status": str(response.get("statusCode")),
                            "parameters": response.get("responseParameters") or {},
                            "templates": response.get("responseTemplates") or {},
                        }
                        for pattern, response in (integration.get("responses") or {}).items()
                    ],
                    "method_responses": {
                        str(status): {str(h).lower() for h in (response or {}).get("headers", {})}
                        for status, response in (operation.get("responses") or {}).items()
                    },
                }
    return methods


# The REST routes of the coordinator (functions/coordinator/src/lib.rs).
CREATE_ROUTE = ("POST", "/transactions")
HOLD_ROUTES = [("POST", "/transactions/{id}/commit"), ("POST", "/transactions/{id}/abort")]
# The operators' routes (twopc::coordinator::AdminRequest): authorized as the others.
ADMIN_ROUTES = [
    ("GET", "/admin/transactions"),
    ("GET", "/admin/transactions/{id}"),
    ("GET", "/admin/stuck"),
    # the recent outcomes, read back from the outcome history (OUTCOME_LOG_GROUP)
    ("GET", "/admin/outcomes"),
    ("POST", "/admin/transactions/{id}/retry"),
    ("POST", "/admin/transactions/{id}/abort"),
]
COORDINATOR_ROUTES = [CREATE_ROUTE, ("GET", "/transactions/{id}"), *HOLD_ROUTES, *ADMIN_ROUTES]


def expected_rest_authorization(stack: Stack) -> str:
    """What every REST method but the preflight takes: AWS_IAM, or CUSTOM (the JWT authorizer) when
    JwtIssuer is set."""
    return "CUSTOM" if jwt_enabled(stack) else "AWS_IAM"


def rest_authorization_problems(stack: Stack, where: str, method: dict) -> list[str]:
    """A REST method's authorization for the template's parameter values: AWS_IAM without JSON Web
    Tokens; with them, the authorizer function as a REQUEST authorizer on the Authorization header
    whose answers are never cached (TTL 0)."""
    want = expected_rest_authorization(stack)
    if method["authorization"] != want:
        return [f"{where}: authorization {method['authorization']!r}, not {want} (JwtIssuer {stack.parameter(JWT_ISSUER_PARAMETER)!r})"]
    if want != "CUSTOM":
        return []
    authorizer = method.get("lambda_authorizer")
    if authorizer is None:
        return [f"{where}: its CUSTOM authorization is no Lambda authorizer of the template"]
    problems = []
    for key, value in REST_AUTHORIZER.items():
        if authorizer[key] != value:
            problems.append(f"{where}: its authorizer's {key} is {authorizer[key]!r}, not {value!r}")
    authorizers = functions_of(stack, AUTHORIZER_BINARY)
    if authorizer["function"] not in authorizers:
        problems.append(f"{where}: its authorizer invokes {authorizer['function']!r}, not the authorizer function {authorizers}")
    return problems


def websocket_authorizer(stack: Stack, route: dict) -> dict | None:
    """The AWS::ApiGatewayV2::Authorizer a route's AuthorizerId names (its resolved properties, and the
    function its URI invokes), when it is one of the template that exists."""
    authorizer = ref_id(route.get("AuthorizerId"))
    if authorizer is None or stack.kind(authorizer) != "AWS::ApiGatewayV2::Authorizer" or not stack.exists(authorizer):
        return None
    props = stack.props(authorizer)
    return {**props, "function": _authorizer_function(stack, props.get("AuthorizerUri"))}


def connect_authorization_problems(stack: Stack, route: dict) -> list[str]:
    """$connect: AWS_IAM without JSON Web Tokens; with them, CUSTOM with a REQUEST authorizer of the same
    API, without an identity source (the token may come as the `token` query parameter or as the
    Authorization header), invoking the authorizer function."""
    if not jwt_enabled(stack):
        if route.get("AuthorizationType") != "AWS_IAM":
            return [f"WebSocket $connect: authorization {route.get('AuthorizationType')!r}, not AWS_IAM (JwtIssuer empty)"]
        return []
    if route.get("AuthorizationType") != "CUSTOM":
        return [f"WebSocket $connect: authorization {route.get('AuthorizationType')!r}, not CUSTOM (JwtIssuer set)"]
    authorizer = websocket_authorizer(stack, route)
    if authorizer is None:
        return [f"WebSocket $connect: AuthorizerId {route.get('AuthorizerId')!r} is no WebSocket authorizer of the template"]
    problems = []
    if authorizer.get("AuthorizerType") != "REQUEST":
        problems.append(f"WebSocket $connect: its authorizer is {authorizer.get('AuthorizerType')!r}, not REQUEST")
    if as_list(authorizer.get("IdentitySource")):
        problems.append(
            f"WebSocket $connect: its authorizer has the identity source {authorizer.get('IdentitySource')!r}: a token "
            "given the other way (the `token` query parameter or the Authorization header) would be refused unasked"
        )
    if authorizer.get("ApiId") != route.get("ApiId"):
        problems.append(f"WebSocket $connect: its authorizer is on the API {authorizer.get('ApiId')!r}, not {route.get('ApiId')!r}")
    authorizers = functions_of(stack, AUTHORIZER_BINARY)
    if authorizer["function"] not in authorizers:
        problems.append(f"WebSocket $connect: its authorizer invokes {authorizer['function']!r}, not the authorizer function {authorizers}")
    return problems


def check_apis(stack: Stack) -> list[str]:
    """REST: POST /transactions, GET /transactions/{id} and a held transaction's POST
    /transactions/{id}/commit and /abort reach the coordinator, every method but the preflight is
    IAM-authorized, or, when JwtIssuer is set, authorized by the authorizer function (REQUEST, the
    Authorization header, TTL 0). WebSocket: the four routes, $connect authorized (AWS_IAM, or the
    authorizer function when JwtIssuer is set), routed by `action`, integrated with the connections
    function."""
    problems = []
    coordinators = ["${%s.Arn}" % f for f in functions_of(stack, "coordinator")]
    methods = rest_methods(stack)
    for route in COORDINATOR_ROUTES:
        method = methods.get(route)
        if method is None:
            problems.append(f"REST route {route[0]} {route[1]} is missing")
        elif not any(c in method["uri"] for c in coordinators):
            problems.append(f"REST route {route[0]} {route[1]} does not reach the coordinator: {method['uri']}")
    for (verb, path), method in methods.items():
        if verb != "OPTIONS":
            problems += rest_authorization_problems(stack, f"REST {verb} {path}", method)
    routes = {str(stack.props(r).get("RouteKey")): stack.props(r) for r in stack.resources("AWS::ApiGatewayV2::Route")}
    for key in ["$connect", "$disconnect", "subscribe", "unsubscribe"]:
        if key not in routes:
            problems.append(f"WebSocket route {key} is missing")
    if "$connect" in routes:
        problems += connect_authorization_problems(stack, routes["$connect"])
    connections = ["${%s.Arn}" % f for f in functions_of(stack, "connections")]
    for key, route in routes.items():
        integration = str(route.get("Target", "")).removeprefix("integrations/")
        uri = str(stack.props(ref_id(integration)).get("IntegrationUri")) if ref_id(integration) else ""
        if not any(c in uri for c in connections):
            problems.append(f"WebSocket route {key} does not reach the connections function")
    for name in stack.resources("AWS::ApiGatewayV2::Api"):
        if stack.props(name).get("RouteSelectionExpression") != "$request.body.action":
            problems.append(f"{name}: route selection is not $request.body.action")
    return problems


def check_lake(stack: Stack) -> list[str]:
    """One DirectPut delivery stream, encrypted, partitioned by date and hour, errors apart."""
    problems = []
    streams = stack.resources("AWS::KinesisFirehose::DeliveryStream")
    if len(streams) != 1:
        problems.append(f"expected one delivery stream, found {sorted(streams)}")
    for name in streams:
        props = stack.props(name)
        s3 = props.get("ExtendedS3DestinationConfiguration", {})
        if props.get("DeliveryStreamType") != "DirectPut":
            problems.append(f"{name}: not DirectPut")
        prefix = str(s3.get("Prefix"))
        if "!{timestamp:yyyy}" not in prefix or "!{timestamp:HH}" not in prefix:
            problems.append(f"{name}: prefix {prefix!r} is not partitioned by date and hour")
        if "!{firehose:error-output-type}" not in str(s3.get("ErrorOutputPrefix")):
            problems.append(f"{name}: no ErrorOutputPrefix with the error type")
        if not props.get("DeliveryStreamEncryptionConfigurationInput"):
            problems.append(f"{name}: not encrypted at rest")
        bucket = att_id(s3.get("BucketARN"), "Arn")
        if bucket is None or stack.kind(bucket) != "AWS::S3::Bucket":
            problems.append(f"{name}: does not deliver to a bucket of the template")
    return problems


def check_schedule(stack: Stack) -> list[str]:
    """The sweeper runs every minute: an enabled rule targets it, and may invoke it."""
    problems = []
    for sweeper in functions_of(stack, "sweeper"):
        rules = [
            rule
            for rule in stack.resources("AWS::Events::Rule")
            if any(function_target(stack, t.get("Arn")) == sweeper for t in as_list(stack.props(rule).get("Targets")))
        ]
        schedules = [stack.props(r).get("ScheduleExpression") for r in rules]
        if schedules != ["rate(1 minute)"]:
            problems.append(f"{sweeper}: schedules {schedules}, expected [rate(1 minute)]")
        for rule in rules:
            if stack.props(rule).get("State", "ENABLED") != "ENABLED":
                problems.append(f"{rule}: not ENABLED")
            permitted = [
                p
                for p in stack.resources("AWS::Lambda::Permission")
                if function_target(stack, stack.props(p).get("FunctionName")) == sweeper
                and stack.props(p).get("Principal") == "events.amazonaws.com"
                and stack.props(p).get("SourceArn") == "${%s.Arn}" % rule
            ]
            if not permitted:
                problems.append(f"{rule}: no permission for EventBridge to invoke {sweeper}")
    return problems
