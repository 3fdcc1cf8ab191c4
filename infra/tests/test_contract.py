"""1. Each deployed template's tables and function environments match what the code uses.

The code's side comes from `cargo run -q -p twopc --example contract` (functions/twopc/examples/
contract.rs), which prints `twopc::tables` and `twopc::environment::FUNCTION_ENVIRONMENT` as JSON. Every
test runs on the SAM template (after the transform) and on the CDK template. A variable a binary reads
through a reader of twopc (the coordinator's `hold::policy_from_env()`: HOLD_POLICY and
MAX_HOLD_MS) is part of its environment even before FUNCTION_ENVIRONMENT lists it (with a warning). The coordinator's
SERVICE_OPERATIONS (the services' own operation schemas) is infra/service-operations.json, and names
only registered services that run a participant of their own (the example inventory; the example
payments, a resource participant, whose operations are a resource's)."""

from __future__ import annotations

import copy
import json

import pytest

import breaking as b
from system import CDK_BINARY_METADATA, participant_binaries, participant_deployments, resource_binaries
from template_checks import (
    SERVICE_OPERATIONS_FILE,
    check_environment,
    check_service_operations,
    check_tables,
    service_operations_file,
    telemetry_names,
    with_source_facts,
)


def test_contract_lists_the_expected_tables(contract):
    assert sorted(t["name"] for t in contract["tables"]) == [
        "connections",
        "service-a-data",
        "service-b-data",
        "transactions",
    ]
    assert set(contract["functionEnvironment"]) == {
        "coordinator",
        "participant",
        "inventory",
        "payments",
        "sweeper",
        "stream-processor",
        # the transactions stream's second reader: one EventBridge event per outcome
        "outcomes",
        "connections",
        # the JWT authorizer, deployed only when JwtIssuer is set
        "authorizer",
    }


def test_the_participant_binaries_are_the_generic_one_the_inventory_and_the_payments(stack):
    # All are built on the participant library and read its variables; the inventory is told apart
    # by the code its function runs (SAM's build metadata, CDK's twopc:binary), the payments also by
    # its PAYMENT_API_URL. The payments drives a resource (its main calls with_resource).
    assert participant_binaries(stack) == ["participant", "inventory", "payments"]
    assert resource_binaries(stack) == ["payments"]
    deployments = participant_deployments(stack)
    assert {service: (d["binary"], d["resource"]) for service, d in deployments.items()} == {
        "service-a": ("participant", False),
        "service-b": ("participant", False),
        "inventory": ("inventory", False),
        "payments": ("payments", True),
    }
    assert deployments["inventory"]["table"] == "inventory-data"
    assert deployments["payments"]["table"] == "payments-data"


def test_a_binary_that_writes_metrics_must_list_the_namespace(tmp_path):
    # Its main installs the metrics recorder from its environment (telemetry::install_emf_from_env):
    # the contract must list METRICS_NAMESPACE among its variables, and print every metric list.
    for binary, main in [("writer", "telemetry::install_emf_from_env(Zeros::Omitted);"), ("quiet", "")]:
        (tmp_path / binary / "src").mkdir(parents=True)
        (tmp_path / binary / "src" / "main.rs").write_text(f"fn main() {{ {main} }}\n")
    listed = {"functionEnvironment": {"writer": ["METRICS_NAMESPACE"], "quiet": ["Y"]}, "metrics": telemetry_names()}
    assert with_source_facts(listed, tmp_path) == listed
    unlisted = {"functionEnvironment": {"writer": ["X"], "quiet": ["Y"]}, "metrics": telemetry_names()}
    with pytest.raises(AssertionError, match="does not list"):
        with_source_facts(unlisted, tmp_path)
    unprinted = {k: v for k, v in telemetry_names().items() if k != "streamProcessorCounts"}
    with pytest.raises(AssertionError, match="prints no metrics.streamProcessorCounts"):
        with_source_facts({**listed, "metrics": unprinted}, tmp_path)
    with pytest.raises(AssertionError):
        with_source_facts({**listed, "metrics": {**telemetry_names(), "sweeperCounts": ["StuckTransactions"]}}, tmp_path)


