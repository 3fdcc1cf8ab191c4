"""3. Sanity, on both deployed templates: arm64 Rust functions on provided.al2023; stream event
sources that cannot block a shard forever; private, encrypted storage; IAM-authorized APIs routed to
the right functions; the lake; the sweeper's schedule."""

from __future__ import annotations

import copy

import pytest

import breaking as b
from template_checks import (
    check_apis,
    check_event_sources,
    check_functions,
    check_lake,
    check_schedule,
    check_storage,
)


def test_functions(stack):
    assert check_functions(stack) == []


def test_stream_event_sources(stack):
    assert check_event_sources(stack) == []


def test_storage(stack):
    assert check_storage(stack) == []


def test_apis(stack):
    assert check_apis(stack) == []


def test_lake(stack):
    assert check_lake(stack) == []


def test_schedule(stack):
    assert check_schedule(stack) == []


# --- the checks can fail ----------------------------------------------------------------------


@pytest.mark.parametrize("breakage", ["x86", "runtime", "handler", "coordinator-timeout", "coordinator-timeout-after-answer"])
def test_function_check_catches(breakage, stack):
    if breakage == "x86":
        b.props(stack, b.participant(stack, 1)["function"])["Architectures"] = ["x86_64"]
    elif breakage == "runtime":
        b.props(stack, b.function(stack, "sweeper"))["Runtime"] = "provided.al2"
    elif breakage == "handler":
        b.props(stack, b.function(stack, "connections"))["Handler"] = "index.handler"
    elif breakage == "coordinator-timeout":
        # no longer than the longest transaction the coordinator accepts
        b.props(stack, b.function(stack, "coordinator"))["Timeout"] = stack.code["maxTransactionTimeoutMs"] // 1000
    elif breakage == "coordinator-timeout-after-answer":
        # long enough to prepare, too short for an answer on the decision and its second phase after it
        answered_s = (stack.code["answerBudgetMs"] + stack.code["afterAnswerBudgetMs"]) // 1000
        b.props(stack, b.function(stack, "coordinator"))["Timeout"] = answered_s
    assert check_functions(stack) != []


@pytest.mark.parametrize(
    "breakage",
    ["no-bisect", "retries-out-of-range", "no-max-age", "no-record-age-limit", "no-partial-failures", "no-destination", "missing-table", "foreign-source"],
)
def test_event_source_check_catches(breakage, stack):
    mapping = lambda table: b.props(stack, b.mapping_of(stack, table))  # noqa: E731
    if breakage == "no-bisect":
        del mapping("service-a-data")["BisectBatchOnFunctionError"]
    elif breakage == "retries-out-of-range":
        mapping("transactions")["MaximumRetryAttempts"] = 10001
    elif breakage == "no-record-age-limit":
        # with -1 retries: a failing batch would be retried forever (until the stream drops it)
        mapping("service-a-data")["MaximumRecordAgeInSeconds"] = -1
    elif breakage == "no-max-age":
        del mapping("service-b-data")["MaximumRecordAgeInSeconds"]
    elif breakage == "no-partial-failures":
        mapping("service-b-data")["FunctionResponseTypes"] = []
    elif breakage == "no-destination":
        del mapping("service-a-data")["DestinationConfig"]
    elif breakage == "missing-table":
        del stack.template["Resources"][b.mapping_of(stack, "transactions")]
    elif breakage == "foreign-source":
        # Another mapping, on a stream that is no table's of this template: it cannot be checked, so it
        # must not pass (here it would not bisect either).
        extra = copy.deepcopy(stack.template["Resources"][b.mapping_of(stack, "service-a-data")])
        extra["Properties"]["EventSourceArn"] = "arn:aws:dynamodb:us-east-1:123456789012:table/other/stream/x"
        del extra["Properties"]["BisectBatchOnFunctionError"]
        stack.template["Resources"]["ForeignMapping"] = extra
    assert check_event_sources(stack) != []


@pytest.mark.parametrize("breakage", ["public", "unencrypted-bucket", "no-tls-policy", "no-pitr", "queue"])
def test_storage_check_catches(breakage, stack):
    bucket = b.only(stack, "AWS::S3::Bucket")
    if breakage == "public":
        b.props(stack, bucket)["PublicAccessBlockConfiguration"]["RestrictPublicBuckets"] = False
    elif breakage == "unencrypted-bucket":
        del b.props(stack, bucket)["BucketEncryption"]
    elif breakage == "no-tls-policy":
        for policy in stack.resources("AWS::S3::BucketPolicy"):
            del stack.template["Resources"][policy]
    elif breakage == "no-pitr":
        del b.props(stack, b.table(stack, "connections"))["PointInTimeRecoverySpecification"]
    elif breakage == "queue":
        queue = b.only(stack, "AWS::SQS::Queue")
        for key in ["SqsManagedSseEnabled", "KmsMasterKeyId"]:
            b.props(stack, queue).pop(key, None)
    assert check_storage(stack) != []


def test_api_check_catches_an_open_connect_route(stack):
    for route in stack.resources("AWS::ApiGatewayV2::Route"):
        if b.props(stack, route).get("RouteKey") == "$connect":
            b.props(stack, route)["AuthorizationType"] = "NONE"
    assert check_apis(stack) != []


def test_api_check_catches_an_unauthenticated_rest_api(stack):
    b.set_rest_authorization(stack, "NONE")
    assert check_apis(stack) != []


def test_api_check_catches_a_route_to_another_function(stack):
    # The REST API's integrations reach the sweeper instead of the coordinator.
    coordinator, sweeper = b.function(stack, "coordinator"), b.function(stack, "sweeper")
    for kind in ["AWS::ApiGateway::Method", "AWS::ApiGateway::RestApi"]:
        for name in stack.resources(kind):
            stack.template["Resources"][name] = b.replace_in_strings(
                stack.template["Resources"][name], coordinator, sweeper
            )
    assert check_apis(stack) != []


@pytest.mark.parametrize("decision", ["commit", "abort"])
def test_api_check_catches_a_missing_decision_route(decision, stack):
    # POST /transactions/{id}/commit or /abort: a held transaction could not be decided.
    b.remove_rest_method(stack, "POST", decision)
    assert check_apis(stack) != []


def test_api_check_catches_an_unauthenticated_decision_route(stack):
    b.set_rest_method_authorization(stack, "POST", "commit", "NONE")
    assert check_apis(stack) != []


def test_lake_check_catches_an_unpartitioned_prefix(stack):
    stream = b.only(stack, "AWS::KinesisFirehose::DeliveryStream")
    b.props(stack, stream)["ExtendedS3DestinationConfiguration"]["Prefix"] = "data/"
    assert check_lake(stack) != []


def test_schedule_check_catches_another_rate(stack):
    for rule in stack.resources("AWS::Events::Rule"):
        b.props(stack, rule)["ScheduleExpression"] = "rate(5 minutes)"
    assert check_schedule(stack) != []
