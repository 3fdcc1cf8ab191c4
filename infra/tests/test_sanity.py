"""3. Sanity: arm64 Rust functions built by cargo-lambda; stream event sources that cannot block a
shard forever; private, encrypted storage; IAM-authorized APIs; the lake, the schedule, the alarms."""

from __future__ import annotations

import pytest

from template_checks import (
    check_alarms,
    check_apis,
    check_event_sources,
    check_functions,
    check_lake,
    check_schedule,
    check_storage,
    transform,
)


def test_functions(raw, transformed, contract):
    assert check_functions(raw, transformed, contract["maxTransactionTimeoutMs"]) == []


def test_stream_event_sources(raw, transformed):
    assert check_event_sources(raw, transformed) == []


def test_storage(transformed):
    assert check_storage(transformed) == []


def test_apis(raw):
    assert check_apis(raw) == []


def test_lake(transformed):
    assert check_lake(transformed) == []


def test_schedule(raw):
    assert check_schedule(raw) == []


def test_alarms(transformed):
    assert check_alarms(transformed) == []


# --- the checks can fail ----------------------------------------------------------------------


def _event(raw, name):
    return raw["Resources"]["StreamProcessorFunction"]["Properties"]["Events"][name]["Properties"]


@pytest.mark.parametrize("breakage", ["x86", "runtime", "build-method", "log-format", "coordinator-timeout"])
def test_function_check_catches(breakage, raw, contract):
    if breakage == "x86":
        raw["Resources"]["ParticipantBFunction"]["Properties"]["Architectures"] = ["x86_64"]
    elif breakage == "runtime":
        raw["Globals"]["Function"]["Runtime"] = "provided.al2"
    elif breakage == "build-method":
        raw["Resources"]["SweeperFunction"]["Metadata"]["BuildMethod"] = "makefile"
    elif breakage == "log-format":
        raw["Globals"]["Function"]["LoggingConfig"]["LogFormat"] = "Text"
    elif breakage == "coordinator-timeout":
        # no longer than the longest transaction the coordinator accepts
        raw["Resources"]["CoordinatorFunction"]["Properties"]["Timeout"] = contract["maxTransactionTimeoutMs"] // 1000
    assert check_functions(raw, transform(raw), contract["maxTransactionTimeoutMs"]) != []


@pytest.mark.parametrize(
    "breakage", ["no-bisect", "unbounded-retries", "no-max-age", "no-partial-failures", "no-destination", "missing-table"]
)
def test_event_source_check_catches(breakage, raw):
    if breakage == "no-bisect":
        del _event(raw, "ServiceAStream")["BisectBatchOnFunctionError"]
    elif breakage == "unbounded-retries":
        _event(raw, "TransactionsStream")["MaximumRetryAttempts"] = -1
    elif breakage == "no-max-age":
        del _event(raw, "ServiceBStream")["MaximumRecordAgeInSeconds"]
    elif breakage == "no-partial-failures":
        _event(raw, "ServiceBStream")["FunctionResponseTypes"] = []
    elif breakage == "no-destination":
        del _event(raw, "ServiceAStream")["DestinationConfig"]
    elif breakage == "missing-table":
        del raw["Resources"]["StreamProcessorFunction"]["Properties"]["Events"]["TransactionsStream"]
    assert check_event_sources(raw, transform(raw)) != []


@pytest.mark.parametrize("breakage", ["public", "unencrypted-bucket", "no-tls-policy", "no-pitr", "queue"])
def test_storage_check_catches(breakage, raw):
    resources = raw["Resources"]
    if breakage == "public":
        resources["LakeBucket"]["Properties"]["PublicAccessBlockConfiguration"]["RestrictPublicBuckets"] = False
    elif breakage == "unencrypted-bucket":
        del resources["LakeBucket"]["Properties"]["BucketEncryption"]
    elif breakage == "no-tls-policy":
        del resources["LakeBucketPolicy"]
    elif breakage == "no-pitr":
        del resources["ConnectionsTable"]["Properties"]["PointInTimeRecoverySpecification"]
    elif breakage == "queue":
        del resources["StreamFailureQueue"]["Properties"]["SqsManagedSseEnabled"]
    assert check_storage(transform(raw)) != []


def test_api_check_catches_an_open_connect_route(raw):
    raw["Resources"]["ConnectRoute"]["Properties"]["AuthorizationType"] = "NONE"
    assert check_apis(raw) != []


def test_api_check_catches_an_unauthenticated_rest_api(raw):
    del raw["Resources"]["RestApi"]["Properties"]["Auth"]
    assert check_apis(raw) != []


def test_lake_check_catches_an_unpartitioned_prefix(raw):
    raw["Resources"]["LakeDeliveryStream"]["Properties"]["ExtendedS3DestinationConfiguration"]["Prefix"] = "data/"
    assert check_lake(transform(raw)) != []
