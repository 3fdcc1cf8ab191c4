"""4. The production details, on both deployed templates: throttling on both API stages, the
alarms, the dashboard, reserved concurrency, deletion protection, the lake's compression and Athena
table, logging, tracing, the participants' `live` aliases (the deployment order), the REST
API's answers to browsers (CORS: the preflight, the gateway responses, the coordinator's origin),
the WebSocket API's answers to subscribe and unsubscribe (route responses), the connections
function's cap on topics (MaxTopicsPerConnection), and the fan-out through an outage: retries until
the stream drops a record, the alarms that fire early, the replay of the on-failure queue (and the
stream processor's own dead letters: its grant to send there, the queue's message size); the alarms
on the participants' clock skew and on the records the stream processor dead-letters itself; who may
invoke a participant: each service's message key (a secret of its own, generated, read by its
participant, the coordinator and the sweeper only, named by PARTICIPANT_KEY and PARTICIPANT_KEYS),
each participant's resource policy (the coordinator's and the sweeper's roles, nobody else), the
local development keys nowhere in a template; the resource participants (the example payments): their
resource's address from its parameter, a timeout longer than a prepare retrying until the deadline, no
VPC, their role on their own barrier entries only; held transactions: POST /transactions/{id}/commit and
/abort authorized exactly as POST /transactions and reaching the coordinator, and its HOLD_POLICY and
MAX_HOLD_MS from the HoldPolicy and MaxHoldMs parameters, on no other function."""

from __future__ import annotations

import copy
import json
import re

import pytest

import breaking as b
from cfn import CDK_TEMPLATE, REPO, SAM_TEMPLATE, Stack, as_list, sam_transform
from system import participant_deployments
from template_checks import with_jwt
from production_checks import (
    ACCOUNT_ROLE_PARAMETER,
    LAKE_ACCESS_PARAMETER,
    RECORD_WRITES,
    WAF_PARAMETER,
    WAF_RATE_PARAMETER,
    _lake_buckets,
    auth_contract,
    check_access_logs,
    check_alarm_topic,
    check_invokers,
    check_lake_versions_and_access,
    check_record_writes,
    check_waf,
    record_writes,
    transaction_attributes,
    check_aliases,
    check_alarms,
    check_cors_coordinator,
    check_cors_gateway_responses,
    check_cors_preflight,
    check_dashboard,
    check_dead_letter_replay,
    check_deletion_protection,
    check_fanout_alarms,
    check_fanout_retries,
    check_hold_policy,
    check_hold_routes,
    check_lake_catalog,
    check_logging,
    check_max_topics,
    check_metric_names,
    check_no_local_keys,
    check_participant_invokers,
    check_participant_keys,
    check_age_token_key,
    check_reserved_concurrency,
    check_resource_participants,
    check_throttling,
    check_tracing,
    check_websocket_answers,
    clock_margin_ms,
    cors_contract,
    hold_contract,
    lake_record_fields,
    max_topics_contract,
    queue_actions_of_code,
    replay_contract,
)

CHECKS = {
    "throttling": check_throttling,
    "alarms": check_alarms,
    "dashboard": check_dashboard,
    "metric-names": check_metric_names,
    "reserved-concurrency": check_reserved_concurrency,
    "deletion-protection": check_deletion_protection,
    "lake-catalog": check_lake_catalog,
    "logging": check_logging,
    "tracing": check_tracing,
    "aliases": check_aliases,
    "cors-preflight": check_cors_preflight,
    "cors-gateway-responses": check_cors_gateway_responses,
    "cors-coordinator": check_cors_coordinator,
    "websocket-answers": check_websocket_answers,
    "max-topics": check_max_topics,
    "fanout-retries": check_fanout_retries,
    "fanout-alarms": check_fanout_alarms,
    "dead-letter-replay": check_dead_letter_replay,
    "participant-keys": check_participant_keys,
    "age-token-key": check_age_token_key,
    "participant-invokers": check_participant_invokers,
    "no-local-keys": check_no_local_keys,
    "resource-participants": check_resource_participants,
    "hold-routes": check_hold_routes,
    "hold-policy": check_hold_policy,
    "alarm-topic": check_alarm_topic,
    "access-logs": check_access_logs,
    "lake-versions-and-access": check_lake_versions_and_access,
    "record-writes": check_record_writes,
    "invokers": check_invokers,
    "waf": check_waf,
}


@pytest.mark.parametrize("check", CHECKS)
def test_production_detail(stack, check):
    assert CHECKS[check](stack) == []


def test_the_lake_record_is_read_from_the_code():
    assert lake_record_fields() == [
        "eventId",
        "transactionId",
        "service",
        "table",
        "key",
        "change",
        "version",
        "committedAt",
        "data",
        "previous",
        # A committed transaction's line, beside the per-item ones (the same Glue table).
        "kind",
        "firstTransactionId",
        "participants",
        "changes",
    ]


def test_the_cors_values_are_read_from_the_code():
    assert cors_contract() == {
        "defaultOrigin": "*",
        "methods": "GET,POST,OPTIONS",
        "headers": "Age-Token,Authorization,Content-Type,Idempotency-Key,Prefer,X-Amz-Content-Sha256,X-Amz-Date,X-Amz-Security-Token",
        "maxAge": 600,
        "variable": "CORS_ALLOW_ORIGIN",
    }


def test_the_topic_cap_is_read_from_the_code():
    assert max_topics_contract() == {"variable": "MAX_TOPICS_PER_CONNECTION", "default": 50}


def test_the_hold_policy_is_read_from_the_code():
    assert hold_contract() == {
        "policyVariable": "HOLD_POLICY",
        "maxVariable": "MAX_HOLD_MS",
        "minHoldMs": 1_000,
        "maxHoldMs": 86_400_000,
        "serviceMaxHoldMs": 900_000,
    }


def test_the_hold_parameters_are_the_same_in_both_templates(sam, cdk):
    # The same deploy-time interface: name, type, default, bounds, pattern and description.
    for name in ["HoldPolicy", "MaxHoldMs"]:
        assert sam.template["Parameters"][name] == cdk.template["Parameters"][name], name


def test_the_signature_parameter_is_the_same_in_both_templates_and_v1_by_default(sam, cdk):
    # docs/participant-protocol.md: every participant verifies v1 and v2; senders stay on v1 until
    # every participant does (infra/DEPLOY.md, "Moving participant messages to signature v2").
    assert sam.template["Parameters"]["ParticipantSignature"] == cdk.template["Parameters"]["ParticipantSignature"]
    assert sam.template["Parameters"]["ParticipantSignature"]["Default"] == "v1"
    assert sam.template["Parameters"]["ParticipantSignature"]["AllowedValues"] == ["v1", "v2"]