def test_a_variable_read_through_a_reader_is_part_of_the_environment(tmp_path):
    # A reader of twopc named by a binary's sources (hold::policy_from_env()) reads its variables:
    # the contract gets them, with a warning while FUNCTION_ENVIRONMENT does not list them. A function
    # that reads the variable its caller names (required(name)) adds nothing: the caller names it.
    config = tmp_path / "config.rs"
    config.write_text(
        'pub const HOLDS: &str = "HOLDS";\npub const LIMIT: &str = "LIMIT";\npub const OTHER: &str = "OTHER";\n'
        "pub fn holds(\n    x: u8,\n) -> Option<String> {\n    let _ = std::env::var(LIMIT);\n"
        "    std::env::var(HOLDS).ok()\n}\n\n"
        "pub fn required(name: &'static str) -> String {\n    std::env::var(name).unwrap()\n}\n"
    )
    functions_dir = tmp_path / "functions"
    for binary, source in [("reader", "let h = config::holds(1);"), ("other", "let o = config::required(config::OTHER);")]:
        (functions_dir / binary / "src").mkdir(parents=True)
        (functions_dir / binary / "src" / "lib.rs").write_text(f"fn run() {{ {source} }}\n")
    listed = {"functionEnvironment": {"reader": ["HOLDS", "LIMIT"], "other": ["OTHER"]}, "metrics": telemetry_names()}
    assert with_source_facts(copy.deepcopy(listed), functions_dir, config) == listed
    unlisted = {"functionEnvironment": {"reader": ["X"], "other": ["OTHER"]}, "metrics": telemetry_names()}
    with pytest.warns(UserWarning, match="reader reads"):
        completed = with_source_facts(unlisted, functions_dir, config)
    assert completed["functionEnvironment"] == {"reader": ["X", "HOLDS", "LIMIT"], "other": ["OTHER"]}


def test_only_the_coordinator_reads_the_hold_policy(contract):
    environment = contract["functionEnvironment"]
    assert {"HOLD_POLICY", "MAX_HOLD_MS"} <= set(environment["coordinator"])
    assert [b for b, names in environment.items() if b != "coordinator" and {"HOLD_POLICY", "MAX_HOLD_MS"} & set(names)] == []


def test_tables_match_the_code(stack):
    assert check_tables(stack) == []


def test_environment_matches_the_code(stack):
    assert check_environment(stack) == []


# --- the checks can fail ----------------------------------------------------------------------


def _table(stack, name: str) -> dict:
    return b.props(stack, b.table(stack, name))


def _break_table(stack, breakage: str) -> None:
    if breakage == "projection":
        _table(stack, "transactions")["GlobalSecondaryIndexes"][0]["Projection"]["ProjectionType"] = "ALL"
    elif breakage == "index-name":
        _table(stack, "service-a-data")["GlobalSecondaryIndexes"][0]["IndexName"] = "locks"
    elif breakage == "range-key-type":
        for definition in _table(stack, "service-b-data")["AttributeDefinitions"]:
            if definition["AttributeName"] == "lockExpiresAt":
                definition["AttributeType"] = "S"
    elif breakage == "stream-view":
        _table(stack, "service-a-data")["StreamSpecification"]["StreamViewType"] = "NEW_IMAGE"
    elif breakage == "no-stream":
        del _table(stack, "transactions")["StreamSpecification"]
    elif breakage == "ttl":
        del _table(stack, "connections")["TimeToLiveSpecification"]
    elif breakage == "table-name":
        _table(stack, "service-a-data")["TableName"] = "service-a"
    elif breakage == "extra-table":
        extra = copy.deepcopy(b.resource(stack, b.table(stack, "service-a-data")))
        extra["Properties"]["TableName"] = "extra"
        stack.template["Resources"]["Extra"] = extra


@pytest.mark.parametrize(
    "breakage",
    ["projection", "index-name", "range-key-type", "stream-view", "no-stream", "ttl", "table-name", "extra-table"],
)
def test_table_check_catches(breakage, stack):
    _break_table(stack, breakage)
    assert check_tables(stack) != []


