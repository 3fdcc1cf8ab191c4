"""1. The template's tables and function environments match what the code uses.

The code's side comes from `cargo run -q -p twopc --example contract` (functions/twopc/examples/
contract.rs), which prints `twopc::tables` and `twopc::config::FUNCTION_ENVIRONMENT` as JSON."""

from __future__ import annotations

import copy

import pytest

from template_checks import check_environment, check_tables, transform


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


def test_tables_match_the_code(raw, contract):
    assert check_tables(raw, contract) == []


def test_environment_matches_the_code(raw, transformed, contract):
    assert check_environment(raw, transformed, contract) == []


# --- the checks can fail ----------------------------------------------------------------------


def _table_props(template: dict, logical_id: str) -> dict:
    return template["Resources"][logical_id]["Properties"]


@pytest.mark.parametrize(
    "breakage",
    [
        "projection",
        "index-name",
        "range-key-type",
        "stream-view",
        "no-stream",
        "ttl",
        "table-name",
        "extra-table",
    ],
)
def test_table_check_catches(breakage, raw, contract):
    if breakage == "projection":
        _table_props(raw, "TransactionsTable")["GlobalSecondaryIndexes"][0]["Projection"]["ProjectionType"] = "ALL"
    elif breakage == "index-name":
        _table_props(raw, "ServiceATable")["GlobalSecondaryIndexes"][0]["IndexName"] = "locks"
    elif breakage == "range-key-type":
        for definition in _table_props(raw, "ServiceBTable")["AttributeDefinitions"]:
            if definition["AttributeName"] == "lockExpiresAt":
                definition["AttributeType"] = "S"
    elif breakage == "stream-view":
        _table_props(raw, "ServiceATable")["StreamSpecification"]["StreamViewType"] = "NEW_IMAGE"
    elif breakage == "no-stream":
        del _table_props(raw, "TransactionsTable")["StreamSpecification"]
    elif breakage == "ttl":
        del _table_props(raw, "ConnectionsTable")["TimeToLiveSpecification"]
    elif breakage == "table-name":
        raw["Parameters"]["ServiceATableName"]["Default"] = "service-a"
    elif breakage == "extra-table":
        raw["Resources"]["Extra"] = copy.deepcopy(raw["Resources"]["ServiceATable"])
        raw["Resources"]["Extra"]["Properties"]["TableName"] = "extra"
    assert check_tables(raw, contract) != []


@pytest.mark.parametrize("breakage", ["missing-variable", "unknown-variable", "registry", "participant-tables"])
def test_environment_check_catches(breakage, raw, contract):
    variables = lambda name: raw["Resources"][name]["Properties"]["Environment"]["Variables"]  # noqa: E731
    if breakage == "missing-variable":
        # Only one of the two participant deployments loses it: each deployment is checked.
        del variables("ParticipantBFunction")["DATA_TABLE_NAME"]
    elif breakage == "unknown-variable":
        variables("ConnectionsFunction")["CONNECTION_TABLE"] = "connections"
    elif breakage == "registry":
        # The coordinator's registry names participant A's function for service-b.
        variables("CoordinatorFunction")["PARTICIPANTS"] = {
            "Fn::Sub": '{"${ServiceAName}": "${ParticipantAFunction.Arn}", "${ServiceBName}": "${ParticipantAFunction.Arn}"}'
        }
    elif breakage == "participant-tables":
        variables("StreamProcessorFunction")["PARTICIPANT_TABLES"] = {"Fn::Sub": '{"${ServiceAName}": "${ServiceATable}"}'}
    assert check_environment(raw, transform(raw), contract) != []