def test_the_clock_margin_and_the_dead_letters_are_read_from_the_code():
    assert clock_margin_ms() == 250
    assert replay_contract() == {"action": "replay-dead-letters", "maxDeadLetterBytes": 256 * 1024}
    # SqsDeadLetters: put (the records the processor gives up on itself), then the replay's calls.
    assert queue_actions_of_code() == {"sqs:SendMessage", "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}


def test_the_message_keys_are_read_from_the_code(contract):
    assert auth_contract() == {
        "localKeys": "local-development-keys",
        "keysVariable": "PARTICIPANT_KEYS",
        "keyVariable": "PARTICIPANT_KEY",
        "ageTokenKeyVariable": "AGE_TOKEN_KEY",
        "maxMessageAgeMs": 45_000,
        "keyCacheTtlSeconds": 60,
    }
    environment = contract["functionEnvironment"]
    assert "PARTICIPANT_KEYS" in environment["coordinator"] and "PARTICIPANT_KEYS" in environment["sweeper"]
    assert "PARTICIPANT_KEY" in environment["participant"]
    # The coordinator's own age-token key (issue 42): the coordinator's alone.
    assert [f for f, names in environment.items() if "AGE_TOKEN_KEY" in names] == ["coordinator"]


def test_no_template_file_names_the_local_keys():
    # The files as written, comments included (the SAM template, the synthesized CDK template, the
    # CDK app's sources): the local development keys are for the local stack and the tests only.
    local = auth_contract()["localKeys"]
    files = [SAM_TEMPLATE, CDK_TEMPLATE, *sorted((REPO / "infra" / "cdk" / "lib").glob("*.ts")), REPO / "infra" / "cdk" / "bin" / "app.ts"]
    assert [str(f) for f in files if local in f.read_text()] == []


def test_the_stream_processor_metrics_are_in_the_contract(contract):
    assert contract["metrics"]["streamProcessorCounts"] == ["UnprocessableRecords"]
    assert "ClockSkew" in contract["metrics"]["coordinatorLatencies"]
    assert "METRICS_NAMESPACE" in contract["functionEnvironment"]["stream-processor"]


# --- the checks can fail ----------------------------------------------------------------------


def _function_props(stack, binary: str, index: int = 0) -> dict:
    return b.props(stack, b.function(stack, binary, index))


def _dashboard_text(stack, old: str, new: str) -> None:
    for name in stack.resources("AWS::CloudWatch::Dashboard"):
        body = b.props(stack, name)["DashboardBody"]
        b.props(stack, name)["DashboardBody"] = b.replace_in_strings(body, old, new)


# A dashboard row of ClockSkew whose statistic is Maximum (its options, in either order).
_CLOCK_SKEW_MAXIMUM = r'("ClockSkew",\s*\{[^}]*"stat":\s*")Maximum'


def _dashboard_regex(stack, pattern: str, replacement: str) -> None:
    def replace(value):
        if isinstance(value, str):
            return re.sub(pattern, replacement, value)
        if isinstance(value, list):
            return [replace(v) for v in value]
        if isinstance(value, dict):
            return {k: replace(v) for k, v in value.items()}
        return value

    for name in stack.resources("AWS::CloudWatch::Dashboard"):
        b.props(stack, name)["DashboardBody"] = replace(b.props(stack, name)["DashboardBody"])


def _glue_table(stack) -> dict:
    return b.props(stack, b.only(stack, "AWS::Glue::Table"))["TableInput"]


def _alarm_description(stack, metric: str, old: str, new: str) -> None:
    props = b.props(stack, b.alarm_on(stack, metric))
    props["AlarmDescription"] = b.replace_in_strings(props["AlarmDescription"], old, new)


def _remove_grant(stack, binary: str, action: str) -> None:
    """Takes `action` out of every raw statement of the role of a function of `binary`."""
    for statements in b.raw_statements(stack, b.role_of(stack, b.function(stack, binary))):
        for entry in list(statements):
            if not isinstance(entry, dict) or "Action" not in entry:
                continue
            rest = [a for a in as_list(entry["Action"]) if str(a).lower() != action.lower()]
            if len(rest) == len(as_list(entry["Action"])):
                continue
            if rest:
                entry["Action"] = rest
            else:
                statements.remove(entry)


LOCAL_KEYS = "local-development-keys"
OTHER_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:other-AbCdEf"


def _keys_value(stack, pairs: list[tuple[str, int]]) -> dict:
    """A PARTICIPANT_KEYS value naming, for each (service, participant index), that participant's key."""
    parts: list = ["{"]
    for n, (service, index) in enumerate(pairs):
        parts += [("" if n == 0 else ", ") + f'"{service}": "', b.ref(b.key_secret(stack, index)), '"']
    return b.join(*parts, "}")


def _services(stack) -> list[str]:
    return sorted(participant_deployments(stack))


def _secret_props(stack, index: int = 0) -> dict:
    return b.props(stack, b.key_secret(stack, index))


def _add_action(stack, binary: str, action: str, added: str) -> None:
    """Adds `added` to the statement granting `action` to the role of a function of `binary`."""
    statement = b.statement(stack, binary, action)
    statement["Action"] = [*as_list(statement["Action"]), added]


def _read_another_services_key(stack, binary: str) -> None:
    """The role of the (first) function of `binary` may also read another service's key."""
    own = b.function(stack, binary)
    other = b.key_secret_of(stack, b.other_participant(stack, own)["function"])
    b.statement(stack, binary, "secretsmanager:GetSecretValue")["Resource"].append(b.ref(other))


def _add_permission(stack, index: int, principal, function_name=None, action: str = "lambda:InvokeFunction") -> None:
    deployment = b.participant(stack, index)
    stack.template["Resources"]["ExtraParticipantPermission"] = {
        "Type": "AWS::Lambda::Permission",
        "Properties": {
            "Action": action,
            "FunctionName": function_name or b.ref(deployment["alias"]),
            "Principal": principal,
        },
    }


BREAKAGES = {
    # throttling
    "rest-throttling-missing": ("throttling", lambda s: b.props(s, b.stage_of_rest_api(s)).pop("MethodSettings")),
    "rest-throttling-hard-coded": (
        "throttling",
        lambda s: [m.update(ThrottlingRateLimit=100) for m in b.props(s, b.stage_of_rest_api(s))["MethodSettings"]],
    ),
    "websocket-throttling-missing": (
        "throttling",
        lambda s: b.props(s, b.only(s, "AWS::ApiGatewayV2::Stage")).pop("DefaultRouteSettings"),
    ),
    # alarms
    "no-iterator-age-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "IteratorAge"))),
    "iterator-age-threshold": ("alarms", lambda s: b.props(s, b.alarm_on(s, "IteratorAge")).update(Threshold=600000)),
    "no-5xx-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "5XXError"))),
    "latency-statistic": (
        "alarms",
        lambda s: b.props(s, b.alarm_on(s, "Latency")).update(ExtendedStatistic="p50"),
    ),
    "no-freshness-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "DeliveryToS3.DataFreshness"))),
    "no-table-throttle-alarm": (
        "alarms",
        lambda s: s.template["Resources"].pop(b.alarm_on(s, "WriteThrottleEvents", '"service-b-data"')),
    ),
    "no-throttles-alarm": (
        "alarms",
        lambda s: s.template["Resources"].pop(b.alarm_on(s, "Throttles", b.function(s, "connections"))),
    ),
    "no-errors-alarm": (
        "alarms",
        lambda s: s.template["Resources"].pop(b.alarm_on(s, "Errors", b.participant(s, 1)["function"])),
    ),
    "no-stuck-transactions-alarm": (
        "alarms",
        lambda s: s.template["Resources"].pop(b.alarm_on(s, "StuckTransactions")),
    ),
    "no-stream-failures-alarm": (
        "alarms",
        lambda s: s.template["Resources"].pop(b.alarm_on(s, "ApproximateNumberOfMessagesVisible")),
    ),
    "alarm-without-action": ("alarms", lambda s: b.props(s, b.alarm_on(s, "IteratorAge")).pop("AlarmActions")),
    # the participants' clock skew (the coordinator's ClockSkew)
    "no-clock-skew-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "ClockSkew"))),
    "clock-skew-alarm-at-the-margin": ("alarms", lambda s: b.props(s, b.alarm_on(s, "ClockSkew")).update(Threshold=250)),
    "clock-skew-alarm-on-the-average": (
        "alarms",
        lambda s: b.props(s, b.alarm_on(s, "ClockSkew")).update(Statistic="Average"),
    ),
    "clock-skew-alarm-over-an-hour": ("alarms", lambda s: b.props(s, b.alarm_on(s, "ClockSkew")).update(Period=3600)),
    "clock-skew-alarm-silent": ("alarms", lambda s: b.props(s, b.alarm_on(s, "ClockSkew")).pop("AlarmActions")),
    "clock-skew-alarm-missing-data-breaching": (
        "alarms",
        lambda s: b.props(s, b.alarm_on(s, "ClockSkew")).update(TreatMissingData="breaching"),
    ),
    "clock-skew-alarm-without-the-margin": ("alarms", lambda s: _alarm_description(s, "ClockSkew", "250 ms", "a quarter second")),
    # the records the stream processor dead-letters itself (its UnprocessableRecords)
    "no-unprocessable-records-alarm": (
        "alarms",
        lambda s: s.template["Resources"].pop(b.alarm_on(s, "UnprocessableRecords")),
    ),
    "unprocessable-records-alarm-at-ten": (
        "alarms",
        lambda s: b.props(s, b.alarm_on(s, "UnprocessableRecords")).update(Threshold=10),
    ),
    "unprocessable-records-alarm-on-the-average": (
        "alarms",
        lambda s: b.props(s, b.alarm_on(s, "UnprocessableRecords")).update(Statistic="Average"),
    ),
    "unprocessable-records-alarm-over-a-day": (
        "alarms",
        lambda s: b.props(s, b.alarm_on(s, "UnprocessableRecords")).update(Period=86400),
    ),
    "unprocessable-records-alarm-silent": (
        "alarms",
        lambda s: b.props(s, b.alarm_on(s, "UnprocessableRecords")).pop("AlarmActions"),
    ),
    "unprocessable-records-alarm-missing-data-breaching": (
        "alarms",
        lambda s: b.props(s, b.alarm_on(s, "UnprocessableRecords")).update(TreatMissingData="breaching"),
    ),
    "unprocessable-records-alarm-without-the-replay": (
        "alarms",
        lambda s: _alarm_description(s, "UnprocessableRecords", "replay-dead-letters", "replay"),
    ),
    "alarm-missing-data-breaching": (
        "alarms",
        lambda s: b.props(s, b.alarm_on(s, "5XXError")).update(TreatMissingData="breaching"),
    ),
    # dashboard
    "no-dashboard": ("dashboard", lambda s: s.template["Resources"].pop(b.only(s, "AWS::CloudWatch::Dashboard"))),
    "dashboard-without-p99": ("dashboard", lambda s: _dashboard_text(s, '"p99"', '"p90"')),
    "dashboard-without-aborted": ("dashboard", lambda s: _dashboard_text(s, "Aborted", "Abandoned")),
    "dashboard-without-freshness": ("dashboard", lambda s: _dashboard_text(s, "DataFreshness", "Records")),
    "dashboard-without-sweeper": ("dashboard", lambda s: _dashboard_text(s, "RecoveredTransactions", "SweepErrors")),
    "dashboard-without-clock-skew": ("dashboard", lambda s: _dashboard_text(s, '"ClockSkew"', '"PrepareLatency"')),
    "dashboard-without-clock-skew-maximum": ("dashboard", lambda s: _dashboard_regex(s, _CLOCK_SKEW_MAXIMUM, r"\1Average")),
    "dashboard-without-unprocessable-records": (
        "dashboard",
        lambda s: _dashboard_text(s, '"UnprocessableRecords"', '"SweepErrors"'),
    ),
    "dashboard-metric-the-code-does-not-write": (
        "metric-names",
        lambda s: _dashboard_text(s, "RecoveredTransactions", "SweptTransactions"),
    ),
    "alarm-metric-the-code-does-not-write": (
        "metric-names",
        lambda s: b.props(s, b.alarm_on(s, "StuckTransactions")).update(MetricName="SweepFailures"),
    ),
    "unprocessable-alarm-metric-misspelt": (
        "metric-names",
        lambda s: b.props(s, b.alarm_on(s, "UnprocessableRecords")).update(MetricName="UnprocessedRecords"),
    ),
    # reserved concurrency
    "coordinator-concurrency-hard-coded": (
        "reserved-concurrency",
        lambda s: _function_props(s, "coordinator").update(ReservedConcurrentExecutions=100),
    ),
    "stream-processor-unreserved": (
        "reserved-concurrency",
        lambda s: _function_props(s, "stream-processor").pop("ReservedConcurrentExecutions"),
    ),
    "participant-capped": (
        "reserved-concurrency",
        lambda s: b.props(s, b.participant(s, 0)["function"]).update(ReservedConcurrentExecutions=10),
    ),
    # deletion protection
    "table-unprotected": (
        "deletion-protection",
        lambda s: b.props(s, b.table(s, "transactions")).update(DeletionProtectionEnabled=False),
    ),
    "bucket-deleted-with-stack": (
        "deletion-protection",
        lambda s: b.resource(s, b.only(s, "AWS::S3::Bucket")).update(DeletionPolicy="Delete"),
    ),
    "table-replaced-without-retain": (
        "deletion-protection",
        lambda s: b.resource(s, b.table(s, "connections")).pop("UpdateReplacePolicy"),
    ),
    # lake catalog
    "uncompressed": (
        "lake-catalog",
        lambda s: b.props(s, b.only(s, "AWS::KinesisFirehose::DeliveryStream"))[
            "ExtendedS3DestinationConfiguration"
        ].update(CompressionFormat="UNCOMPRESSED"),
    ),
    "location-template-off-prefix": (
        "lake-catalog",
        lambda s: _glue_table(s)["Parameters"].update(
            {"storage.location.template": b.replace_in_strings(_glue_table(s)["Parameters"]["storage.location.template"], "/data/", "/lake/")}
        ),
    ),
    "month-digits": ("lake-catalog", lambda s: _glue_table(s)["Parameters"].pop("projection.month.digits")),
    "hour-not-projected": ("lake-catalog", lambda s: _glue_table(s)["Parameters"].pop("projection.hour.type")),
    "missing-column": ("lake-catalog", lambda s: _glue_table(s)["StorageDescriptor"]["Columns"].pop()),
    "serde": (
        "lake-catalog",
        lambda s: _glue_table(s)["StorageDescriptor"]["SerdeInfo"].update(
            SerializationLibrary="org.apache.hive.hcatalog.data.JsonSerDe"
        ),
    ),
    "no-glue-table": ("lake-catalog", lambda s: s.template["Resources"].pop(b.only(s, "AWS::Glue::Table"))),
    # logging
    "log-level-hard-coded": (
        "logging",
        lambda s: _function_props(s, "sweeper")["LoggingConfig"].update(ApplicationLogLevel="INFO"),
    ),
    "log-format-text": ("logging", lambda s: _function_props(s, "connections")["LoggingConfig"].update(LogFormat="Text")),
    "system-log-level": ("logging", lambda s: _function_props(s, "coordinator")["LoggingConfig"].pop("SystemLogLevel")),
    "rust-log": ("logging", lambda s: _function_props(s, "coordinator")["Environment"]["Variables"].update(RUST_LOG="debug")),
    "shared-log-group": (
        "logging",
        lambda s: _function_props(s, "coordinator")["LoggingConfig"].update(
            LogGroup=_function_props(s, "sweeper")["LoggingConfig"]["LogGroup"]
        ),
    ),
    "log-level-values": ("logging", lambda s: s.template["Parameters"]["LogLevel"].update(AllowedValues=["info", "debug"])),
    # tracing
    "tracing-hard-coded": ("tracing", lambda s: _function_props(s, "stream-processor").update(TracingConfig={"Mode": "PassThrough"})),
    "rest-stage-tracing-on": ("tracing", lambda s: b.props(s, b.stage_of_rest_api(s)).update(TracingEnabled=True)),
    "xray-without-tracing": (
        "tracing",
        lambda s: b.raw_statements(s, b.role_of(s, b.function(s, "connections")))[0].append(
            {"Effect": "Allow", "Action": ["xray:PutTraceSegments", "xray:PutTelemetryRecords"], "Resource": "*"}
        ),
    ),
    "no-xray-grant": (
        "tracing",
        lambda s: [
            statements.remove(entry)
            for statements in b.raw_statements(s, b.role_of(s, b.function(s, "coordinator")))
            for entry in list(statements)
            if "xray:" in json.dumps(entry)
        ],
    ),
    # aliases
    "no-alias": ("aliases", lambda s: s.template["Resources"].pop(b.participant(s, 0)["alias"])),
    "alias-on-latest": (
        "aliases",
        lambda s: b.props(s, b.participant(s, 1)["alias"]).update(FunctionVersion="$LATEST"),
    ),
    # cross-origin access (CORS)
    "no-cors-parameter": ("cors-preflight", lambda s: s.template["Parameters"].pop("CorsAllowOrigin")),
    "cors-parameter-default": (
        "cors-coordinator",
        lambda s: s.template["Parameters"]["CorsAllowOrigin"].update(Default="https://app.example.com"),
    ),
    "cors-parameter-pattern-takes-a-list": (
        "cors-gateway-responses",
        lambda s: s.template["Parameters"]["CorsAllowOrigin"].update(AllowedPattern=".*"),
    ),
    "no-preflight": ("cors-preflight", lambda s: b.remove_preflight(s)),
    "no-preflight-on-a-path": ("cors-preflight", lambda s: b.remove_preflight(s, "{id}")),
    "preflight-with-auth": ("cors-preflight", lambda s: b.set_preflight_authorization(s, "AWS_IAM")),
    "preflight-headers-wrong": (
        "cors-preflight",
        lambda s: b.set_preflight_header(s, "Access-Control-Allow-Headers", "'Authorization,Content-Type'"),
    ),
    "preflight-methods-wrong": (
        "cors-preflight",
        lambda s: b.set_preflight_header(s, "Access-Control-Allow-Methods", "'GET,OPTIONS'"),
    ),
    "preflight-without-max-age": ("cors-preflight", lambda s: b.set_preflight_header(s, "Access-Control-Max-Age", None)),
    "preflight-origin-hard-coded": (
        "cors-preflight",
        lambda s: b.set_preflight_header(s, "Access-Control-Allow-Origin", "'*'"),
    ),
    "preflight-allows-credentials": (
        "cors-preflight",
        lambda s: b.set_preflight_header(s, "Access-Control-Allow-Credentials", "'true'"),
    ),
    "preflight-origin-in-a-template": (
        "cors-preflight",
        lambda s: b.set_preflight_template(
            s, '#set($context.responseOverride.header.Access-Control-Allow-Origin = "https://other.example.com")'
        ),
    ),
    "no-4xx-gateway-response": ("cors-gateway-responses", lambda s: b.remove_gateway_response(s, "DEFAULT_4XX")),
    "gateway-response-without-origin": (
        "cors-gateway-responses",
        lambda s: [p.clear() for p in b.gateway_response_parameters(s, "DEFAULT_5XX")],
    ),
    "gateway-response-origin-hard-coded": (
        "cors-gateway-responses",
        lambda s: [
            p.update({"gatewayresponse.header.Access-Control-Allow-Origin": "'*'"})
            for p in b.gateway_response_parameters(s, "DEFAULT_4XX")
        ],
    ),
    "coordinator-origin-missing": (
        "cors-coordinator",
        lambda s: _function_props(s, "coordinator")["Environment"]["Variables"].pop("CORS_ALLOW_ORIGIN"),
    ),
    "coordinator-origin-hard-coded": (
        "cors-coordinator",
        lambda s: _function_props(s, "coordinator")["Environment"]["Variables"].update(CORS_ALLOW_ORIGIN="*"),
    ),
    # the WebSocket API's answers to subscribe and unsubscribe
    "subscribe-without-route-response": (
        "websocket-answers",
        lambda s: [s.template["Resources"].pop(r) for r in b.route_responses_of(s, b.websocket_route(s, "subscribe"))],
    ),
    "unsubscribe-without-selection-expression": (
        "websocket-answers",
        lambda s: b.props(s, b.websocket_route(s, "unsubscribe")).pop("RouteResponseSelectionExpression"),
    ),
    "route-response-key-not-default": (
        "websocket-answers",
        lambda s: [
            b.props(s, r).update(RouteResponseKey="$other")
            for r in b.route_responses_of(s, b.websocket_route(s, "unsubscribe"))
        ],
    ),
    "connect-route-with-response": (
        "websocket-answers",
        lambda s: b.props(s, b.websocket_route(s, "$connect")).update(RouteResponseSelectionExpression="$default"),
    ),
    "stage-not-after-route-responses": (
        "websocket-answers",
        lambda s: b.resource(s, b.only(s, "AWS::ApiGatewayV2::Stage")).update(
            DependsOn=[
                d for d in b.resource(s, b.only(s, "AWS::ApiGatewayV2::Stage"))["DependsOn"]
                if b.resource(s, d)["Type"] != "AWS::ApiGatewayV2::RouteResponse"
            ]
        ),
    ),
    # the connections function's cap on topics
    "no-max-topics-parameter": ("max-topics", lambda s: s.template["Parameters"].pop("MaxTopicsPerConnection")),
    "max-topics-hard-coded": (
        "max-topics",
        lambda s: _function_props(s, "connections")["Environment"]["Variables"].update(MAX_TOPICS_PER_CONNECTION="50"),
    ),
    "max-topics-default": (
        "max-topics",
        lambda s: s.template["Parameters"]["MaxTopicsPerConnection"].update(Default=100),
    ),
    "max-topics-unbounded": ("max-topics", lambda s: s.template["Parameters"]["MaxTopicsPerConnection"].pop("MaxValue")),
    "max-topics-zero-allowed": (
        "max-topics",
        lambda s: s.template["Parameters"]["MaxTopicsPerConnection"].update(MinValue=0),
    ),
    # the fan-out rides out an outage
    "retries-give-up-early": (
        "fanout-retries",
        lambda s: b.props(s, b.mapping_of(s, "service-b-data")).update(MaximumRetryAttempts=5),
    ),
    "record-age-an-hour": (
        "fanout-retries",
        lambda s: b.props(s, b.mapping_of(s, "transactions")).update(MaximumRecordAgeInSeconds=3600),
    ),
    "retries-without-bisection": (
        "fanout-retries",
        lambda s: b.props(s, b.mapping_of(s, "service-a-data")).pop("BisectBatchOnFunctionError"),
    ),
    "queue-alarm-on-another-queue": (
        "fanout-alarms",
        lambda s: b.props(s, b.alarm_on(s, "ApproximateNumberOfMessagesVisible")).update(
            Dimensions=[{"Name": "QueueName", "Value": "another-queue"}]
        ),
    ),
    "queue-alarm-silent": (
        "fanout-alarms",
        lambda s: b.props(s, b.alarm_on(s, "ApproximateNumberOfMessagesVisible")).pop("AlarmActions"),
    ),
    "queue-alarm-after-an-hour": (
        "fanout-alarms",
        lambda s: b.props(s, b.alarm_on(s, "ApproximateNumberOfMessagesVisible")).update(Period=3600),
    ),
    "iterator-age-alarm-late": (
        "fanout-alarms",
        lambda s: b.props(s, b.alarm_on(s, "IteratorAge")).update(Threshold=3_600_000),
    ),
    "iterator-age-alarm-silent": (
        "fanout-alarms",
        lambda s: b.props(s, b.alarm_on(s, "IteratorAge")).pop("AlarmActions"),
    ),
    "no-iterator-age-alarm-for-the-outage": (
        "fanout-alarms",
        lambda s: s.template["Resources"].pop(b.alarm_on(s, "IteratorAge")),
    ),
    # the replay of what it gave up on
    "dead-letter-url-missing": (
        "dead-letter-replay",
        lambda s: _function_props(s, "stream-processor")["Environment"]["Variables"].pop("DEAD_LETTER_QUEUE_URL"),
    ),
    "dead-letter-url-is-the-arn": (
        "dead-letter-replay",
        lambda s: _function_props(s, "stream-processor")["Environment"]["Variables"].update(
            DEAD_LETTER_QUEUE_URL=b.getatt(b.stream_failure_queue(s), "Arn")
        ),
    ),
    "dead-letter-url-another-queue": (
        "dead-letter-replay",
        lambda s: _function_props(s, "stream-processor")["Environment"]["Variables"].update(
            DEAD_LETTER_QUEUE_URL="https://sqs.us-east-1.amazonaws.com/123456789012/other"
        ),
    ),
    "replay-grant-missing-action": (
        "dead-letter-replay",
        lambda s: b.statement(s, "stream-processor", "sqs:ReceiveMessage").update(
            Action=["sqs:ReceiveMessage", "sqs:GetQueueAttributes"]
        ),
    ),
    "replay-grant-on-every-queue": (
        "dead-letter-replay",
        lambda s: b.statement(s, "stream-processor", "sqs:ReceiveMessage").update(
            Resource=[{"Fn::Sub": "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:*"}]
        ),
    ),
    "replay-grant-on-another-queue-too": (
        "dead-letter-replay",
        lambda s: b.statement(s, "stream-processor", "sqs:ReceiveMessage")["Resource"].append(
            "arn:aws:sqs:us-east-1:123456789012:other"
        ),
    ),
    "replay-grant-purge": (
        "dead-letter-replay",
        lambda s: b.statement(s, "stream-processor", "sqs:ReceiveMessage")["Action"].append("sqs:PurgeQueue"),
    ),
    # the stream processor's own dead letters (SqsDeadLetters::put): SendMessage on that queue only
    "dead-letter-send-grant-missing": ("dead-letter-replay", lambda s: _remove_grant(s, "stream-processor", "sqs:SendMessage")),
    "dead-letter-send-grant-on-every-queue": (
        "dead-letter-replay",
        lambda s: b.statement(s, "stream-processor", "sqs:SendMessage").update(
            Resource=[{"Fn::Sub": "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:*"}]
        ),
    ),
    "dead-letter-send-grant-on-star": (
        "dead-letter-replay",
        lambda s: b.statement(s, "stream-processor", "sqs:SendMessage").update(Resource="*"),
    ),
    "dead-letter-send-grant-on-another-queue-too": (
        "dead-letter-replay",
        lambda s: b.statement(s, "stream-processor", "sqs:SendMessage")["Resource"].append(
            "arn:aws:sqs:us-east-1:123456789012:other"
        ),
    ),
    "dead-letter-send-grant-to-another-function": (
        "dead-letter-replay",
        lambda s: b.raw_statements(s, b.role_of(s, b.function(s, "sweeper")))[0].append(
            {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": b.getatt(b.stream_failure_queue(s), "Arn")}
        ),
    ),
    "dead-letter-queue-too-small": (
        "dead-letter-replay",
        lambda s: b.props(s, b.stream_failure_queue(s)).update(MaximumMessageSize=65536),
    ),
    "replay-grant-to-another-function": (
        "dead-letter-replay",
        lambda s: b.raw_statements(s, b.role_of(s, b.function(s, "connections")))[0].append(
            {
                "Effect": "Allow",
                "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"],
                "Resource": b.getatt(b.stream_failure_queue(s), "Arn"),
            }
        ),
    ),
}


BREAKAGES.update(
    {
        # each participant's PARTICIPANT_KEY: a secret of its own
        "participant-key-missing": (
            "participant-keys",
            lambda s: b.variables_of(s, b.participant(s, 0)["function"]).pop("PARTICIPANT_KEY"),
        ),
        "participant-key-of-another-service": (
            "participant-keys",
            lambda s: b.variables_of(s, b.participant(s, 0)["function"]).update(PARTICIPANT_KEY=b.ref(b.key_secret(s, 1))),
        ),
        "participant-key-a-literal-arn": (
            "participant-keys",
            lambda s: b.variables_of(s, b.participant(s, 1)["function"]).update(PARTICIPANT_KEY=OTHER_SECRET),
        ),
        # a participant's role: its own key, nothing else
        "participant-cannot-read-its-key": (
            "participant-keys",
            lambda s: _remove_grant(s, "participant", "secretsmanager:GetSecretValue"),
        ),
        "participant-reads-another-services-key": (
            "participant-keys",
            lambda s: _read_another_services_key(s, "participant"),
        ),
        # a service's own participant (the inventory): the same rules
        "inventory-reads-another-services-key": (
            "participant-keys",
            lambda s: _read_another_services_key(s, "inventory"),
        ),
        "inventory-cannot-read-its-key": (
            "participant-keys",
            lambda s: _remove_grant(s, "inventory", "secretsmanager:GetSecretValue"),
        ),
        "inventory-key-of-another-service": (
            "participant-keys",
            lambda s: b.variables_of(s, b.deployment_of(s, "inventory")["function"]).update(
                PARTICIPANT_KEY=b.ref(b.key_secret_of(s, b.deployment_of(s, "service-a")["function"]))
            ),
        ),
        "inventory-key-local": (
            "no-local-keys",
            lambda s: b.variables_of(s, b.deployment_of(s, "inventory")["function"]).update(PARTICIPANT_KEY=LOCAL_KEYS),
        ),
        "keys-registry-misses-the-inventory": (
            "participant-keys",
            lambda s: b.variables(s, "sweeper").update(
                PARTICIPANT_KEYS=_keys_value(s, [(service, i) for i, service in enumerate(_services(s)) if service != "inventory"])
            ),
        ),
        "inventory-resource-policy-without-the-coordinator": (
            "participant-invokers",
            lambda s: [
                s.template["Resources"].pop(p)
                for p in b.participant_permissions(s, _services(s).index("inventory"), "coordinator")
            ],
        ),
        "inventory-resource-policy-for-the-account-too": (
            "participant-invokers",
            lambda s: _add_permission(s, _services(s).index("inventory"), b.ref("AWS::AccountId")),
        ),
        # a resource participant (the payments): the same rules
        "payments-reads-another-services-key": (
            "participant-keys",
            lambda s: _read_another_services_key(s, "payments"),
        ),
        "payments-key-of-another-service": (
            "participant-keys",
            lambda s: b.variables_of(s, b.deployment_of(s, "payments")["function"]).update(
                PARTICIPANT_KEY=b.ref(b.key_secret_of(s, b.deployment_of(s, "inventory")["function"]))
            ),
        ),
        "keys-registry-misses-the-payments": (
            "participant-keys",
            lambda s: b.variables(s, "coordinator").update(
                PARTICIPANT_KEYS=_keys_value(s, [(service, i) for i, service in enumerate(_services(s)) if service != "payments"])
            ),
        ),
        "payments-resource-policy-without-the-sweeper": (
            "participant-invokers",
            lambda s: [
                s.template["Resources"].pop(p) for p in b.participant_permissions(s, _services(s).index("payments"), "sweeper")
            ],
        ),
        "payments-resource-policy-for-the-payment-provider-too": (
            "participant-invokers",
            lambda s: _add_permission(s, _services(s).index("payments"), "123456789012"),
        ),
        "participant-reads-another-secret": (
            "participant-keys",
            lambda s: b.statement(s, "participant", "secretsmanager:GetSecretValue", index=1)["Resource"].append(OTHER_SECRET),
        ),
        "participant-reads-every-secret": (
            "participant-keys",
            lambda s: b.statement(s, "participant", "secretsmanager:GetSecretValue").update(
                Resource=[{"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:*"}]
            ),
        ),
        "participant-may-change-its-key": (
            "participant-keys",
            lambda s: _add_action(s, "participant", "secretsmanager:GetSecretValue", "secretsmanager:PutSecretValue"),
        ),
        # the coordinator's and the sweeper's roles: every service's key, nothing else
        "coordinator-cannot-read-a-key": (
            "participant-keys",
            lambda s: b.statement(s, "coordinator", "secretsmanager:GetSecretValue")["Resource"].pop(),
        ),
        "sweeper-cannot-read-the-keys": ("participant-keys", lambda s: _remove_grant(s, "sweeper", "secretsmanager:GetSecretValue")),
        "coordinator-reads-another-secret": (
            "participant-keys",
            lambda s: b.statement(s, "coordinator", "secretsmanager:GetSecretValue")["Resource"].append(OTHER_SECRET),
        ),
        "stream-processor-reads-a-key": (
            "participant-keys",
            lambda s: b.raw_statements(s, b.role_of(s, b.function(s, "stream-processor")))[0].append(
                {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": b.ref(b.key_secret(s, 0))}
            ),
        ),
        # PARTICIPANT_KEYS: every registered service's key
        "keys-registry-misses-a-service": (
            "participant-keys",
            lambda s: b.variables(s, "coordinator").update(PARTICIPANT_KEYS=_keys_value(s, [(_services(s)[0], 0)])),
        ),
        "keys-registry-swapped": (
            "participant-keys",
            lambda s: b.variables(s, "sweeper").update(
                PARTICIPANT_KEYS=_keys_value(s, [(_services(s)[0], 1), (_services(s)[1], 0)])
            ),
        ),
        "keys-registry-missing": ("participant-keys", lambda s: b.variables(s, "sweeper").pop("PARTICIPANT_KEYS")),
        "keys-registry-local": ("participant-keys", lambda s: b.variables(s, "coordinator").update(PARTICIPANT_KEYS=LOCAL_KEYS)),
        # the secrets: generated, as the code reads them, under the AWS-managed key, not shared
        "key-written-in-the-template": (
            "participant-keys",
            lambda s: [
                _secret_props(s).pop("GenerateSecretString"),
                _secret_props(s).update(SecretString='{"id": "k1", "secret": "0123456789abcdef0123456789abcdef"}'),
            ],
        ),
        "key-too-short": ("participant-keys", lambda s: _secret_props(s, 1)["GenerateSecretString"].update(PasswordLength=16)),
        "key-with-punctuation": (
            "participant-keys",
            lambda s: _secret_props(s)["GenerateSecretString"].pop("ExcludePunctuation"),
        ),
        "key-without-id": (
            "participant-keys",
            lambda s: _secret_props(s)["GenerateSecretString"].update(SecretStringTemplate="{}"),
        ),
        "key-under-another-field": (
            "participant-keys",
            lambda s: _secret_props(s)["GenerateSecretString"].update(GenerateStringKey="password"),
        ),
        "key-under-a-customer-managed-kms-key": (
            "participant-keys",
            lambda s: _secret_props(s).update(KmsKeyId="arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"),
        ),
        "key-description-without-rotation": (
            "participant-keys",
            lambda s: _secret_props(s, 1).update(Description="A message key"),
        ),
        "key-shared-by-a-resource-policy": (
            "participant-keys",
            lambda s: s.template["Resources"].update(
                KeyPolicy={
                    "Type": "AWS::SecretsManager::ResourcePolicy",
                    "Properties": {
                        "SecretId": b.ref(b.key_secret(s, 0)),
                        "ResourcePolicy": {
                            "Version": "2012-10-17",
                            "Statement": [
                                {
                                    "Effect": "Allow",
                                    "Principal": {"AWS": "arn:aws:iam::210987654321:root"},
                                    "Action": "secretsmanager:GetSecretValue",
                                    "Resource": "*",
                                }
                            ],
                        },
                    },
                }
            ),
        ),
        # each participant's resource policy: exactly the coordinator's and the sweeper's roles
        "no-resource-policy": (
            "participant-invokers",
            lambda s: [s.template["Resources"].pop(p) for p in b.participant_permissions(s, 0)],
        ),
        "resource-policy-without-the-sweeper": (
            "participant-invokers",
            lambda s: [s.template["Resources"].pop(p) for p in b.participant_permissions(s, 1, "sweeper")],
        ),
        "resource-policy-for-another-role": (
            "participant-invokers",
            lambda s: [
                b.props(s, p).update(Principal=b.role_arn(s, "connections"))
                for p in b.participant_permissions(s, 0, "coordinator")
            ],
        ),
        "resource-policy-for-the-account-too": (
            "participant-invokers",
            lambda s: _add_permission(s, 1, b.ref("AWS::AccountId")),
        ),
        "resource-policy-for-a-service-too": (
            "participant-invokers",
            lambda s: _add_permission(s, 0, "apigateway.amazonaws.com"),
        ),
        "resource-policy-for-anyone-on-the-function": (
            "participant-invokers",
            lambda s: _add_permission(s, 0, "*", function_name=b.getatt(b.participant(s, 0)["function"], "Arn")),
        ),
        "resource-policy-for-anyone-on-a-qualified-name": (
            "participant-invokers",
            lambda s: _add_permission(s, 1, "*", function_name={"Fn::Sub": "${%s}:live" % b.participant(s, 1)["function"]}),
        ),
        "resource-policy-on-the-function-not-the-alias": (
            "participant-invokers",
            lambda s: [
                b.props(s, p).update(FunctionName=b.ref(b.participant(s, 0)["function"]))
                for p in b.participant_permissions(s, 0)
            ],
        ),
        "resource-policy-function-url": (
            "participant-invokers",
            lambda s: [
                b.props(s, p).update(Action="lambda:InvokeFunctionUrl")
                for p in b.participant_permissions(s, 1, "coordinator")
            ],
        ),
        # the local development keys
        "local-keys-for-a-participant": (
            "no-local-keys",
            lambda s: b.variables_of(s, b.participant(s, 0)["function"]).update(PARTICIPANT_KEY=LOCAL_KEYS),
        ),
        "local-keys-for-the-sweeper": ("no-local-keys", lambda s: b.variables(s, "sweeper").update(PARTICIPANT_KEYS=LOCAL_KEYS)),
        "local-keys-as-a-parameter-default": (
            "no-local-keys",
            lambda s: s.template["Parameters"].update(ParticipantKeys={"Type": "String", "Default": LOCAL_KEYS}),
        ),
    }
)


def _payments(stack) -> str:
    return b.deployment_of(stack, "payments")["function"]


def _payments_statement(stack, action: str) -> dict:
    return b.statement(stack, "payments", action)


def _parameter_description(stack, text: str) -> None:
    stack.template["Parameters"]["PaymentApiUrl"]["Description"] = text


def _decision_to_the_sweeper(stack, decision: str) -> None:
    b.set_rest_method_target(stack, "POST", decision, b.function(stack, "coordinator"), b.function(stack, "sweeper"))


BREAKAGES.update(
    {
        # PAYMENT_API_URL from PaymentApiUrl, on the payments function alone
        "payments-without-its-api-url": ("resource-participants", lambda s: b.variables_of(s, _payments(s)).pop("PAYMENT_API_URL")),
        "payments-api-url-hard-coded": (
            "resource-participants",
            lambda s: b.variables_of(s, _payments(s)).update(PAYMENT_API_URL="https://payments.example.com"),
        ),
        "payments-api-url-from-another-parameter": (
            "resource-participants",
            lambda s: b.variables_of(s, _payments(s)).update(PAYMENT_API_URL=b.ref("CorsAllowOrigin")),
        ),
        "payment-api-url-on-the-inventory-too": (
            "resource-participants",
            lambda s: b.variables_of(s, b.deployment_of(s, "inventory")["function"]).update(PAYMENT_API_URL=b.ref("PaymentApiUrl")),
        ),
        "payment-api-url-on-the-coordinator-too": (
            "resource-participants",
            lambda s: b.variables(s, "coordinator").update(PAYMENT_API_URL=b.ref("PaymentApiUrl")),
        ),
        "payment-api-url-parameter-missing": ("resource-participants", lambda s: s.template["Parameters"].pop("PaymentApiUrl")),
        "payment-api-url-a-real-looking-default": (
            "resource-participants",
            lambda s: s.template["Parameters"]["PaymentApiUrl"].update(Default="https://api.stripe.com"),
        ),
        "payment-api-url-description-silent-on-idempotency": (
            "resource-participants",
            lambda s: _parameter_description(s, "Base URL of the payment API (a placeholder); HTTPS, no VPC."),
        ),
        # its timeout: longer than a prepare retrying until the latest deadline, and than the others'
        "payments-timeout-of-the-other-participants": ("resource-participants", lambda s: b.props(s, _payments(s)).update(Timeout=10)),
        "payments-timeout-the-longest-transaction": ("resource-participants", lambda s: b.props(s, _payments(s)).update(Timeout=25)),
        "payments-shorter-than-another-participant": (
            "resource-participants",
            lambda s: b.props(s, b.deployment_of(s, "service-a")["function"]).update(Timeout=60),
        ),
        # outside any VPC: it calls the payment API over the internet
        "payments-in-a-vpc": (
            "resource-participants",
            lambda s: b.props(s, _payments(s)).update(VpcConfig={"SubnetIds": ["subnet-1"], "SecurityGroupIds": ["sg-1"]}),
        ),
        # its role: the barrier's calls on its own table, nothing else of DynamoDB
        "payments-may-not-put-its-barrier-entries": (
            "resource-participants",
            lambda s: _remove_grant(s, "payments", "dynamodb:PutItem"),
        ),
        "payments-may-batch-read-its-table": (
            "resource-participants",
            lambda s: _add_action(s, "payments", "dynamodb:GetItem", "dynamodb:BatchGetItem"),
        ),
        "payments-reaches-the-transactions-table": (
            "resource-participants",
            lambda s: _payments_statement(s, "dynamodb:GetItem")["Resource"].append(b.getatt(b.table(s, "transactions"), "Arn")),
        ),
        "payments-reaches-the-inventory-table": (
            "resource-participants",
            lambda s: _payments_statement(s, "dynamodb:UpdateItem")["Resource"].append(b.getatt(b.table(s, "inventory-data"), "Arn")),
        ),
        # the alarm an operator sees for a confirm that fails for good says what to do
        "stuck-alarm-silent-on-the-sweep-error": (
            "alarms",
            lambda s: b.props(s, b.alarm_on(s, "StuckTransactions")).update(
                AlarmDescription="The sweeper could not finish open transactions for 5 minutes."
            ),
        ),
        # a held transaction's two routes, authorized exactly as POST /transactions
        "commit-route-missing": ("hold-routes", lambda s: b.remove_rest_method(s, "POST", "commit")),
        "abort-route-missing": ("hold-routes", lambda s: b.remove_rest_method(s, "POST", "abort")),
        "abort-route-unauthorized": ("hold-routes", lambda s: b.set_rest_method_authorization(s, "POST", "abort", "NONE")),
        "commit-route-unauthorized": ("hold-routes", lambda s: b.set_rest_method_authorization(s, "POST", "commit", "NONE")),
        "commit-route-another-authorizer": (
            "hold-routes",
            lambda s: b.set_rest_method_authorization(s, "POST", "commit", "CUSTOM"),
        ),
        # the same authorization as POST /transactions, but none at all
        "every-route-unauthorized": ("hold-routes", lambda s: b.set_rest_authorization(s, "NONE")),
        "commit-route-to-the-sweeper": ("hold-routes", lambda s: _decision_to_the_sweeper(s, "commit")),
        "abort-route-not-permitted": ("hold-routes", lambda s: b.remove_rest_invoke_permissions(s, "POST", "abort")),
        # the coordinator's hold policy, from its parameters and on nothing else
        "no-hold-policy-parameter": ("hold-policy", lambda s: s.template["Parameters"].pop("HoldPolicy")),
        "no-max-hold-parameter": ("hold-policy", lambda s: s.template["Parameters"].pop("MaxHoldMs")),
        "hold-policy-default": (
            "hold-policy",
            lambda s: s.template["Parameters"]["HoldPolicy"].update(Default='{"service-b": {"accepts": false}}'),
        ),
        "hold-policy-pattern-refuses-a-policy": (
            "hold-policy",
            lambda s: s.template["Parameters"]["HoldPolicy"].update(AllowedPattern="\\{\\}"),
        ),
        "hold-policy-missing": ("hold-policy", lambda s: b.variables(s, "coordinator").pop("HOLD_POLICY")),
        "hold-policy-hard-coded": ("hold-policy", lambda s: b.variables(s, "coordinator").update(HOLD_POLICY="{}")),
        "max-hold-hard-coded": ("hold-policy", lambda s: b.variables(s, "coordinator").update(MAX_HOLD_MS="86400000")),
        "max-hold-from-the-policy": ("hold-policy", lambda s: b.variables(s, "coordinator").update(MAX_HOLD_MS=b.ref("HoldPolicy"))),
        "max-hold-default": ("hold-policy", lambda s: s.template["Parameters"]["MaxHoldMs"].update(Default=900000)),
        "max-hold-above-the-code": ("hold-policy", lambda s: s.template["Parameters"]["MaxHoldMs"].update(MaxValue=172800000)),
        "max-hold-unbounded": ("hold-policy", lambda s: s.template["Parameters"]["MaxHoldMs"].pop("MaxValue")),
        "max-hold-zero-allowed": ("hold-policy", lambda s: s.template["Parameters"]["MaxHoldMs"].update(MinValue=0)),
        "max-hold-a-string": ("hold-policy", lambda s: s.template["Parameters"]["MaxHoldMs"].update(Type="String")),
        "hold-policy-on-the-sweeper": (
            "hold-policy",
            lambda s: b.variables(s, "sweeper").update(HOLD_POLICY=b.ref("HoldPolicy")),
        ),
        "max-hold-in-another-variable": (
            "hold-policy",
            lambda s: b.variables(s, "connections").update(MAX_TOPICS_PER_CONNECTION=b.ref("MaxHoldMs")),
        ),
    }
)


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_production_check_catches(breakage, stack):
    check, damage = BREAKAGES[breakage]
    damage(stack)
    assert CHECKS[check](stack) != []


def test_cors_preflight_check_catches_the_sam_default_authorizer_on_the_preflight(raw, contract):
    # The REST API's authorization is written in its definition (it depends on JwtIssuer, which SAM's
    # Auth cannot follow). Given as SAM's DefaultAuthorizer instead, without
    # AddDefaultAuthorizerToCorsPreflight: false, SAM gives the OPTIONS methods the API's default
    # (AWS_IAM) too, and every browser's preflight is refused.
    api = raw["Resources"]["RestApi"]["Properties"]
    assert "Auth" not in api, "the REST API's authorization is in its DefinitionBody, not SAM's Auth"
    for operations in api["DefinitionBody"]["paths"].values():
        for operation in operations.values():
            operation.pop("security", None)
    api["Auth"] = {"DefaultAuthorizer": "AWS_IAM", "InvokeRole": "NONE"}
    assert check_cors_preflight(Stack("sam", sam_transform(raw), contract)) != []
    api["Auth"]["AddDefaultAuthorizerToCorsPreflight"] = False
    assert check_cors_preflight(Stack("sam", sam_transform(raw), contract)) == []


def test_cors_gateway_response_check_catches_an_undeployed_response(cdk):
    # CDK's gateway responses are resources: a deployment made before one leaves it out of the stage.
    for name in cdk.resources("AWS::ApiGateway::Deployment"):
        resource = b.resource(cdk, name)
        resource["DependsOn"] = [d for d in resource.get("DependsOn", []) if b.resource(cdk, d)["Type"] != "AWS::ApiGateway::GatewayResponse"]
    assert check_cors_gateway_responses(cdk) != []


# --- a deployment an auditor signs off -------------------------------------------------------------

# The deploy-time interface they add, the same in both templates (and the outputs).
AUDIT_PARAMETERS = ["AlarmActionArn", ACCOUNT_ROLE_PARAMETER, LAKE_ACCESS_PARAMETER, WAF_PARAMETER, WAF_RATE_PARAMETER]
AUDIT_OUTPUTS = ["AlarmTopicArn", "LakeAuditBucketName", "RestApiAccessLogGroupName", "WebSocketAccessLogGroupName", "RestApiWebAclArn"]


def test_the_audit_parameters_and_outputs_are_the_same_in_both_templates(sam, cdk):
    for name in AUDIT_PARAMETERS:
        assert sam.template["Parameters"][name] == cdk.template["Parameters"][name], name
    for name in AUDIT_OUTPUTS:
        assert name in sam.template["Outputs"] and name in cdk.template["Outputs"], name
        assert sam.template["Outputs"][name]["Description"] == cdk.template["Outputs"][name]["Description"], name
        assert sam.template["Outputs"][name].get("Condition") == cdk.template["Outputs"][name].get("Condition"), name
    assert set(sam.template["Parameters"]) == set(cdk.template["Parameters"])
    assert set(sam.template["Outputs"]) == set(cdk.template["Outputs"])
    assert set(sam.template["Conditions"]) == set(cdk.template["Conditions"])


def test_the_record_attributes_are_read_from_the_code(contract):
    names = transaction_attributes()
    assert names["PRINCIPAL"] == "principal" and names["REQUEST_HASH"] == "requestHash"
    writes = record_writes(contract)
    # The contract's attributes of a record (twopc::record::RECORD_ATTRIBUTES) are those of the table.
    assert writes["attributes"] == set(names.values())
    # What each writer is refused, derived from the code: the sweeper the coordinator's own attributes
    # (a record's creation, the hold, a retried attempt's age and chain, the operators' audit), a
    # participant's update all but
    # its abort of an expired owner.
    assert writes["attributes"] - writes["recovery"] == {
        "principal", "requestHash", "executionId", "holdMs", "holdUntil",
        "startedAt", "attempt", "firstTransactionId", "retriedAs", "refusedForContention", "ageClaimedBy", "ageOf",
        "bodyHash", "audit",
    }
    assert writes["ownerAbort"] == {"transactionId", "status", "updatedAt", "reason", "sweepError"}
    # The sweeper and the coordinator abort an expired owner (a participant no longer may, issue 42): an
    # owner's abort is a write of recovery.
    assert writes["ownerAbort"] <= writes["recovery"]


def _code_writes(stack, writer: str, attribute: str) -> None:
    """The stack's contract (a copy: the session's is shared) as if `writer`'s code wrote `attribute` too."""
    stack.code = copy.deepcopy(stack.code)
    stack.code[RECORD_WRITES][writer].append(attribute)


@pytest.mark.parametrize(
    "writer, attribute, who",
    [("recovery", "holdUntil", "sweeper"), ("recovery", "principal", "sweeper")],
)
def test_the_record_writes_check_catches_a_write_the_code_starts(stack, writer, attribute, who):
    # The code starts writing an attribute the deployment refuses that writer: every local test passes
    # (DynamoDB Local enforces no IAM), only this check and AWS see it.
    assert check_record_writes(stack) == []
    _code_writes(stack, writer, attribute)
    problems = check_record_writes(stack)
    assert problems and all(p.startswith(who) for p in problems), problems
    assert any(f"refuses ['{attribute}'], which its code writes" in p for p in problems), problems


def _lake(stack) -> str:
    return _lake_buckets(stack)[0]


def _alarm_topic_resource(stack) -> str:
    return b.of_type(stack, "AWS::SNS::Topic")[0]


def _key_policy(stack) -> dict:
    return b.props(stack, b.of_type(stack, "AWS::KMS::Key")[0])["KeyPolicy"]


def _access_settings(stack, kind: str) -> dict:
    if kind == "rest":
        return b.props(stack, b.stage_of_rest_api(stack))["AccessLogSetting"]
    return b.props(stack, b.only(stack, "AWS::ApiGatewayV2::Stage"))["AccessLogSettings"]


def _access_log_group(stack, kind: str) -> str:
    return _access_settings(stack, kind)["DestinationArn"]["Fn::GetAtt"][0]


def _audit_policy_statements(stack) -> list:
    bucket = _lake(stack)
    for name in b.of_type(stack, "AWS::S3::BucketPolicy"):
        if b.props(stack, name)["Bucket"] != b.ref(bucket):
            return b.props(stack, name)["PolicyDocument"]["Statement"]
    raise AssertionError("no audit bucket policy")


def _trail(stack) -> dict:
    return b.props(stack, b.of_type(stack, "AWS::CloudTrail::Trail")[0])


def _transactions_statement(stack, binary: str, action: str) -> dict:
    return b.statement(stack, binary, action, where='"${%s.Arn}"' % b.table(stack, "transactions"))


def _remove_statement(stack, binary: str, action: str) -> None:
    """Removes the raw statement granting `action` on the transactions table to a function of `binary`."""
    target = _transactions_statement(stack, binary, action)
    for statements in b.raw_statements(stack, b.role_of(stack, b.function(stack, binary))):
        if any(entry is target for entry in statements):
            statements[:] = [entry for entry in statements if entry is not target]


def _attributes(statement: dict) -> list:
    return statement["Condition"]["ForAllValues:StringNotEquals"]["dynamodb:Attributes"]


def _permissions_on(stack, binary: str) -> list[str]:
    """The raw permissions on the functions of a binary (evaluated with tokens on: the authorizer's)."""
    jwt = with_jwt(stack)
    targets = set(b.functions_of(jwt, binary))
    return [
        name
        for name in b.of_type(stack, "AWS::Lambda::Permission")
        if b.function_target(jwt, jwt.resolve(b.props(stack, name).get("FunctionName"))) in targets
    ]


def _add_resource(stack, name: str, kind: str, props: dict) -> None:
    stack.template["Resources"][name] = {"Type": kind, "Properties": props}


def _web_acl(stack) -> dict:
    return b.props(stack, b.of_type(stack, "AWS::WAFv2::WebACL")[0])


def _metric_filter(stack, metric: str) -> dict:
    """The raw properties of the metric filter whose metric is `metric`."""
    for name in b.of_type(stack, "AWS::Logs::MetricFilter"):
        if any(t.get("MetricName") == metric for t in b.props(stack, name)["MetricTransformations"]):
            return b.props(stack, name)
    raise AssertionError(f"no metric filter of {metric}")


def _4xx_alarm_on_api_gateways_count(stack) -> None:
    """The 4xx alarm back on API Gateway's 4XXError, which counts the protocol's 409 and 404 too."""
    metrics = b.props(stack, b.alarm_on(stack, "RestApiClientErrors"))["Metrics"]
    count = next(m for m in metrics if '"Count"' in json.dumps(m))
    errors = next(m for m in metrics if '"RestApiClientErrors"' in json.dumps(m))
    errors["MetricStat"]["Metric"] = {**copy.deepcopy(count["MetricStat"]["Metric"]), "MetricName": "4XXError"}


BREAKAGES.update(
    {
        # the alarm topic: the stack's own, encrypted, unless one is given
        "alarm-topic-unencrypted": ("alarm-topic", lambda s: b.props(s, _alarm_topic_resource(s)).pop("KmsMasterKeyId")),
        "alarm-topic-missing": ("alarm-topic", lambda s: s.template["Resources"].pop(_alarm_topic_resource(s))),
        "alarm-topic-under-the-aws-managed-key": (
            "alarm-topic",
            lambda s: b.props(s, _alarm_topic_resource(s)).update(KmsMasterKeyId="alias/aws/sns"),
        ),
        "alarm-topic-key-closed-to-cloudwatch": (
            "alarm-topic",
            lambda s: _key_policy(s).update(Statement=[x for x in _key_policy(s)["Statement"] if "cloudwatch" not in json.dumps(x)]),
        ),
        "alarm-topic-key-not-rotated": ("alarm-topic", lambda s: b.props(s, b.of_type(s, "AWS::KMS::Key")[0]).pop("EnableKeyRotation")),
        "alarm-topic-created-with-a-given-topic": ("alarm-topic", lambda s: b.resource(s, _alarm_topic_resource(s)).pop("Condition")),
        "alarm-topic-output-missing": ("alarm-topic", lambda s: s.template["Outputs"].pop("AlarmTopicArn")),
        "alarm-topic-output-the-parameter": (
            "alarm-topic",
            lambda s: s.template["Outputs"]["AlarmTopicArn"].update(Value=b.ref("AlarmActionArn")),
        ),
        "alarm-silent-without-a-given-topic": (
            "alarm-topic",
            lambda s: b.props(s, b.alarm_on(s, "SweepErrors")).update(AlarmActions=[b.ref("AlarmActionArn")]),
        ),
        # the new alarms
        "no-sweep-errors-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "SweepErrors"))),
        "no-sweeper-running-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "Invocations", b.function(s, "sweeper")))),
        "sweeper-running-alarm-missing-data-fine": (
            "alarms",
            lambda s: b.props(s, b.alarm_on(s, "Invocations", b.function(s, "sweeper"))).update(TreatMissingData="notBreaching"),
        ),
        "sweeper-running-alarm-over-an-hour": (
            "alarms",
            lambda s: b.props(s, b.alarm_on(s, "Invocations", b.function(s, "sweeper"))).update(Period=3600),
        ),
        "no-4xx-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "RestApiClientErrors"))),
        "4xx-alarm-a-count-not-a-rate": (
            "alarms",
            lambda s: b.props(s, b.alarm_on(s, "RestApiClientErrors")).update(
                Metrics=[m for m in b.props(s, b.alarm_on(s, "RestApiClientErrors"))["Metrics"] if "Count" not in json.dumps(m)]
            ),
        ),
        "4xx-alarm-on-4XXError-counting-409": ("alarms", _4xx_alarm_on_api_gateways_count),
        "4xx-filter-counting-409": (
            "alarms",
            lambda s: _metric_filter(s, "RestApiClientErrors").update(FilterPattern='{ $.status = "4*" && $.status != "404" }'),
        ),
        "4xx-filter-ignoring-403": (
            "alarms",
            lambda s: _metric_filter(s, "RestApiClientErrors").update(
                FilterPattern='{ $.status = "4*" && $.status != "409" && $.status != "404" && $.status != "403" }'
            ),
        ),
        "4xx-filter-on-another-log": (
            "alarms",
            lambda s: _metric_filter(s, "RestApiClientErrors").update(LogGroupName=b.ref(_access_log_group(s, "websocket"))),
        ),
        "no-429-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "RestApiThrottled"))),
        "429-filter-on-another-status": (
            "alarms",
            lambda s: _metric_filter(s, "RestApiThrottled").update(FilterPattern='{ $.status = "403" }'),
        ),
        "429-filter-on-another-log": (
            "alarms",
            lambda s: _metric_filter(s, "RestApiThrottled").update(LogGroupName=b.ref(_access_log_group(s, "websocket"))),
        ),
        "no-websocket-execution-errors-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "ExecutionError"))),
        "no-websocket-integration-errors-alarm": ("alarms", lambda s: s.template["Resources"].pop(b.alarm_on(s, "IntegrationError"))),
        # the APIs' access logs
        "rest-stage-without-access-log": ("access-logs", lambda s: b.props(s, b.stage_of_rest_api(s)).pop("AccessLogSetting")),
        "websocket-stage-without-access-log": (
            "access-logs",
            lambda s: b.props(s, b.only(s, "AWS::ApiGatewayV2::Stage")).pop("AccessLogSettings"),
        ),
        "access-log-without-status": (
            "access-logs",
            lambda s: _access_settings(s, "rest").update(Format=_access_settings(s, "rest")["Format"].replace('"$context.status"', '"-"')),
        ),
        "access-log-without-the-jwt-principal": (
            "access-logs",
            lambda s: _access_settings(s, "websocket").update(
                Format=_access_settings(s, "websocket")["Format"].replace("$context.authorizer.principal", "-")
            ),
        ),
        "access-log-without-the-route": (
            "access-logs",
            lambda s: _access_settings(s, "websocket").update(Format=_access_settings(s, "websocket")["Format"].replace("$context.routeKey", "-")),
        ),
        "access-log-without-latency": (
            "access-logs",
            lambda s: _access_settings(s, "rest").update(Format=_access_settings(s, "rest")["Format"].replace("$context.responseLatency", "-")),
        ),
        "access-log-not-json": ("access-logs", lambda s: _access_settings(s, "rest").update(Format="$context.requestId $context.status")),
        # free text: the error message only as API Gateway quotes it, no path
        "access-log-error-message-in-quotes": (
            "access-logs",
            lambda s: _access_settings(s, "rest").update(
                Format=_access_settings(s, "rest")["Format"].replace("$context.error.messageString", '"$context.error.messageString"')
            ),
        ),
        "access-log-unescaped-error-message": (
            "access-logs",
            lambda s: _access_settings(s, "websocket").update(
                Format=_access_settings(s, "websocket")["Format"].replace("$context.error.messageString", '"$context.error.message"')
            ),
        ),
        "access-log-with-the-path": (
            "access-logs",
            lambda s: _access_settings(s, "rest").update(
                Format=_access_settings(s, "rest")["Format"].replace("{", '{"path":"$context.path",', 1)
            ),
        ),
        "access-log-into-a-functions-log-group": (
            "access-logs",
            lambda s: _access_settings(s, "rest").update(
                DestinationArn=b.getatt(b.props(s, b.function(s, "coordinator"))["LoggingConfig"]["LogGroup"]["Ref"], "Arn")
            ),
        ),
        "access-log-retention-hard-coded": ("access-logs", lambda s: b.props(s, _access_log_group(s, "rest")).update(RetentionInDays=30)),
        "no-api-gateway-account": ("access-logs", lambda s: [s.template["Resources"].pop(n) for n in b.of_type(s, "AWS::ApiGateway::Account")]),
        "api-gateway-role-deleted-with-the-stack": (
            "access-logs",
            lambda s: b.resource(s, b.props(s, b.of_type(s, "AWS::ApiGateway::Account")[0])["CloudWatchRoleArn"]["Fn::GetAtt"][0]).update(
                DeletionPolicy="Delete"
            ),
        ),
        "access-log-group-before-the-account": ("access-logs", lambda s: b.props(s, _access_log_group(s, "websocket")).pop("Tags")),
        "account-settings-changed-with-existing": (
            "access-logs",
            lambda s: b.resource(s, b.of_type(s, "AWS::ApiGateway::Account")[0]).pop("Condition"),
        ),
        "account-role-parameter-default": (
            "access-logs",
            lambda s: s.template["Parameters"][ACCOUNT_ROLE_PARAMETER].update(Default="Existing"),
        ),
        # the lake: versions, and who read or wrote it
        "lake-unversioned": ("lake-versions-and-access", lambda s: b.props(s, _lake(s)).pop("VersioningConfiguration")),
        "lake-versions-kept-for-ever": (
            "lake-versions-and-access",
            lambda s: b.props(s, _lake(s))["LifecycleConfiguration"].update(
                Rules=[r for r in b.props(s, _lake(s))["LifecycleConfiguration"]["Rules"] if "NoncurrentVersionExpiration" not in r]
            ),
        ),
        "lake-without-server-access-logs": ("lake-versions-and-access", lambda s: b.props(s, _lake(s)).pop("LoggingConfiguration")),
        "lake-logs-into-itself": (
            "lake-versions-and-access",
            lambda s: b.props(s, _lake(s)).update(LoggingConfiguration={"DestinationBucketName": b.ref(_lake(s))}),
        ),
        "lake-log-bucket-closed-to-logging": (
            "lake-versions-and-access",
            lambda s: [
                x.pop("Fn::If") for x in _audit_policy_statements(s) if "logging.s3.amazonaws.com" in json.dumps(x)
            ],
        ),
        "lake-without-trail": ("lake-versions-and-access", lambda s: [s.template["Resources"].pop(n) for n in b.of_type(s, "AWS::CloudTrail::Trail")]),
        "lake-trail-without-validation": ("lake-versions-and-access", lambda s: _trail(s).update(EnableLogFileValidation=False)),
        "lake-trail-on-management-events-only": ("lake-versions-and-access", lambda s: _trail(s).pop("AdvancedEventSelectors")),
        "lake-trail-and-server-logs-together": (
            "lake-versions-and-access",
            lambda s: b.resource(s, b.of_type(s, "AWS::CloudTrail::Trail")[0]).pop("Condition"),
        ),
        "lake-access-parameter-values": (
            "lake-versions-and-access",
            lambda s: s.template["Parameters"][LAKE_ACCESS_PARAMETER].update(AllowedValues=["S3ServerAccessLogs", "None"]),
        ),
        # the narrower writes of transaction records
        "sweeper-writes-records-unconditionally": (
            "record-writes",
            lambda s: _transactions_statement(s, "sweeper", "dynamodb:PutItem").pop("Condition"),
        ),
        "sweeper-may-write-the-principal": (
            "record-writes",
            lambda s: _attributes(_transactions_statement(s, "sweeper", "dynamodb:UpdateItem")).remove("principal"),
        ),
        "sweeper-refused-its-sweep-error": (
            "record-writes",
            lambda s: _attributes(_transactions_statement(s, "sweeper", "dynamodb:UpdateItem")).append("sweepError"),
        ),
        "sweeper-condition-on-every-value": (
            "record-writes",
            lambda s: _transactions_statement(s, "sweeper", "dynamodb:UpdateItem").update(
                Condition={"StringNotEquals": {"dynamodb:Attributes": ["principal"]}}
            ),
        ),
        # issue 42: a participant may read records and put only its own one-phase commits' records
        "participant-may-update-records": (
            "record-writes",
            lambda s: _transactions_statement(s, "participant", "dynamodb:GetItem").update(
                Action=["dynamodb:GetItem", "dynamodb:UpdateItem"]
            ),
        ),
        "participant-puts-any-record": (
            "record-writes",
            lambda s: _transactions_statement(s, "inventory", "dynamodb:PutItem").pop("Condition"),
        ),
        "participant-puts-under-every-prefix": (
            "record-writes",
            lambda s: _transactions_statement(s, "participant", "dynamodb:PutItem").update(
                Condition={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["*"]}}
            ),
        ),
        # a deny list naming what the code writes: the end of a record (recovery)
        "sweeper-refused-the-retention-clock": (
            "record-writes",
            lambda s: _attributes(_transactions_statement(s, "sweeper", "dynamodb:UpdateItem")).append("expireAt"),
        ),
        # the code writing what the deployment refuses (the contract as if recovery wrote the hold)
        "recovery-writes-the-hold": ("record-writes", lambda s: _code_writes(s, "recovery", "holdUntil")),
        # who may invoke each function
        "coordinator-invokable-by-anyone": (
            "invokers",
            lambda s: _add_resource(s, "ExtraPermission", "AWS::Lambda::Permission",
                                    {"Action": "lambda:InvokeFunction", "FunctionName": b.ref(b.function(s, "coordinator")), "Principal": "*"}),
        ),
        "coordinator-permission-from-any-api": (
            "invokers",
            lambda s: [b.props(s, p).pop("SourceArn") for p in _permissions_on(s, "coordinator")[:1]],
        ),
        "coordinator-permission-for-the-websocket-api": (
            "invokers",
            lambda s: [
                b.props(s, p).update(SourceArn={"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${%s}/*" % b.only(s, "AWS::ApiGatewayV2::Api")})
                for p in _permissions_on(s, "coordinator")[:1]
            ],
        ),
        "connections-invokable-from-the-rest-api": (
            "invokers",
            lambda s: [
                b.props(s, p).update(SourceArn={"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${%s}/*" % b.only(s, "AWS::ApiGateway::RestApi")})
                for p in _permissions_on(s, "connections")
            ],
        ),
        "connections-without-permission": ("invokers", lambda s: [s.template["Resources"].pop(p) for p in _permissions_on(s, "connections")]),
        "sweeper-invokable-by-another-rule": (
            "invokers",
            lambda s: [b.props(s, p).update(SourceArn="arn:aws:events:us-east-1:123456789012:rule/other") for p in _permissions_on(s, "sweeper")],
        ),
        "sweeper-invokable-by-sns": (
            "invokers",
            lambda s: [b.props(s, p).update(Principal="sns.amazonaws.com") for p in _permissions_on(s, "sweeper")],
        ),
        "stream-processor-invokable": (
            "invokers",
            lambda s: _add_resource(s, "ExtraPermission", "AWS::Lambda::Permission",
                                    {"Action": "lambda:InvokeFunction", "FunctionName": b.getatt(b.function(s, "stream-processor"), "Arn"),
                                     "Principal": "events.amazonaws.com", "SourceArn": "arn:aws:events:us-east-1:123456789012:rule/x"}),
        ),
        "authorizer-invokable-for-routes": (
            "invokers",
            lambda s: [
                b.props(s, p).update(SourceArn={"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${%s}/*" % b.only(s, "AWS::ApiGateway::RestApi")})
                for p in _permissions_on(s, "authorizer")
            ],
        ),
        "authorizer-invokable-by-the-account": (
            "invokers",
            lambda s: [b.props(s, p).update(Principal=b.ref("AWS::AccountId")) for p in _permissions_on(s, "authorizer")[:1]],
        ),
        "participant-invokable-by-the-connections-role": (
            "invokers",
            lambda s: [b.props(s, p).update(Principal=b.role_arn(s, "connections")) for p in b.participant_permissions(s, 2, "sweeper")],
        ),
        "a-role-may-invoke-the-coordinator": (
            "invokers",
            lambda s: b.raw_statements(s, b.role_of(s, b.function(s, "connections")))[0].append(
                {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": b.getatt(b.function(s, "coordinator"), "Arn")}
            ),
        ),
        "a-function-url": (
            "invokers",
            lambda s: _add_resource(s, "CoordinatorUrl", "AWS::Lambda::Url", {"AuthType": "NONE", "TargetFunctionArn": b.getatt(b.function(s, "coordinator"), "Arn")}),
        ),
        "a-mapping-into-the-coordinator": (
            "invokers",
            lambda s: b.props(s, b.mapping_of(s, "service-a-data")).update(FunctionName=b.ref(b.function(s, "coordinator"))),
        ),
        "websocket-api-id-missing": ("invokers", lambda s: b.variables(s, "connections").pop("WEBSOCKET_API_ID")),
        "websocket-api-id-hard-coded": ("invokers", lambda s: b.variables(s, "connections").update(WEBSOCKET_API_ID="abc123defg")),
        "websocket-api-id-the-rest-api": (
            "invokers",
            lambda s: b.variables(s, "connections").update(WEBSOCKET_API_ID=b.ref(b.only(s, "AWS::ApiGateway::RestApi"))),
        ),
        # the WAF
        "waf-on-by-default": ("waf", lambda s: s.template["Parameters"][WAF_PARAMETER].update(Default="true")),
        "waf-rate-parameter-missing": ("waf", lambda s: s.template["Parameters"].pop(WAF_RATE_PARAMETER)),
        "waf-without-rate-rule": (
            "waf",
            lambda s: _web_acl(s).update(Rules=[r for r in _web_acl(s)["Rules"] if "RateBasedStatement" not in json.dumps(r)]),
        ),
        "waf-rate-hard-coded": (
            "waf",
            lambda s: [r["Statement"]["RateBasedStatement"].update(Limit=2000) for r in _web_acl(s)["Rules"] if "RateBasedStatement" in r["Statement"]],
        ),
        "waf-rate-counted-only": (
            "waf",
            lambda s: [r.update(Action={"Count": {}}) for r in _web_acl(s)["Rules"] if "RateBasedStatement" in r["Statement"]],
        ),
        "waf-not-associated": ("waf", lambda s: [s.template["Resources"].pop(n) for n in b.of_type(s, "AWS::WAFv2::WebACLAssociation")]),
        "waf-unlogged": ("waf", lambda s: [s.template["Resources"].pop(n) for n in b.of_type(s, "AWS::WAFv2::LoggingConfiguration")]),
        "waf-without-its-condition": ("waf", lambda s: b.resource(s, b.of_type(s, "AWS::WAFv2::WebACL")[0]).pop("Condition")),
    }
)


def _age_token_secret(stack) -> str:
    """The logical id of the secret the coordinator's AGE_TOKEN_KEY names."""
    return b.variables(stack, "coordinator")["AGE_TOKEN_KEY"]["Ref"]


def _reads_the_age_token_key(stack, function_id: str) -> None:
    """The role of the function (by logical id) may also read the coordinator's age-token key."""
    b.raw_statements(stack, b.role_of(stack, function_id))[0].append(
        {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": b.ref(_age_token_secret(stack))}
    )


BREAKAGES.update(
    {
        # issue 42: the coordinator's own age-token key, read by its role alone
        "age-token-key-missing": ("age-token-key", lambda s: b.variables(s, "coordinator").pop("AGE_TOKEN_KEY")),
        "age-token-key-local": ("age-token-key", lambda s: b.variables(s, "coordinator").update(AGE_TOKEN_KEY=LOCAL_KEYS)),
        "age-token-key-a-participants-key": (
            "age-token-key",
            lambda s: b.variables(s, "coordinator").update(AGE_TOKEN_KEY=b.ref(b.key_secret(s, 0))),
        ),
        "age-token-key-written-in-the-template": (
            "age-token-key",
            lambda s: [
                b.props(s, _age_token_secret(s)).pop("GenerateSecretString"),
                b.props(s, _age_token_secret(s)).update(SecretString='{"id": "k1", "secret": "0123456789abcdef0123456789abcdef"}'),
            ],
        ),
        "age-token-key-too-short": (
            "age-token-key",
            lambda s: b.props(s, _age_token_secret(s))["GenerateSecretString"].update(PasswordLength=16),
        ),
        "age-token-key-read-by-the-sweeper": ("age-token-key", lambda s: _reads_the_age_token_key(s, b.function(s, "sweeper"))),
        "age-token-key-read-by-a-participant": (
            "age-token-key",
            lambda s: _reads_the_age_token_key(s, b.participant(s, 0)["function"]),
        ),
        "age-token-key-unreadable-by-the-coordinator": (
            "age-token-key",
            lambda s: b.statement(s, "coordinator", "secretsmanager:GetSecretValue", where=_age_token_secret(s)).update(
                Resource=[OTHER_SECRET]
            ),
        ),
    }
)