def _registry(stack, targets: dict) -> dict:
    """A PARTICIPANTS value naming, for each service, the given target (its own `live` alias when not
    given)."""
    parts: list = ["{"]
    for index, (service, deployment) in enumerate(sorted(participant_deployments(stack).items())):
        target = targets.get(service, b.ref(deployment["alias"]))
        parts += [("" if index == 0 else ", ") + f'"{service}": "', target, '"']
    return b.join(*parts, "}")


def _break_environment(stack, breakage: str) -> None:
    first, second = b.participant(stack, 0), b.participant(stack, 1)
    services = sorted(participant_deployments(stack))
    if breakage == "missing-variable":
        # Only one of the two participant deployments loses it: each deployment is checked.
        del b.props(stack, second["function"])["Environment"]["Variables"]["DATA_TABLE_NAME"]
    elif breakage == "unknown-variable":
        b.variables(stack, "connections")["CONNECTION_TABLE"] = "connections"
    elif breakage == "rust-log":
        b.variables(stack, "coordinator")["RUST_LOG"] = "debug"
    elif breakage == "registry":
        # The coordinator's registry names the first participant's alias for the second service too.
        b.variables(stack, "coordinator")["PARTICIPANTS"] = _registry(stack, {services[1]: b.ref(first["alias"])})
    elif breakage == "registry-not-alias":
        # The sweeper's registry names the functions, not their `live` aliases.
        b.variables(stack, "sweeper")["PARTICIPANTS"] = _registry(
            stack, {services[0]: b.getatt(first["function"], "Arn"), services[1]: b.getatt(second["function"], "Arn")}
        )
    elif breakage == "registry-misses-the-inventory":
        # The sweeper's registry leaves out a service deployed with its own participant.
        b.variables(stack, "sweeper")["PARTICIPANTS"] = _registry_without(stack, "inventory")
    elif breakage == "inventory-without-its-table":
        # The inventory's function serves no table of the template.
        b.variables_of(stack, participant_deployments(stack)["inventory"]["function"])["DATA_TABLE_NAME"] = "inventory"
    elif breakage == "inventory-runs-nothing-known":
        # The inventory's function names no binary: its environment is both participants'.
        _undeclare_binary(stack, participant_deployments(stack)["inventory"]["function"])
    elif breakage == "registry-misses-the-payments":
        # The sweeper's registry leaves out the resource participant: a capture that failed is never retried.
        b.variables(stack, "sweeper")["PARTICIPANTS"] = _registry_without(stack, "payments")
    elif breakage == "coordinator-registry-misses-the-payments":
        b.variables(stack, "coordinator")["PARTICIPANTS"] = _registry_without(stack, "payments")
    elif breakage == "participant-tables-miss-the-payments":
        # The sweeper never looks for the payments' barrier entries that are due.
        tables = b.variables(stack, "sweeper")["PARTICIPANT_TABLES"]
        for entry in [', "payments": "${ServicePayments}"', ', "payments": "${ServicePaymentsTable}"']:
            tables = b.replace_in_strings(tables, entry, "")
        assert tables != b.variables(stack, "sweeper")["PARTICIPANT_TABLES"], "no payments entry found"
        b.variables(stack, "sweeper")["PARTICIPANT_TABLES"] = tables
    elif breakage == "payments-without-its-api-url":
        del b.variables_of(stack, participant_deployments(stack)["payments"]["function"])["PAYMENT_API_URL"]
    elif breakage == "payment-api-url-on-the-inventory":
        b.variables_of(stack, participant_deployments(stack)["inventory"]["function"])["PAYMENT_API_URL"] = b.ref("PaymentApiUrl")
    elif breakage == "payments-runs-the-generic-participant":
        # The payments' environment, the generic participant's code: it knows no charge.
        _declare_binary(stack, participant_deployments(stack)["payments"]["function"], "participant")
    elif breakage == "payments-runs-the-inventory":
        _declare_binary(stack, participant_deployments(stack)["payments"]["function"], "inventory")
    elif breakage == "participant-tables":
        b.variables(stack, "stream-processor")["PARTICIPANT_TABLES"] = '{"service-a": "service-a-data"}'
    elif breakage == "metrics-namespace":
        b.variables(stack, "sweeper")["METRICS_NAMESPACE"] = "TwoPhaseCommit"
    elif breakage == "firehose-stream":
        b.variables(stack, "stream-processor")["FIREHOSE_STREAM_NAME"] = "lake"
    elif breakage == "stream-processor-metrics-namespace-missing":
        # Its UnprocessableRecords would go to the code's default namespace, which no alarm watches.
        del b.variables(stack, "stream-processor")["METRICS_NAMESPACE"]
    elif breakage == "stream-processor-metrics-namespace":
        b.variables(stack, "stream-processor")["METRICS_NAMESPACE"] = "TwoPhaseCommit"
    elif breakage == "hold-policy-missing":
        # The coordinator would accept holds of up to 15 minutes from every service, whatever the policy.
        del b.variables(stack, "coordinator")["HOLD_POLICY"]
    elif breakage == "max-hold-missing":
        del b.variables(stack, "coordinator")["MAX_HOLD_MS"]
    elif breakage == "hold-policy-on-the-sweeper":
        b.variables(stack, "sweeper")["HOLD_POLICY"] = "{}"


