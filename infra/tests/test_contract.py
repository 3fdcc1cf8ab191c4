"""1. Each deployed template's tables and function environments match what the code uses.

The code's side comes from `cargo run -q -p twopc --example contract` (functions/twopc/examples/
contract.rs), which prints `twopc::tables` and `twopc::config::FUNCTION_ENVIRONMENT` as JSON. Every
test runs on the SAM template (after the transform) and on the CDK template."""

from __future__ import annotations

import copy

import pytest

import breaking as b
from system import participant_deployments
from template_checks import check_environment, check_tables, telemetry_names, with_source_facts


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
        "sweeper",
        "stream-processor",
        "connections",
    }


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


def _registry(stack, targets: list) -> dict:
    """A PARTICIPANTS value naming, for each service in order, the given target."""
    parts: list = ["{"]
    for index, (service, target) in enumerate(zip(sorted(participant_deployments(stack)), targets)):
        parts += [("" if index == 0 else ", ") + f'"{service}": "', target, '"']
    return b.join(*parts, "}")


def _break_environment(stack, breakage: str) -> None:
    first, second = b.participant(stack, 0), b.participant(stack, 1)
    if breakage == "missing-variable":
        # Only one of the two participant deployments loses it: each deployment is checked.
        del b.props(stack, second["function"])["Environment"]["Variables"]["DATA_TABLE_NAME"]
    elif breakage == "unknown-variable":
        b.variables(stack, "connections")["CONNECTION_TABLE"] = "connections"
    elif breakage == "rust-log":
        b.variables(stack, "coordinator")["RUST_LOG"] = "debug"
    elif breakage == "registry":
        # The coordinator's registry names the first participant's alias for both services.
        b.variables(stack, "coordinator")["PARTICIPANTS"] = _registry(stack, [b.ref(first["alias"])] * 2)
    elif breakage == "registry-not-alias":
        # The sweeper's registry names the functions, not their `live` aliases.
        b.variables(stack, "sweeper")["PARTICIPANTS"] = _registry(
            stack, [b.getatt(first["function"], "Arn"), b.getatt(second["function"], "Arn")]
        )
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
    ],
)
def test_environment_check_catches(breakage, stack):
    _break_environment(stack, breakage)
    assert check_environment(stack) != []