@pytest.mark.parametrize(
    "breakage",
    [
        "missing-variable",
        "unknown-variable",
        "rust-log",
        "registry",
        "registry-not-alias",
        "participant-tables",
        "metrics-namespace",
        "firehose-stream",
        "stream-processor-metrics-namespace-missing",
        "stream-processor-metrics-namespace",
        "registry-misses-the-inventory",
        "inventory-without-its-table",
        "inventory-runs-nothing-known",
        "registry-misses-the-payments",
        "coordinator-registry-misses-the-payments",
        "participant-tables-miss-the-payments",
        "payments-without-its-api-url",
        "payment-api-url-on-the-inventory",
        "payments-runs-the-generic-participant",
        "payments-runs-the-inventory",
        "hold-policy-missing",
        "max-hold-missing",
        "hold-policy-on-the-sweeper",
    ],
)
def test_environment_check_catches(breakage, stack):
    _break_environment(stack, breakage)
    assert check_environment(stack) != []


def _registry_without(stack, left_out: str) -> dict:
    """A PARTICIPANTS value naming every service's `live` alias but `left_out`'s."""
    parts: list = ["{"]
    kept = [(s, d) for s, d in sorted(participant_deployments(stack).items()) if s != left_out]
    for index, (service, deployment) in enumerate(kept):
        parts += [("" if index == 0 else ", ") + f'"{service}": "', b.ref(deployment["alias"]), '"']
    return b.join(*parts, "}")


def _undeclare_binary(stack, function: str) -> None:
    """Removes what names the binary a function's code is built from (SAM's BuildProperties, CDK's
    twopc:binary)."""
    metadata = b.resource(stack, function).get("Metadata", {})
    metadata.pop("BuildProperties", None)
    metadata.pop(CDK_BINARY_METADATA, None)


def _declare_binary(stack, function: str, binary: str) -> None:
    """Names another binary for a function's code (SAM's BuildProperties.Binary, CDK's twopc:binary)."""
    metadata = b.resource(stack, function).setdefault("Metadata", {})
    if "BuildProperties" in metadata:
        metadata["BuildProperties"]["Binary"] = binary
    else:
        metadata[CDK_BINARY_METADATA] = binary


# --- SERVICE_OPERATIONS: the services' own operations, as infra/service-operations.json ----------


def test_the_service_operations_file_names_the_inventory_and_the_payments():
    operations = service_operations_file()
    assert sorted(operations) == ["inventory", "payments"]
    assert sorted(schema["op"] for schema in operations["inventory"]) == ["release", "reserve"]
    assert not any(schema.get("resource") for schema in operations["inventory"])
    # The payments' charge is a resource's (authorize, capture, void): never committed in one phase.
    assert [(schema["op"], schema.get("resource")) for schema in operations["payments"]] == [("charge", True)]


def test_service_operations_are_the_file(stack):
    assert check_service_operations(stack) == []


def test_sam_inlines_the_service_operations_compact(raw):
    # One line of compact JSON (what CDK writes too): the file's content, nothing else.
    value = raw["Resources"]["CoordinatorFunction"]["Properties"]["Environment"]["Variables"]["SERVICE_OPERATIONS"]
    assert value == json.dumps(service_operations_file(), separators=(",", ":"))


def test_cdk_reads_the_service_operations_file_compact(cdk):
    coordinator = b.function(cdk, "coordinator")
    value = b.variables_of(cdk, coordinator)["SERVICE_OPERATIONS"]
    assert value == json.dumps(json.loads(SERVICE_OPERATIONS_FILE.read_text()), separators=(",", ":"))


def _operations(stack) -> dict:
    return json.loads(b.variables(stack, "coordinator")["SERVICE_OPERATIONS"])


def _set_operations(stack, operations) -> None:
    b.variables(stack, "coordinator")["SERVICE_OPERATIONS"] = (
        operations if isinstance(operations, str) else json.dumps(operations, separators=(",", ":"))
    )


def _break_service_operations(stack, breakage: str) -> None:
    if breakage == "missing":
        del b.variables(stack, "coordinator")["SERVICE_OPERATIONS"]
    elif breakage == "not-json":
        _set_operations(stack, "inventory: reserve, release")
    elif breakage == "empty":
        # The coordinator would refuse every reserve and release as an unknown operation.
        _set_operations(stack, {})
    elif breakage == "a-schema-changed":
        # The file changed and the template was not redeployed with it (or the other way round).
        operations = _operations(stack)
        operations["inventory"][0]["fields"]["quantity"]["minimum"] = 0
        _set_operations(stack, operations)
    elif breakage == "an-operation-left-out":
        operations = _operations(stack)
        operations["inventory"] = operations["inventory"][:1]
        _set_operations(stack, operations)
    elif breakage == "service-not-registered":
        # The coordinator's PARTICIPANTS leaves the inventory out: it refuses to start.
        b.variables(stack, "coordinator")["PARTICIPANTS"] = _registry_without(stack, "inventory")
    elif breakage == "service-runs-the-generic-participant":
        # The inventory's function runs the generic participant, which knows neither reserve nor release.
        _declare_binary(stack, participant_deployments(stack)["inventory"]["function"], "participant")
    elif breakage == "payments-not-registered":
        # The coordinator's PARTICIPANTS leaves the payments out: it refuses to start.
        b.variables(stack, "coordinator")["PARTICIPANTS"] = _registry_without(stack, "payments")
    elif breakage == "payments-charge-left-out":
        operations = _operations(stack)
        del operations["payments"]
        _set_operations(stack, operations)
    elif breakage == "payments-charge-not-a-resource":
        # Without "resource": the coordinator would commit a charge alone in one phase, which the
        # payments refuses unapplied.
        operations = _operations(stack)
        del operations["payments"][0]["resource"]
        _set_operations(stack, operations)


SERVICE_OPERATIONS_BREAKAGES = [
    "missing",
    "not-json",
    "empty",
    "a-schema-changed",
    "an-operation-left-out",
    "service-not-registered",
    "service-runs-the-generic-participant",
    "payments-not-registered",
    "payments-charge-left-out",
    "payments-charge-not-a-resource",
]


@pytest.mark.parametrize("breakage", SERVICE_OPERATIONS_BREAKAGES)
def test_service_operations_check_catches(breakage, stack):
    _break_service_operations(stack, breakage)
    assert check_service_operations(stack) != []


@pytest.mark.parametrize("service,other", [("inventory", "payments"), ("payments", "inventory")])
def test_service_operations_check_catches_resource_operations_of_the_wrong_participant(stack, service, other):
    # The file and the template agree, yet the inventory's operations are marked a resource's (its
    # participant drives none), or the payments' are not (its participant drives one).
    operations = _operations(stack)
    for schema in operations[service]:
        schema["resource"] = service == "inventory"
        if service == "payments":
            del schema["resource"]
    _set_operations(stack, operations)
    problems = check_service_operations(stack, expected=operations)
    assert problems and all(repr(service) in p and other not in p for p in problems), problems


def test_service_operations_check_catches_a_service_outside_the_registry(stack):
    # The same schemas under a service nobody registered: the file and the template agree, yet the
    # coordinator would refuse to start.
    operations = {**_operations(stack), "warehouse": _operations(stack)["inventory"]}
    _set_operations(stack, operations)
    problems = check_service_operations(stack, expected=operations)
    assert problems and all("warehouse" in p for p in problems), problems
