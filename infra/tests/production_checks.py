"""Checks of the production details infra/DEPLOY.md describes (throttling, alarms, dashboard, reserved
concurrency, deletion protection, the lake's compression and Glue table, logging, tracing, the
participants' `live` aliases, the REST API's CORS, the WebSocket API's answers to subscribe and
unsubscribe, the connections function's cap on topics, the fan-out's ride through an outage and its
replay of what it gave up on, who may invoke a participant: the message keys and the participants'
resource policies, held transactions: their routes and the coordinator's hold policy), on a deployed template (SAM after the transform, or CDK), found by
meaning as in template_checks.py. Each returns a list of problems (empty: fine).

Where a property is wired to a parameter, the check evaluates the template with other values of that
parameter too, so a hard-coded value that happens to equal the default does not pass.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cfn import REPO, Stack, as_list, att_id, number, ref_id
from system import (
    ALIAS_NAME,
    PARTICIPANT_BINARY,
    alias_references,
    aliases,
    allow_statements,
    binary_of,
    environment,
    function_target,
    functions,
    functions_of,
    granted,
    json_variable,
    log_group_of,
    participant_deployments,
    participant_functions,
    resource_binaries,
    role_of,
    table_ids,
)
from template_checks import (
    AUTHORIZER_BINARY,
    CREATE_ROUTE,
    HOLD_ROUTES,
    JWT_AUDIENCE_EXAMPLE,
    JWT_AUDIENCE_PARAMETER,
    JWT_ISSUER_EXAMPLE,
    JWT_ISSUER_PARAMETER,
    METRICS_NAMESPACE,
    OUTCOMES_BINARY,
    SDK_CALLS,
    STREAM_READERS,
    check_participants_cannot_decide,
    connect_authorization_problems,
    expected_rest_authorization,
    jwt_enabled,
    rest_authorization_problems,
    rest_methods,
    with_jwt,
)

# ----------------------------------------------------------------------------------------------
# Parameters every template offers (the same deploy-time interface for SAM and CDK)
# ----------------------------------------------------------------------------------------------

THROTTLING_PARAMETERS = {"ApiThrottlingRateLimit": 100, "ApiThrottlingBurstLimit": 200}
RESERVED_CONCURRENCY_PARAMETERS = {
    "coordinator": ("CoordinatorReservedConcurrency", 100),
    "sweeper": ("SweeperReservedConcurrency", 2),
    "stream-processor": ("StreamProcessorReservedConcurrency", 10),
}
LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"]
TRACING_MODES = ["PassThrough", "Active"]
SNS_TOPIC = "arn:aws:sns:us-east-1:123456789012:operations"


def code_metrics(stack: Stack) -> dict:
    """The metrics the code writes (CloudWatch embedded metric format, namespace METRICS_NAMESPACE),
    from `twopc::telemetry` through the contract: the only names an alarm or a graph may watch."""
    return stack.code["metrics"]


def written_metric_names(stack: Stack) -> set[str]:
    metrics = code_metrics(stack)
    return (
        set(metrics["coordinatorCounts"])
        | set(metrics["coordinatorLatencies"])
        | set(metrics["sweeperCounts"])
        | set(metrics.get("sweeperGauges", []))
        | set(metrics.get("streamProcessorCounts", []))
    )


# The protocol's clock margin M (`twopc::clock::CLOCK_MARGIN_MS`): participants take no lock after
# deadline + M by their clock, resolvers act after expiry + 2M. The coordinator's ClockSkew metric
# (each answered prepare: how far the participant's clock is from the coordinator's) is alarmed at a
# fifth of M, well before a skew costs aborts.
CLOCK_SOURCE = REPO / "functions" / "twopc" / "src" / "clock.rs"
CLOCK_SKEW_METRIC = "ClockSkew"
CLOCK_SKEW_ALARM_FRACTION = 5
# The stream processor's count of the records it gave up on and dead-lettered itself.
UNPROCESSABLE_METRIC = "UnprocessableRecords"
# The sweeper's count of the open transactions it could not finish (twopc::telemetry::STUCK_TRANSACTIONS).
STUCK_METRIC = "StuckTransactions"
SWEEP_ERRORS_METRIC = "SweepErrors"
THROTTLED_STATUS = "429"


def _rest_access_log_filters(stack: Stack, metric: Any):
    """The filter patterns of the metric filters on a REST stage's access log that publish `metric`."""
    for name in stack.resources("AWS::Logs::MetricFilter"):
        props = stack.props(name)
        group = ref_id(props.get("LogGroupName"))
        logged_by_rest = any(
            att_id((stack.props(s).get("AccessLogSetting") or {}).get("DestinationArn"), "Arn") == group
            for s in stack.resources("AWS::ApiGateway::Stage")
        )
        publishes = any(
            t.get("MetricNamespace") == metric.namespace and t.get("MetricName") == metric.name
            for t in as_list(props.get("MetricTransformations"))
        )
        if logged_by_rest and publishes:
            yield str(props.get("FilterPattern"))


def _throttled_metric(stack: Stack, metric: Any) -> bool:
    """Whether a metric is the count of a metric filter matching the REST access log's status 429."""
    return any(
        re.search(r'\$\.status\s*=\s*"?%s"?' % THROTTLED_STATUS, pattern)
        for pattern in _rest_access_log_filters(stack, metric)
    )


# The REST API's 4xx answers that are no normal outcome, counted by a metric filter on its access log:
# every 4xx but these, the protocol's own answers (409: ABORTED when a participant refused, NOT_HELD, a
# decision already taken, so contention alone makes them; 404: GET of an unknown, expired or another
# caller's id). API Gateway's 4XXError counts them all.
CLIENT_ERROR_STATUSES_NOT_COUNTED = {"404", "409"}


def _client_errors_metric(stack: Stack, metric: Any) -> bool:
    """Whether a metric is the count of a metric filter on a REST access log matching every status 4xx
    but exactly those of CLIENT_ERROR_STATUSES_NOT_COUNTED."""
    return any(
        re.search(r'\$\.status\s*=\s*"4\*"', pattern)
        and "||" not in pattern
        and set(re.findall(r'\$\.status\s*!=\s*"?(\d+)"?', pattern)) == CLIENT_ERROR_STATUSES_NOT_COUNTED
        for pattern in _rest_access_log_filters(stack, metric)
    )


# The fan-out (the twopc-fanout crate): the stream processor's and the connections function's code.
FANOUT_SOURCES = REPO / "functions" / "fanout" / "src"
# The stream processor's action that replays its dead-letter queue (`twopc_fanout::replay::ACTION`).
REPLAY_SOURCE = FANOUT_SOURCES / "replay.rs"
# The dead-letter queue's client (`twopc_fanout::replay`: SqsDeadLetters), whose SQS calls are granted.
DEAD_LETTER_QUEUE_SOURCE = FANOUT_SOURCES / "replay" / "sources.rs"
# The fan-out's variable names: in `twopc::environment`, which lists every function's (twopc-fanout
# depends on twopc, so twopc names them); their defaults are the fan-out's own.
ENVIRONMENT_SOURCE = REPO / "functions" / "twopc" / "src" / "environment.rs"


def clock_margin_ms(source: Path = CLOCK_SOURCE) -> int:
    names = rust_constants(source)
    if "CLOCK_MARGIN_MS" not in names:
        raise AssertionError(f"no constant CLOCK_MARGIN_MS in {source}")
    return int(names["CLOCK_MARGIN_MS"])


def replay_contract(source: Path = REPLAY_SOURCE) -> dict[str, Any]:
    """The replay's action name and the largest dead-letter message, from `twopc_fanout::replay`."""
    names = rust_constants(source)
    missing = [n for n in ["ACTION", "MAX_DEAD_LETTER_BYTES"] if n not in names]
    if missing:
        raise AssertionError(f"no constant {missing} in {source}")
    return {"action": str(names["ACTION"]), "maxDeadLetterBytes": int(names["MAX_DEAD_LETTER_BYTES"])}

# The lake's record, one JSON object per line: the fields of this struct, in serde's camelCase.
LAKE_RECORD_SOURCE = FANOUT_SOURCES / "decide.rs"
LAKE_RECORD_STRUCT = "ChangeRecord"
# The lake's other kind of line, one per committed transaction: its fields are columns of the same table.
LAKE_TRANSACTION_STRUCT = "TransactionLine"
JSON_SERDE = "org.openx.data.jsonserde.JsonSerDe"

# Cross-origin access to the REST API: the values of `twopc::cors`, read from its source, with the
# variable that gives the coordinator the allowed origin.
CORS_SOURCE = REPO / "functions" / "twopc" / "src" / "cors.rs"
# Each module of twopc names the variables it reads (`twopc::config` keeps only the readers).
CONNECTIONS_SOURCE = FANOUT_SOURCES / "connections.rs"
HOLD_SOURCE = REPO / "functions" / "twopc" / "src" / "hold.rs"
AGE_SOURCE = REPO / "functions" / "twopc" / "src" / "age.rs"
CORS_PARAMETER = "CorsAllowOrigin"
# A value the parameter may take besides its default: each wired value must follow it.
CORS_OTHER_ORIGIN = "https://app.example.com"
# The gateway responses that must carry the origin (every other type falls back to one of them).
CORS_GATEWAY_RESPONSES = ["DEFAULT_4XX", "DEFAULT_5XX"]


def _parameter(stack: Stack, name: str, default: Any, allowed: list[str] | None = None) -> list[str]:
    definition = stack.template.get("Parameters", {}).get(name)
    if definition is None:
        return [f"no parameter {name}"]
    problems = []
    if str(definition.get("Default")) != str(default):
        problems.append(f"parameter {name}: default {definition.get('Default')!r}, expected {default!r}")
    if allowed is not None and [str(v) for v in definition.get("AllowedValues", [])] != allowed:
        problems.append(f"parameter {name}: allowed values {definition.get('AllowedValues')}, expected {allowed}")
    return problems


def _same_number(value: Any, expected: Any) -> bool:
    return number(value) is not None and number(value) == number(expected)


# ----------------------------------------------------------------------------------------------
# 1. Throttling on both API stages
# ----------------------------------------------------------------------------------------------


def _rest_stage_throttling(stack: Stack, stage: str, rate: str, burst: str) -> list[str]:
    settings = [
        s
        for s in as_list(stack.props(stage).get("MethodSettings"))
        if s.get("ResourcePath") == "/*" and s.get("HttpMethod") == "*"
    ]
    if not settings:
        return [f"{stage}: no method settings for /*/* (every method)"]
    problems = []
    for setting in settings:
        if not _same_number(setting.get("ThrottlingRateLimit"), rate):
            problems.append(f"{stage}: ThrottlingRateLimit {setting.get('ThrottlingRateLimit')!r}, not ApiThrottlingRateLimit ({rate})")
        if not _same_number(setting.get("ThrottlingBurstLimit"), burst):
            problems.append(f"{stage}: ThrottlingBurstLimit {setting.get('ThrottlingBurstLimit')!r}, not ApiThrottlingBurstLimit ({burst})")
    return problems


def _websocket_stage_throttling(stack: Stack, stage: str, rate: str, burst: str) -> list[str]:
    settings = stack.props(stage).get("DefaultRouteSettings", {})
    problems = []
    if not _same_number(settings.get("ThrottlingRateLimit"), rate):
        problems.append(f"{stage}: DefaultRouteSettings.ThrottlingRateLimit {settings.get('ThrottlingRateLimit')!r}, not ApiThrottlingRateLimit ({rate})")
    if not _same_number(settings.get("ThrottlingBurstLimit"), burst):
        problems.append(f"{stage}: DefaultRouteSettings.ThrottlingBurstLimit {settings.get('ThrottlingBurstLimit')!r}, not ApiThrottlingBurstLimit ({burst})")
    return problems


def check_throttling(stack: Stack) -> list[str]:
    """Both stages throttle every route at the rate and burst of the two parameters."""
    problems = [p for name, default in THROTTLING_PARAMETERS.items() for p in _parameter(stack, name, default)]
    # The defaults, and other values, to see that the stages follow the parameters.
    for rate, burst in [("100", "200"), ("7", "9")]:
        evaluated = stack.with_parameters(ApiThrottlingRateLimit=rate, ApiThrottlingBurstLimit=burst)
        rest, websocket = evaluated.resources("AWS::ApiGateway::Stage"), evaluated.resources("AWS::ApiGatewayV2::Stage")
        if not rest or not websocket:
            problems.append(f"expected a REST and a WebSocket stage, found {sorted(rest)} and {sorted(websocket)}")
        for stage in rest:
            problems += _rest_stage_throttling(evaluated, stage, rate, burst)
        for stage in websocket:
            problems += _websocket_stage_throttling(evaluated, stage, rate, burst)
    return sorted(set(problems))


# ----------------------------------------------------------------------------------------------
# 2. Alarms
# ----------------------------------------------------------------------------------------------


@dataclass
class Metric:
    namespace: str
    name: str
    dimensions: dict[str, str]
    stat: str | None
    period: float | None


@dataclass
class Alarm:
    logical_id: str
    metrics: list[Metric]
    threshold: float | None
    comparison: str
    window: float | None  # seconds: Period x the datapoints that must breach
    missing: str | None
    props: dict = field(repr=False)

    def on(self, namespace: str, name: str, **dimensions: str) -> bool:
        return any(
            m.namespace == namespace and m.name == name and all(m.dimensions.get(k) == v for k, v in dimensions.items())
            for m in self.metrics
        )

    def above(self, threshold: float) -> bool:
        """Fires when the value exceeds `threshold` ("> threshold")."""
        if self.comparison == "GreaterThanThreshold":
            return self.threshold == threshold
        # For counts, ">= threshold + 1" is the same alarm.
        return self.comparison == "GreaterThanOrEqualToThreshold" and self.threshold == threshold + 1


def _metric(metric: dict, stat: Any, period: Any) -> Metric:
    dimensions = {str(d.get("Name")): str(d.get("Value")) for d in as_list(metric.get("Dimensions"))}
    return Metric(str(metric.get("Namespace")), str(metric.get("MetricName")), dimensions, stat, number(period))


def alarms(stack: Stack) -> list[Alarm]:
    """Every CloudWatch alarm, single-metric or metric math, in one shape."""
    out = []
    for logical_id in stack.resources("AWS::CloudWatch::Alarm"):
        props = stack.props(logical_id)
        if "MetricName" in props:
            stat = props.get("ExtendedStatistic") or props.get("Statistic")
            metrics = [_metric(props, stat, props.get("Period"))]
            period = number(props.get("Period"))
        else:
            stats = [m.get("MetricStat") for m in as_list(props.get("Metrics")) if m.get("MetricStat")]
            metrics = [_metric(s.get("Metric", {}), s.get("Stat"), s.get("Period")) for s in stats]
            period = max((m.period or 0 for m in metrics), default=None)
        points = number(props.get("DatapointsToAlarm") or props.get("EvaluationPeriods"))
        out.append(
            Alarm(
                logical_id,
                metrics,
                number(props.get("Threshold")),
                str(props.get("ComparisonOperator")),
                period * points if period and points else None,
                props.get("TreatMissingData"),
                props,
            )
        )
    return out


@dataclass
class Required:
    """An alarm the system must have: what it watches and how it fires."""

    what: str
    matches: Callable[[Alarm], bool]
    fires: Callable[[Alarm], bool]
    how: str
    # How missing data counts: not breaching (a metric published only when something happens), except
    # where the absence of data is the failure (the sweeper not running).
    missing: str = "notBreaching"


def _sum_above_zero(alarm: Alarm) -> bool:
    return all(m.stat == "Sum" for m in alarm.metrics) and alarm.above(0)


def _lambda(stack: Stack, function: str, metric: str) -> Callable[[Alarm], bool]:
    return lambda alarm: any(
        m.namespace == "AWS/Lambda" and m.name == metric and function_target(stack, m.dimensions.get("FunctionName")) == function
        for m in alarm.metrics
    )


def _table_throttles(stack: Stack, table: str) -> Callable[[Alarm], bool]:
    name = stack.table_name(table)

    def watched(alarm: Alarm) -> set[str]:
        return {
            m.name for m in alarm.metrics if m.namespace == "AWS/DynamoDB" and m.dimensions.get("TableName") == name
        }

    # Reads and writes: ThrottledRequests covers both, else both throttle-event metrics.
    return lambda alarm: "ThrottledRequests" in watched(alarm) or {"ReadThrottleEvents", "WriteThrottleEvents"} <= watched(alarm)


def _rest_api_names(stack: Stack) -> list[str]:
    return [str(stack.props(api).get("Name")) for api in stack.resources("AWS::ApiGateway::RestApi")]


def required_alarms(stack: Stack) -> list[Required]:
    required = []
    for function in functions(stack):
        required.append(
            Required(f"Errors of {function}", _lambda(stack, function, "Errors"),
                     lambda a: all(m.stat == "Sum" for m in a.metrics) and a.comparison.startswith("GreaterThan")
                     and a.threshold is not None and a.threshold >= 0, "Sum above a threshold")
        )
        required.append(Required(f"Throttles of {function}", _lambda(stack, function, "Throttles"), _sum_above_zero, "Sum > 0"))
    for processor in [f for binary in STREAM_READERS for f in functions_of(stack, binary)]:
        required.append(
            Required(f"IteratorAge of {processor}", _lambda(stack, processor, "IteratorAge"),
                     lambda a: a.metrics[0].stat == "Maximum" and a.above(60_000) and a.window == 300,
                     "Maximum > 60000 ms over 5 minutes")
        )
    for name in _rest_api_names(stack):
        required.append(
            Required(f"5XXError of REST API {name}", lambda a, n=name: a.on("AWS/ApiGateway", "5XXError", ApiName=n),
                     lambda a: _sum_above_zero(a) and a.window == 300, "Sum > 0 over 5 minutes")
        )
        required.append(
            Required(f"Latency of REST API {name}", lambda a, n=name: a.on("AWS/ApiGateway", "Latency", ApiName=n),
                     lambda a: a.metrics[0].stat == "p99" and a.above(25_000) and a.window == 300,
                     "p99 > 25000 ms over 5 minutes")
        )
    for stream in stack.resources("AWS::KinesisFirehose::DeliveryStream"):
        required.append(
            Required(f"DeliveryToS3.DataFreshness of {stream}",
                     lambda a, s=stream: a.on("AWS/Firehose", "DeliveryToS3.DataFreshness", DeliveryStreamName="${%s}" % s),
                     lambda a: a.metrics[0].stat == "Maximum" and a.above(900), "Maximum > 900 s")
        )
    for table in stack.resources("AWS::DynamoDB::Table"):
        required.append(
            Required(f"read and write throttles of table {stack.table_name(table)}", _table_throttles(stack, table),
                     _sum_above_zero, "Sum > 0")
        )
    queues = {
        att_id(stack.props(m).get("DestinationConfig", {}).get("OnFailure", {}).get("Destination"), "Arn")
        for m in stack.resources("AWS::Lambda::EventSourceMapping")
    } - {None}
    for queue in sorted(queues):
        required.append(
            Required(f"messages in the on-failure queue {queue}",
                     lambda a, q=queue: a.on("AWS/SQS", "ApproximateNumberOfMessagesVisible", QueueName="${%s.QueueName}" % q),
                     lambda a: a.above(0), "> 0")
        )
    # The existing alarm: recovery not making progress (transactions a sweep could not finish).
    required.append(
        Required("the sweeper's StuckTransactions (recovery not making progress)",
                 lambda a: a.on(METRICS_NAMESPACE, "StuckTransactions"),
                 lambda a: a.above(0) and a.window is not None and a.window >= 300, "> 0 for 5 minutes or more")
    )
    # The operators' stuck view not emptying (issue 47): what recovery leaves behind.
    required.append(
        Required("the sweeper's StuckViewCount (the operators' stuck view not emptying)",
                 lambda a: a.on(METRICS_NAMESPACE, "StuckViewCount"),
                 lambda a: a.above(0) and a.window is not None and a.window >= 600, "> 0 for 10 minutes or more")
    )
    # A participant's clock drifting from the coordinator's, long before it reaches the margin M.
    skew = clock_margin_ms() // CLOCK_SKEW_ALARM_FRACTION
    required.append(
        Required(f"the coordinator's {CLOCK_SKEW_METRIC} (a participant's clock drifting towards M)",
                 lambda a: a.on(METRICS_NAMESPACE, CLOCK_SKEW_METRIC),
                 lambda a: all(m.stat == "Maximum" for m in a.metrics) and a.above(skew) and a.window == 300,
                 f"Maximum > {skew} ms (M / {CLOCK_SKEW_ALARM_FRACTION}) over 5 minutes")
    )
    # The sweeper's own errors, and the sweeper not running at all (its schedule: every minute).
    required.append(
        Required("the sweeper's SweepErrors", lambda a: a.on(METRICS_NAMESPACE, SWEEP_ERRORS_METRIC),
                 lambda a: _sum_above_zero(a) and a.window is not None and a.window <= 900, "Sum > 0 within 15 minutes")
    )
    for sweeper in functions_of(stack, "sweeper"):
        required.append(
            Required(f"Invocations of {sweeper} (the sweeper not running)", _lambda(stack, sweeper, "Invocations"),
                     lambda a: all(m.stat == "Sum" for m in a.metrics) and a.comparison == "LessThanThreshold"
                     and a.threshold == 1 and a.window is not None and a.window <= 900,
                     "Sum < 1 within 15 minutes", missing="breaching")
        )
    for name in _rest_api_names(stack):
        required.append(
            Required(f"the 4XX rate of REST API {name} but {sorted(CLIENT_ERROR_STATUSES_NOT_COUNTED)} (its access log's)",
                     lambda a, n=name: any(_client_errors_metric(stack, m) for m in a.metrics) and a.on("AWS/ApiGateway", "Count", ApiName=n),
                     lambda a: a.comparison == "GreaterThanThreshold" and a.threshold is not None and 0 < a.threshold <= 25
                     and a.window == 300 and not a.on("AWS/ApiGateway", "4XXError"),
                     "a share of those 4xx (not 4XXError, which counts 409 and 404) in Count above a few percent over 5 minutes")
        )
        required.append(
            Required(f"the 429 rate of REST API {name} (its access log's status 429)",
                     lambda a, n=name: any(_throttled_metric(stack, m) for m in a.metrics) and a.on("AWS/ApiGateway", "Count", ApiName=n),
                     lambda a: a.comparison == "GreaterThanThreshold" and a.threshold is not None and 0 < a.threshold <= 10
                     and a.window == 300, "a share of 429s in Count above a few percent over 5 minutes")
        )
    for api in stack.resources("AWS::ApiGatewayV2::Api"):
        if stack.props(api).get("ProtocolType") != "WEBSOCKET":
            continue
        for metric in ["IntegrationError", "ExecutionError"]:
            required.append(
                Required(f"{metric} of WebSocket API {api}", lambda a, m=metric, i=api: a.on("AWS/ApiGateway", m, ApiId="${%s}" % i),
                         lambda a: _sum_above_zero(a) and a.window == 300, "Sum > 0 over 5 minutes")
            )
    # Records the stream processor gave up on itself (dead-lettered with their content).
    required.append(
        Required(f"the stream processor's {UNPROCESSABLE_METRIC} (records it dead-lettered)",
                 lambda a: a.on(METRICS_NAMESPACE, UNPROCESSABLE_METRIC),
                 lambda a: _sum_above_zero(a) and a.window == 300, "Sum >= 1 in 5 minutes")
    )
    return required


def _description(alarm: Alarm) -> str:
    return " ".join(str(alarm.props.get("AlarmDescription", "")).split())


def alarm_description_problems(stack: Stack, found: list[Alarm]) -> list[str]:
    """The alarms whose answer is not in their metric say what to do: the ClockSkew alarm names the
    margin M and the clocks to compare; the UnprocessableRecords alarm the log line to read and the
    replay to run after the fix; the StuckTransactions alarm (also a confirm that fails for good) the
    record's sweepError and that a commit decision is never aborted by hand."""
    problems = []
    margin = clock_margin_ms()
    wanted = {
        CLOCK_SKEW_METRIC: [f"{margin} ms", "clock", "abort"],
        UNPROCESSABLE_METRIC: ["dead-letter", "log", replay_contract()["action"]],
        # What an operator sees for a resource participant's confirm that fails for good: the record's
        # sweepError says why, and a transaction decided to commit is never aborted by hand.
        STUCK_METRIC: ["sweepError", "confirm", "never abort"],
    }
    for metric, words in wanted.items():
        for alarm in [a for a in found if a.on(METRICS_NAMESPACE, metric)]:
            text = _description(alarm)
            missing = [w for w in words if w.lower() not in text.lower()]
            if missing:
                problems.append(f"{alarm.logical_id}: its description does not say {missing} (what it means, what to do)")
    return problems


def check_alarms(stack: Stack) -> list[str]:
    """Each required alarm exists on the right metric and fires as described, notifies the
    AlarmActionArn topic (the stack's own when it is empty), and treats missing data as not breaching
    (but the sweeper's invocations: none is the sweeper not running)."""
    problems = _parameter(stack, "AlarmActionArn", "")
    found = alarms(stack)
    for requirement in required_alarms(stack):
        matching = [a for a in found if requirement.matches(a)]
        if not matching:
            problems.append(f"no alarm on {requirement.what}")
            continue
        if not any(requirement.fires(a) for a in matching):
            problems.append(f"alarms on {requirement.what} {[a.logical_id for a in matching]} do not fire at {requirement.how}")
        for alarm in matching:
            if alarm.missing != requirement.missing:
                problems.append(f"{alarm.logical_id}: TreatMissingData {alarm.missing!r}, not {requirement.missing}")
    if "AlarmActionArn" in stack.template.get("Parameters", {}):
        for alarm in found:
            problems += _alarm_actions(stack, alarm.logical_id)
    return problems + alarm_description_problems(stack, found)


# ----------------------------------------------------------------------------------------------
# 3. Dashboard
# ----------------------------------------------------------------------------------------------


@dataclass
class Graph:
    namespace: str
    name: str
    dimensions: dict[str, str]
    stat: str
    period: float | None


def _rows(widget: dict) -> tuple[list[Graph], list[str]]:
    """The metric rows (with "." repeated from the row before) and the expressions of a widget."""
    properties = widget.get("properties", {})
    graphs, expressions, previous = [], [], []
    for row in as_list(properties.get("metrics")):
        options = row[-1] if row and isinstance(row[-1], dict) else {}
        values = [v for v in row if not isinstance(v, dict)]
        if not values and "expression" in options:
            expressions.append(str(options["expression"]) + " period=%s" % options.get("period", properties.get("period")))
            continue
        values = [previous[i] if v == "." and i < len(previous) else v for i, v in enumerate(values)]
        previous = values
        if len(values) < 2:
            continue
        dimensions = dict(zip(values[2::2], values[3::2]))
        stat = options.get("stat", properties.get("stat", "Average"))
        period = number(options.get("period", properties.get("period")))
        graphs.append(Graph(str(values[0]), str(values[1]), {str(k): str(v) for k, v in dimensions.items()}, stat, period))
    return graphs, expressions


def dashboard_metrics(stack: Stack) -> tuple[list[Graph], list[str], list[str]]:
    """(metric rows, expressions, problems) of every dashboard."""
    graphs: list[Graph] = []
    expressions: list[str] = []
    problems: list[str] = []
    dashboards = stack.resources("AWS::CloudWatch::Dashboard")
    if not dashboards:
        problems.append("no AWS::CloudWatch::Dashboard")
    for dashboard in dashboards:
        body = stack.props(dashboard).get("DashboardBody")
        try:
            parsed = json.loads(str(body))
        except json.JSONDecodeError as error:
            problems.append(f"{dashboard}: DashboardBody is not JSON ({error})")
            continue
        for widget in parsed.get("widgets", []):
            rows, searches = _rows(widget)
            graphs += rows
            expressions += searches
    return graphs, expressions, problems


def _shows(graphs: list[Graph], namespace: str, name: str, stat: str | None = None, **dimensions: str) -> bool:
    return any(
        g.namespace == namespace and g.name == name and (stat is None or g.stat == stat)
        and all(g.dimensions.get(k) == v for k, v in dimensions.items())
        for g in graphs
    )


def _lambda_shown(stack: Stack, graphs: list[Graph], function: str, name: str) -> bool:
    return any(
        g.namespace == "AWS/Lambda" and g.name == name and function_target(stack, g.dimensions.get("FunctionName")) == function
        for g in graphs
    )


def check_dashboard(stack: Stack) -> list[str]:
    """A dashboard of the protocol's health: commits and aborts by reason per minute, the phase
    latencies (p50, p99), 503s, the sweeper, the stream readers' iterator age (the stream processor's and
    the outcomes function's), every function's
    errors and throttles, the REST API's 5XX and latency, the lake's freshness."""
    graphs, expressions, problems = dashboard_metrics(stack)
    ns = METRICS_NAMESPACE
    if not any(g.namespace == ns and g.name == "Committed" and g.stat == "Sum" and g.period == 60 for g in graphs):
        problems.append(f"no Committed (Sum per minute) in {ns}")
    aborted = [e for e in expressions if "SEARCH(" in e and ns in e and "Aborted" in e and "Reason" in e]
    if not aborted and not _shows(graphs, ns, "Aborted"):
        problems.append(f"no Aborted by Reason (a SEARCH expression over {ns}, or rows with the Reason dimension)")
    for latency in code_metrics(stack)["coordinatorLatencies"]:
        for stat in ["p50", "p99"]:
            if not _shows(graphs, ns, latency, stat):
                problems.append(f"no {latency} {stat}")
    for metric in ["Unavailable"] + code_metrics(stack)["sweeperCounts"] + code_metrics(stack).get("streamProcessorCounts", []):
        if not _shows(graphs, ns, metric):
            problems.append(f"no {metric}")
    # The skew's worst case beside its p50 and p99: the alarm watches the maximum.
    if not _shows(graphs, ns, CLOCK_SKEW_METRIC, "Maximum"):
        problems.append(f"no {CLOCK_SKEW_METRIC} Maximum (what its alarm watches)")
    for processor in [f for binary in STREAM_READERS for f in functions_of(stack, binary)]:
        if not _lambda_shown(stack, graphs, processor, "IteratorAge"):
            problems.append(f"no IteratorAge of {processor}")
    for function in functions(stack):
        for metric in ["Errors", "Throttles"]:
            if not _lambda_shown(stack, graphs, function, metric):
                problems.append(f"no {metric} of {function}")
    for name in _rest_api_names(stack):
        for metric in ["5XXError", "Latency"]:
            if not _shows(graphs, "AWS/ApiGateway", metric, ApiName=name):
                problems.append(f"no {metric} of REST API {name}")
    for stream in stack.resources("AWS::KinesisFirehose::DeliveryStream"):
        if not _shows(graphs, "AWS/Firehose", "DeliveryToS3.DataFreshness", DeliveryStreamName="${%s}" % stream):
            problems.append(f"no DeliveryToS3.DataFreshness of {stream}")
    return problems


def check_metric_names(stack: Stack) -> list[str]:
    """Every metric of the stack's namespace that an alarm, a dashboard row or a SEARCH expression
    watches is one the code writes: a misspelt or retired name would graph nothing and never alarm."""
    written = written_metric_names(stack)
    problems = []
    watched = [(f"alarm {a.logical_id}", m.name) for a in alarms(stack) for m in a.metrics if m.namespace == METRICS_NAMESPACE]
    graphs, expressions, _ = dashboard_metrics(stack)
    watched += [("dashboard", g.name) for g in graphs if g.namespace == METRICS_NAMESPACE]
    for expression in expressions:
        if METRICS_NAMESPACE in expression:
            watched += [("dashboard SEARCH", name) for name in re.findall(r'MetricName\s*=\s*\\?"([^"\\]+)', expression)]
    for where, name in watched:
        if name not in written:
            problems.append(f"{where} watches {name}, which the code does not write (it writes {sorted(written)})")
    return problems


# ----------------------------------------------------------------------------------------------
# 4. Reserved concurrency
# ----------------------------------------------------------------------------------------------


def check_reserved_concurrency(stack: Stack) -> list[str]:
    """The coordinator, the sweeper and the stream processor reserve what their parameter says
    (nothing when it is 0); participants reserve nothing (the coordinator calls them: a cap would
    turn a burst into refusals)."""
    problems = []
    for binary, (parameter, default) in RESERVED_CONCURRENCY_PARAMETERS.items():
        problems += _parameter(stack, parameter, default)
        for value in [str(default), "7"]:
            evaluated = stack.with_parameters(**{parameter: value})
            for function in functions_of(evaluated, binary):
                got = evaluated.props(function).get("ReservedConcurrentExecutions")
                if not _same_number(got, value):
                    problems.append(f"{function} ({binary}): reserves {got!r} with {parameter}={value}")
        evaluated = stack.with_parameters(**{parameter: "0"})
        for function in functions_of(evaluated, binary):
            if "ReservedConcurrentExecutions" in evaluated.props(function):
                problems.append(f"{function} ({binary}): still reserves concurrency with {parameter}=0")
    for function in participant_functions(stack):
        if "ReservedConcurrentExecutions" in stack.props(function):
            problems.append(f"{function} (participant): reserved concurrency caps a participant")
    return problems


# ----------------------------------------------------------------------------------------------
# 5. Deletion protection
# ----------------------------------------------------------------------------------------------


def check_deletion_protection(stack: Stack) -> list[str]:
    """Tables refuse deletion and are retained (also on replacement); so is the lake bucket."""
    problems = []
    resources = stack.template["Resources"]
    for table in stack.resources("AWS::DynamoDB::Table"):
        if str(stack.props(table).get("DeletionProtectionEnabled")).lower() != "true":
            problems.append(f"{table}: DeletionProtectionEnabled is not true")
    for kind in ["AWS::DynamoDB::Table", "AWS::S3::Bucket"]:
        for name in stack.resources(kind):
            for policy in ["DeletionPolicy", "UpdateReplacePolicy"]:
                if resources[name].get(policy) != "Retain":
                    problems.append(f"{name}: {policy} is {resources[name].get(policy)!r}, not Retain")
    return problems


# ----------------------------------------------------------------------------------------------
# 6. The lake: compressed, and an Athena table with partition projection
# ----------------------------------------------------------------------------------------------


def lake_record_fields(source: Path = LAKE_RECORD_SOURCE) -> list[str]:
    """The lake lines' JSON fields: those of `ChangeRecord` (a per-item line), then those of
    `TransactionLine` (a committed transaction's line) that a per-item line has not (serde camelCase)."""
    fields: list[str] = []
    for struct in (LAKE_RECORD_STRUCT, LAKE_TRANSACTION_STRUCT):
        match = re.search(r"pub struct %s \{(.*?)\n\}" % struct, source.read_text(), re.S)
        if match is None:
            raise AssertionError(f"no struct {struct} in {source}")
        names = re.findall(r"^\s*pub (\w+):", match.group(1), re.M)
        fields += [f for f in (re.sub(r"_(\w)", lambda m: m.group(1).upper(), name) for name in names) if f not in fields]
    return fields


# Firehose timestamp formats and the digits of their values.
TIMESTAMP_DIGITS = {"yyyy": 4, "MM": 2, "dd": 2, "HH": 2}


def _projection(parameters: dict, key: str, fmt: str | None) -> list[str]:
    """One projected partition key: a type, and for integers a range and the digits of the prefix."""
    kind = parameters.get(f"projection.{key}.type")
    if kind is None:
        return [f"partition key {key} is not projected (no projection.{key}.type)"]
    if kind != "integer":
        return [] if kind in ("date", "enum", "injected") else [f"projection.{key}.type {kind!r}"]
    problems = []
    bounds = parameters.get(f"projection.{key}.range", "").split(",")
    if len(bounds) != 2:
        problems.append(f"projection.{key}.range is not 'low,high'")
    # Values shorter than the prefix writes them (1 for 01) need zero padding to name its folders.
    digits = TIMESTAMP_DIGITS.get(fmt or "", 1)
    padded = len(bounds[0].strip()) >= digits
    if not padded and str(parameters.get(f"projection.{key}.digits")) != str(digits):
        problems.append(f"projection.{key}.digits is {parameters.get(f'projection.{key}.digits')!r}: the prefix writes {digits} digits ({fmt})")
    return problems


def _check_glue_table(stack: Stack, table: str, bucket: str, prefix: str) -> list[str]:
    problems = []
    props = stack.props(table)
    table_input = props.get("TableInput", {})
    parameters = {str(k): str(v) for k, v in table_input.get("Parameters", {}).items()}
    database = props.get("DatabaseName")
    databases = {"${%s}" % d for d in stack.resources("AWS::Glue::Database")} | {
        str(stack.props(d).get("DatabaseInput", {}).get("Name")) for d in stack.resources("AWS::Glue::Database")
    }
    if database not in databases:
        problems.append(f"{table}: database {database!r} is not a Glue database of the template")
    if parameters.get("projection.enabled") != "true":
        problems.append(f"{table}: projection.enabled is not true")
    fields = re.findall(r"!\{([^}]*)\}", prefix)
    keys = [str(k.get("Name")) for k in as_list(table_input.get("PartitionKeys"))]
    if len(keys) != len(fields):
        problems.append(f"{table}: partition keys {keys}, the prefix {prefix!r} has {len(fields)} partitions")
    for key, spec in zip(keys, fields):
        problems += [f"{table}: {p}" for p in _projection(parameters, key, spec.partition(":")[2])]
    template = "s3://${%s}/" % bucket + prefix
    for key, spec in zip(keys, fields):
        template = template.replace("!{%s}" % spec, "${%s}" % key, 1)
    if parameters.get("storage.location.template") != template:
        problems.append(f"{table}: storage.location.template {parameters.get('storage.location.template')!r}, the prefix makes {template!r}")
    storage = table_input.get("StorageDescriptor", {})
    location = "s3://${%s}/" % bucket + prefix.split("!{")[0]
    if storage.get("Location") != location:
        problems.append(f"{table}: location {storage.get('Location')!r}, not {location!r}")
    if storage.get("SerdeInfo", {}).get("SerializationLibrary") != JSON_SERDE:
        problems.append(f"{table}: SerDe {storage.get('SerdeInfo', {}).get('SerializationLibrary')!r}, not {JSON_SERDE}")
    columns = sorted(str(c.get("Name")).lower() for c in as_list(storage.get("Columns")))
    wanted = sorted(f.lower() for f in lake_record_fields())
    if columns != wanted:
        problems.append(f"{table}: columns {columns}, the lake record has {wanted}")
    return problems


def check_lake_catalog(stack: Stack) -> list[str]:
    """The lake is GZIP-compressed, and a Glue table over its prefix, in a Glue database, projects
    one partition key per partition of the prefix (storage.location.template is the prefix with the
    keys in place), reads JSON lines with the OpenX SerDe and has the lake record's fields."""
    problems = []
    for stream in stack.resources("AWS::KinesisFirehose::DeliveryStream"):
        s3 = stack.props(stream).get("ExtendedS3DestinationConfiguration", {})
        if s3.get("CompressionFormat") != "GZIP":
            problems.append(f"{stream}: CompressionFormat {s3.get('CompressionFormat')!r}, not GZIP")
        bucket = att_id(s3.get("BucketARN"), "Arn")
        prefix = str(s3.get("Prefix"))
        tables = [
            t
            for t in stack.resources("AWS::Glue::Table")
            if str(stack.props(t).get("TableInput", {}).get("StorageDescriptor", {}).get("Location", "")).startswith(
                "s3://${%s}/" % bucket
            )
        ]
        if not tables:
            problems.append(f"no Glue table over the lake of {stream} (s3://${{{bucket}}}/...)")
        for table in tables:
            problems += _check_glue_table(stack, table, str(bucket), prefix)
    if not stack.resources("AWS::Glue::Database"):
        problems.append("no AWS::Glue::Database")
    return problems


# ----------------------------------------------------------------------------------------------
# 7. Logging and tracing
# ----------------------------------------------------------------------------------------------


def _check_function_logging(stack: Stack, function: str, level: str) -> list[str]:
    problems = []
    config = stack.props(function).get("LoggingConfig", {})
    expected = {"LogFormat": "JSON", "ApplicationLogLevel": level, "SystemLogLevel": "WARN"}
    for key, value in expected.items():
        if config.get(key) != value:
            problems.append(f"{function}: LoggingConfig.{key} is {config.get(key)!r} with LogLevel={level}, not {value!r}")
    group = log_group_of(stack, function)
    if group is None or stack.kind(group) != "AWS::Logs::LogGroup":
        problems.append(f"{function}: LoggingConfig.LogGroup is not a log group of the template")
    else:
        if stack.props(group).get("RetentionInDays") is None:
            problems.append(f"{group}: no retention")
        role = role_of(stack, function)
        for action in ["logs:CreateLogStream", "logs:PutLogEvents"]:
            if "${%s.Arn}" % group not in granted(stack, role, action):
                problems.append(f"{function}: its role may not {action} on its log group {group}")
    if "RUST_LOG" in environment(stack, function):
        problems.append(f"{function}: sets RUST_LOG (the level comes from LoggingConfig.ApplicationLogLevel)")
    return problems


def check_logging(stack: Stack) -> list[str]:
    """Every function logs JSON to a log group of its own (with retention, writable by its role) at
    the LogLevel parameter's level, system logs at WARN, and sets no RUST_LOG."""
    problems = _parameter(stack, "LogLevel", "INFO", LOG_LEVELS)
    for level in ["INFO", "DEBUG"]:
        evaluated = stack.with_parameters(LogLevel=level)
        for function in functions(evaluated):
            problems += _check_function_logging(evaluated, function, level)
    groups = [log_group_of(stack, f) for f in functions(stack)]
    for group in sorted({g for g in groups if g and groups.count(g) > 1}):
        problems.append(f"log group {group} is shared by several functions")
    return sorted(set(problems), key=problems.index)


def _xray_grants(stack: Stack, function: str) -> set[str]:
    role = role_of(stack, function)
    return {
        action
        for action in ["xray:PutTraceSegments", "xray:PutTelemetryRecords"]
        if "*" in granted(stack, role, action)
    }


def check_tracing(stack: Stack) -> list[str]:
    """The TracingMode parameter sets every function's tracing and the REST stage's; the X-Ray
    grants exist only when it is Active."""
    problems = _parameter(stack, "TracingMode", "PassThrough", TRACING_MODES)
    for mode in TRACING_MODES:
        evaluated = stack.with_parameters(TracingMode=mode)
        for function in functions(evaluated):
            got = evaluated.props(function).get("TracingConfig", {}).get("Mode")
            if got != mode:
                problems.append(f"{function}: TracingConfig.Mode is {got!r} with TracingMode={mode}")
            grants = _xray_grants(evaluated, function)
            if mode == "Active" and len(grants) != 2:
                problems.append(f"{function}: its role lacks the X-Ray grants with TracingMode=Active (has {sorted(grants)})")
            if mode != "Active" and grants:
                problems.append(f"{function}: its role has {sorted(grants)} with TracingMode={mode}")
        for stage in evaluated.resources("AWS::ApiGateway::Stage"):
            enabled = str(evaluated.props(stage).get("TracingEnabled", False)).lower() == "true"
            if enabled != (mode == "Active"):
                problems.append(f"{stage}: TracingEnabled is {enabled} with TracingMode={mode}")
    return problems


# ----------------------------------------------------------------------------------------------
# 8. Participants' aliases (deployment order)
# ----------------------------------------------------------------------------------------------


def check_aliases(stack: Stack) -> list[str]:
    """Each participant function publishes a version and has an alias `live` on it; the registries
    (check_registry) and the invoke grants (check_invoke_only_registered) name that alias, so
    CloudFormation updates the participants before the functions that call them."""
    problems = []
    deployments = participant_deployments(stack)
    if not deployments:
        problems.append("no participant deployments")
    for service, deployment in deployments.items():
        function, alias = deployment["function"], deployment["alias"]
        if alias is None:
            problems.append(f"participant {service} ({function}): no alias {ALIAS_NAME!r} (has {sorted(aliases(stack, function))})")
            continue
        version = att_id(stack.props(alias).get("FunctionVersion"), "Version")
        if version is None or stack.kind(version) != "AWS::Lambda::Version":
            problems.append(f"{alias}: FunctionVersion is not a published version of the template")
        elif function_target(stack, stack.props(version).get("FunctionName")) != function:
            problems.append(f"{alias}: its version {version} is not of {function}")
    return problems


# ----------------------------------------------------------------------------------------------
# 9. Cross-origin access to the REST API (CORS)
# ----------------------------------------------------------------------------------------------


def rust_constants(source: Path) -> dict[str, str | int]:
    """The `pub const NAME: type = value;` string and integer constants of a Rust file (the value
    may be on the next line; the strings hold no escapes; an integer may be a product, `256 * 1024`)."""
    text = source.read_text()
    constants: dict[str, str | int] = {}
    number_or_product = r"[0-9_]+(?:\s*\*\s*[0-9_]+)*"
    for name, value in re.findall(r"^\s*pub const (\w+):[^=]+=\s*(\"[^\"]*\"|%s)\s*;" % number_or_product, text, re.M):
        if value.startswith('"'):
            constants[name] = value[1:-1]
        else:
            product = 1
            for factor in value.split("*"):
                product *= int(factor.strip().replace("_", ""))
            constants[name] = product
    return constants


def cors_contract(source: Path = CORS_SOURCE) -> dict[str, Any]:
    """What the deployed API must answer cross-origin callers, and the name of the coordinator's
    variable (`CORS_ALLOW_ORIGIN`), from `twopc::cors`."""
    cors = names = rust_constants(source)
    wanted = ["DEFAULT_ALLOW_ORIGIN", "ALLOW_METHODS", "ALLOW_HEADERS", "MAX_AGE_SECONDS"]
    missing = [name for name in wanted if name not in cors] + [n for n in ["CORS_ALLOW_ORIGIN"] if n not in names]
    if missing:
        raise AssertionError(f"no constant {missing} in {source}")
    return {
        "defaultOrigin": str(cors["DEFAULT_ALLOW_ORIGIN"]),
        "methods": str(cors["ALLOW_METHODS"]),
        "headers": str(cors["ALLOW_HEADERS"]),
        "maxAge": int(cors["MAX_AGE_SECONDS"]),
        "variable": str(names["CORS_ALLOW_ORIGIN"]),
    }


def _cors_parameter(stack: Stack, contract: dict) -> list[str]:
    """The parameter: a String defaulting to the code's default origin; if it has a pattern, the
    pattern takes `*` and one origin and refuses a list or a path."""
    problems = _parameter(stack, CORS_PARAMETER, contract["defaultOrigin"])
    definition = stack.template.get("Parameters", {}).get(CORS_PARAMETER)
    if definition is None:
        return problems
    if definition.get("Type") != "String":
        problems.append(f"parameter {CORS_PARAMETER}: type {definition.get('Type')!r}, not String")
    pattern = definition.get("AllowedPattern")
    if pattern is not None:
        for origin in ["*", CORS_OTHER_ORIGIN, "http://localhost:3000"]:
            if not re.fullmatch(pattern, origin):
                problems.append(f"parameter {CORS_PARAMETER}: AllowedPattern {pattern!r} refuses {origin!r}")
        for origin in [f"{CORS_OTHER_ORIGIN},https://b.example.com", f"{CORS_OTHER_ORIGIN}/", "'*'"]:
            if re.fullmatch(pattern, origin):
                problems.append(f"parameter {CORS_PARAMETER}: AllowedPattern {pattern!r} takes {origin!r}, not one origin")
    return problems


def _cors_origins(stack: Stack, contract: dict) -> list[tuple[str, Stack]]:
    """(origin, the template evaluated with CorsAllowOrigin = origin) for the default and another."""
    return [(origin, stack.with_parameters(**{CORS_PARAMETER: origin})) for origin in [contract["defaultOrigin"], CORS_OTHER_ORIGIN]]


def _literal(value: Any) -> str | None:
    """The text of an API Gateway static value (`'text'`), None when it is not one."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1]
    return None


def _header(parameters: dict, prefix: str, header: str) -> tuple[bool, Any]:
    """(present, value) of a header in response parameters (`<prefix><Header>`, any case)."""
    for key, value in parameters.items():
        if str(key).lower() == (prefix + header).lower():
            return True, value
    return False, None


def _items(text: str, fold_case: bool) -> set[str]:
    return {(item.strip().lower() if fold_case else item.strip()) for item in text.split(",") if item.strip()}


def _preflight_problems(where: str, method: dict, origin: str, contract: dict) -> list[str]:
    problems = []
    if method["authorization"] != "NONE":
        problems.append(f"{where}: authorization {method['authorization']!r}, not NONE (browsers never sign a preflight)")
    if method["integration_type"] != "mock":
        problems.append(f"{where}: integration {method['integration_type']!r}, not a MOCK answered by API Gateway")
    defaults = [r for r in method["integration_responses"] if r["selection"] is None]
    if len(defaults) != 1:
        return problems + [f"{where}: {len(defaults)} default integration responses, expected one"]
    response = defaults[0]
    if response["status"] not in ("200", "204"):
        problems.append(f"{where}: answers {response['status']}, not 200 or 204")
    prefix = "method.response.header."
    expected = {
        "Access-Control-Allow-Origin": (origin, lambda text: text == origin),
        "Access-Control-Allow-Methods": (
            contract["methods"], lambda text: _items(text, False) == _items(contract["methods"], False)
        ),
        "Access-Control-Allow-Headers": (
            contract["headers"], lambda text: _items(text, True) == _items(contract["headers"], True)
        ),
        "Access-Control-Max-Age": (str(contract["maxAge"]), lambda text: text.strip() == str(contract["maxAge"])),
    }
    declared = method["method_responses"].get(response["status"], set())
    for header, (want, matches) in expected.items():
        present, value = _header(response["parameters"], prefix, header)
        text = _literal(value)
        if not present:
            problems.append(f"{where}: no {header} (expected {want!r})")
        elif text is None or not matches(text):
            problems.append(f"{where}: {header} is {value!r} with {CORS_PARAMETER}={origin}, expected '{want}'")
        if header.lower() not in declared:
            problems.append(f"{where}: the method response {response['status']} does not declare {header}")
    present, value = _header(response["parameters"], prefix, "Access-Control-Allow-Credentials")
    if present and str(_literal(value)).lower() == "true":
        problems.append(f"{where}: allows credentials (no cookie is ever sent: requests are signed)")
    # A mapping template may set the header instead (CDK writes one for several origins): the answer
    # would no longer be the parameter's.
    for content_type, template in response["templates"].items():
        if "responseoverride.header" in str(template).lower():
            problems.append(f"{where}: its {content_type} template overrides response headers")
    return problems


def check_cors_preflight(stack: Stack) -> list[str]:
    """Every path of the REST API answers a preflight: an OPTIONS method without authorization, a
    MOCK integration whose default response (200 or 204) carries Access-Control-Allow-Origin = the
    CorsAllowOrigin parameter and the methods, headers and max age of `twopc::cors` (each declared
    by the method response, none overridden by a mapping template), and allows no credentials."""
    contract = cors_contract()
    problems = _cors_parameter(stack, contract)
    for origin, evaluated in _cors_origins(stack, contract):
        methods = rest_methods(evaluated)
        paths = sorted({path for verb, path in methods if verb != "OPTIONS"})
        if not paths:
            problems.append("no REST methods")
        for path in paths:
            preflight = methods.get(("OPTIONS", path))
            if preflight is None:
                problems.append(f"REST {path}: no OPTIONS method (no preflight: browsers cannot call it)")
                continue
            problems += _preflight_problems(f"REST OPTIONS {path}", preflight, origin, contract)
    return sorted(set(problems), key=problems.index)


def gateway_responses(stack: Stack) -> list[dict]:
    """[{api, type, parameters, resource (its logical id, None in an OpenAPI body)}] of every REST
    API: AWS::ApiGateway::GatewayResponse resources (CDK) and the OpenAPI bodies' (SAM)."""
    out = []
    for name in stack.resources("AWS::ApiGateway::GatewayResponse"):
        props = stack.props(name)
        out.append(
            {
                "api": ref_id(props.get("RestApiId")),
                "type": str(props.get("ResponseType")),
                "parameters": props.get("ResponseParameters") or {},
                "resource": name,
            }
        )
    for api in stack.resources("AWS::ApiGateway::RestApi"):
        body = stack.props(api).get("Body") or {}
        for kind, response in (body.get("x-amazon-apigateway-gateway-responses") or {}).items():
            out.append({"api": api, "type": str(kind), "parameters": response.get("responseParameters") or {}, "resource": None})
    return out


def _deployed_with(stack: Stack, api: str, resource: str) -> bool:
    """Whether every deployment of the API is made after the resource (DependsOn it): a gateway
    response takes effect in a stage only through a deployment."""
    deployments = [
        d for d in stack.resources("AWS::ApiGateway::Deployment") if ref_id(stack.props(d).get("RestApiId")) == api
    ]
    return bool(deployments) and all(
        resource in as_list(stack.template["Resources"][d].get("DependsOn")) for d in deployments
    )


def check_cors_gateway_responses(stack: Stack) -> list[str]:
    """API Gateway's own answers (DEFAULT_4XX: a refused signature, a body too large, throttling;
    DEFAULT_5XX) carry Access-Control-Allow-Origin = the CorsAllowOrigin parameter, and so does every
    other gateway response the REST API defines (it replaces the default of its kind), each one
    deployed with the API."""
    contract = cors_contract()
    problems = _cors_parameter(stack, contract)
    for origin, evaluated in _cors_origins(stack, contract):
        apis = sorted(evaluated.resources("AWS::ApiGateway::RestApi"))
        if not apis:
            problems.append("no REST API")
        responses = gateway_responses(evaluated)
        for api in apis:
            defined = [r for r in responses if r["api"] == api]
            for kind in CORS_GATEWAY_RESPONSES:
                if not any(r["type"] == kind for r in defined):
                    problems.append(f"{api}: no {kind} gateway response (API Gateway's errors carry no CORS header)")
            for response in defined:
                where = f"{api}: gateway response {response['type']}"
                present, value = _header(response["parameters"], "gatewayresponse.header.", "Access-Control-Allow-Origin")
                if not present:
                    problems.append(f"{where}: no Access-Control-Allow-Origin")
                elif _literal(value) != origin:
                    problems.append(f"{where}: Access-Control-Allow-Origin is {value!r} with {CORS_PARAMETER}={origin}")
                if response["resource"] is not None and not _deployed_with(evaluated, api, response["resource"]):
                    problems.append(f"{where} ({response['resource']}): not every deployment of {api} depends on it")
        for response in responses:
            if response["api"] not in apis:
                problems.append(f"gateway response {response['type']} ({response['resource']}) is of no REST API of the template")
    return sorted(set(problems), key=problems.index)


def check_cors_coordinator(stack: Stack) -> list[str]:
    """The coordinator's own answers (Lambda proxy integration: API Gateway adds nothing) carry the
    same origin: its CORS_ALLOW_ORIGIN is the CorsAllowOrigin parameter."""
    contract = cors_contract()
    problems = _cors_parameter(stack, contract)
    variable = contract["variable"]
    for origin, evaluated in _cors_origins(stack, contract):
        coordinators = functions_of(evaluated, "coordinator")
        if not coordinators:
            problems.append("no coordinator function")
        for function in coordinators:
            value = environment(evaluated, function).get(variable)
            if value != origin:
                problems.append(f"{function}: {variable} is {value!r} with {CORS_PARAMETER}={origin}")
    return sorted(set(problems), key=problems.index)


# ----------------------------------------------------------------------------------------------
# 10. The WebSocket API answers subscribe and unsubscribe
# ----------------------------------------------------------------------------------------------

# Routes whose integration's answer goes back to the client (the connections function answers them
# {"subscribed": [...], "refused": [{"topic", "reason"}]}), and routes that have no answer to send.
WEBSOCKET_TWO_WAY_ROUTES = ["subscribe", "unsubscribe"]
WEBSOCKET_ONE_WAY_ROUTES = ["$connect", "$disconnect"]
DEFAULT_ROUTE_RESPONSE = "$default"


def websocket_routes(stack: Stack) -> dict[str, str]:
    """Route key -> logical id of the WebSocket routes."""
    return {str(stack.props(r).get("RouteKey")): r for r in stack.resources("AWS::ApiGatewayV2::Route")}


def route_responses(stack: Stack) -> dict[str, list[str]]:
    """Route logical id (its `RouteId` reference, None when it names no route) -> route responses."""
    out: dict[str, list[str]] = {}
    for response in stack.resources("AWS::ApiGatewayV2::RouteResponse"):
        out.setdefault(ref_id(stack.props(response).get("RouteId")), []).append(response)
    return out


def check_websocket_answers(stack: Stack) -> list[str]:
    """subscribe and unsubscribe are two-way: RouteResponseSelectionExpression `$default` and a
    route response with RouteResponseKey `$default` on the same API, so API Gateway sends the
    connections function's proxy answer back to the client; $connect and $disconnect have neither
    (there is no client to answer); every route response is on a route of the template; the stage
    auto-deploys and is created after the route responses (its first deployment contains them)."""
    problems = []
    routes = websocket_routes(stack)
    responses = route_responses(stack)
    wanted: list[str] = []
    for key in WEBSOCKET_TWO_WAY_ROUTES:
        route = routes.get(key)
        if route is None:
            problems.append(f"no WebSocket route {key}")
            continue
        props = stack.props(route)
        if props.get("RouteResponseSelectionExpression") != DEFAULT_ROUTE_RESPONSE:
            problems.append(
                f"route {key} ({route}): RouteResponseSelectionExpression is "
                f"{props.get('RouteResponseSelectionExpression')!r}, not {DEFAULT_ROUTE_RESPONSE}: its answer is dropped"
            )
        matching = [
            r
            for r in responses.get(route, [])
            if stack.props(r).get("RouteResponseKey") == DEFAULT_ROUTE_RESPONSE
            and stack.props(r).get("ApiId") == props.get("ApiId")
        ]
        if not matching:
            problems.append(f"route {key} ({route}): no route response {DEFAULT_ROUTE_RESPONSE} on its API: the client gets no answer")
        wanted += matching
    for key in WEBSOCKET_ONE_WAY_ROUTES:
        route = routes.get(key)
        if route is None:
            problems.append(f"no WebSocket route {key}")
            continue
        if "RouteResponseSelectionExpression" in stack.props(route) or responses.get(route):
            problems.append(f"route {key} ({route}): has a route response (only subscribe and unsubscribe answer)")
    for route, listed in responses.items():
        if route not in routes.values():
            problems.append(f"route responses {listed} are on no WebSocket route of the template")
    for stage in stack.resources("AWS::ApiGatewayV2::Stage"):
        if str(stack.props(stage).get("AutoDeploy")).lower() != "true":
            problems.append(f"{stage}: AutoDeploy is not true (route responses would wait for a manual deployment)")
        depends = set(as_list(stack.template["Resources"][stage].get("DependsOn")))
        for response in wanted:
            if response not in depends:
                problems.append(f"{stage}: not created after {response} (its first deployment may lack it)")
    return problems


# ----------------------------------------------------------------------------------------------
# 11. The connections function's cap on topics
# ----------------------------------------------------------------------------------------------

MAX_TOPICS_PARAMETER = "MaxTopicsPerConnection"
MAX_TOPICS_BOUNDS = (1, 1000)
# Another value of the parameter: the function's variable must follow it.
MAX_TOPICS_OTHER_VALUE = "7"


def max_topics_contract(config: Path = CONNECTIONS_SOURCE, variables: Path = ENVIRONMENT_SOURCE) -> dict[str, Any]:
    """The variable's name (`twopc::environment`) and its default (`twopc_fanout::connections`)."""
    names = {**rust_constants(variables), **rust_constants(config)}
    missing = [n for n in ["MAX_TOPICS_PER_CONNECTION", "DEFAULT_MAX_TOPICS_PER_CONNECTION"] if n not in names]
    if missing:
        raise AssertionError(f"no constant {missing} in {variables} or {config}")
    return {"variable": str(names["MAX_TOPICS_PER_CONNECTION"]), "default": int(names["DEFAULT_MAX_TOPICS_PER_CONNECTION"])}


def check_max_topics(stack: Stack) -> list[str]:
    """The parameter MaxTopicsPerConnection: a Number defaulting to the code's default, from 1 to
    1000; every connections function's MAX_TOPICS_PER_CONNECTION is its value (also with another)."""
    contract = max_topics_contract()
    problems = _parameter(stack, MAX_TOPICS_PARAMETER, contract["default"])
    definition = stack.template.get("Parameters", {}).get(MAX_TOPICS_PARAMETER)
    if definition is not None:
        if definition.get("Type") != "Number":
            problems.append(f"parameter {MAX_TOPICS_PARAMETER}: type {definition.get('Type')!r}, not Number")
        for bound, want in zip(["MinValue", "MaxValue"], MAX_TOPICS_BOUNDS):
            if number(definition.get(bound)) != want:
                problems.append(f"parameter {MAX_TOPICS_PARAMETER}: {bound} {definition.get(bound)!r}, not {want}")
    variable = contract["variable"]
    for value in [str(contract["default"]), MAX_TOPICS_OTHER_VALUE]:
        evaluated = stack.with_parameters(**{MAX_TOPICS_PARAMETER: value})
        functions_found = functions_of(evaluated, "connections")
        if not functions_found:
            problems.append("no connections function")
        for function in functions_found:
            got = environment(evaluated, function).get(variable)
            if not _same_number(got, value):
                problems.append(f"{function}: {variable} is {got!r} with {MAX_TOPICS_PARAMETER}={value}")
    return sorted(set(problems), key=problems.index)


# ----------------------------------------------------------------------------------------------
# 12. The fan-out rides out an outage, alarms early, and can replay what it gave up on
# ----------------------------------------------------------------------------------------------

# DynamoDB Streams keep a record 24 hours; the event sources retry until 22 hours, leaving two in
# which the replay can still read what they gave up on.
STREAM_RETENTION_SECONDS = 79200
# Lambda's largest retry count for stream sources; -1 retries until the record ages out.
MAX_RETRY_ATTEMPTS = 10000
# The iterator-age alarm fires within this long of the fan-out stalling (threshold + its window).
ITERATOR_AGE_ALARM_WITHIN_SECONDS = 600
# A message in the on-failure queue is alarmed within this long.
QUEUE_ALARM_WITHIN_SECONDS = 300
# What the stream processor's `replay-dead-letters` action does with the on-failure queue.
REPLAY_ACTIONS = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}
# What the stream processor sends it: the records it gives up on itself, with their content.
DEAD_LETTER_ACTIONS = {"sqs:SendMessage"}
# Lambda's own use of the queue (the mappings' on-failure destination, with the function's role).
ON_FAILURE_ACTIONS = {"sqs:SendMessage"}


def queue_actions_of_code(source: Path = DEAD_LETTER_QUEUE_SOURCE) -> set[str]:
    """The SQS actions the stream processor's code calls on its dead-letter queue
    (`twopc_fanout::replay`: SqsDeadLetters), through template_checks.SDK_CALLS."""
    text = source.read_text()
    return {action for call, action in SDK_CALLS.items() if action.startswith("sqs:") and call in text}


def on_failure_queues(stack: Stack) -> dict[str, str | None]:
    """Event source mapping -> its SQS on-failure queue (logical id; None without one)."""
    out = {}
    for mapping in stack.resources("AWS::Lambda::EventSourceMapping"):
        destination = stack.props(mapping).get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
        queue = att_id(destination, "Arn")
        out[mapping] = queue if queue and stack.kind(queue) == "AWS::SQS::Queue" else None
    return out


def dead_letter_variable(config: Path = ENVIRONMENT_SOURCE) -> str:
    names = rust_constants(config)
    if "DEAD_LETTER_QUEUE_URL" not in names:
        raise AssertionError(f"no constant DEAD_LETTER_QUEUE_URL in {config}")
    return str(names["DEAD_LETTER_QUEUE_URL"])


def check_fanout_retries(stack: Stack) -> list[str]:
    """Every stream event source retries until a record is as old as the stream keeps it:
    MaximumRecordAgeInSeconds = 24 h and MaximumRetryAttempts unbounded (-1) or Lambda's maximum,
    still bisecting and reporting item failures (a poison record is isolated and ends in the queue),
    with an SQS on-failure queue."""
    problems = []
    queues = on_failure_queues(stack)
    if not queues:
        problems.append("no stream event source mappings")
    for mapping, queue in queues.items():
        props = stack.props(mapping)
        age = number(props.get("MaximumRecordAgeInSeconds"))
        if age != STREAM_RETENTION_SECONDS:
            problems.append(
                f"{mapping}: MaximumRecordAgeInSeconds {props.get('MaximumRecordAgeInSeconds')!r}, not "
                f"{STREAM_RETENTION_SECONDS} (the stream's retention): an outage longer than that loses commits"
            )
        retries = number(props.get("MaximumRetryAttempts"))
        if retries not in (-1, MAX_RETRY_ATTEMPTS):
            problems.append(
                f"{mapping}: MaximumRetryAttempts {props.get('MaximumRetryAttempts')!r}, not -1 (until the record "
                f"ages out) or {MAX_RETRY_ATTEMPTS}: a failing batch is given up before the stream drops it"
            )
        if str(props.get("BisectBatchOnFunctionError")).lower() != "true":
            problems.append(f"{mapping}: BisectBatchOnFunctionError is not true (a poison record is not isolated)")
        if "ReportBatchItemFailures" not in as_list(props.get("FunctionResponseTypes")):
            problems.append(f"{mapping}: no ReportBatchItemFailures")
        if queue is None:
            problems.append(f"{mapping}: no SQS on-failure queue")
    return problems


def _notifies(stack: Stack, alarm: str) -> list[str]:
    if "AlarmActionArn" not in stack.template.get("Parameters", {}):
        return ["no parameter AlarmActionArn (the alarm notifies nobody)"]
    return _alarm_actions(stack, alarm)


def check_fanout_alarms(stack: Stack) -> list[str]:
    """Each on-failure queue has an alarm on its ApproximateNumberOfMessagesVisible (Maximum > 0,
    within 5 minutes: any message is records the fan-out, or the outcomes function, gave up on), and
    each stream reader (the stream processor, the outcomes function) an IteratorAge alarm (Maximum) that fires within 10 minutes of the fan-out stalling (threshold plus
    window), both notifying AlarmActionArn."""
    problems = []
    found = alarms(stack)
    for queue in sorted({q for q in on_failure_queues(stack).values() if q}):
        matching = [
            a for a in found if a.on("AWS/SQS", "ApproximateNumberOfMessagesVisible", QueueName="${%s.QueueName}" % queue)
        ]
        firing = [
            a
            for a in matching
            if a.above(0) and all(m.stat == "Maximum" for m in a.metrics)
            and a.window is not None and a.window <= QUEUE_ALARM_WITHIN_SECONDS
        ]
        if not firing:
            problems.append(
                f"no alarm on the messages of the on-failure queue {queue} (Maximum > 0 within "
                f"{QUEUE_ALARM_WITHIN_SECONDS} s; found {[a.logical_id for a in matching]})"
            )
        for alarm in firing:
            problems += _notifies(stack, alarm.logical_id)
    for processor in [f for binary in STREAM_READERS for f in functions_of(stack, binary)]:
        matching = [a for a in found if _lambda(stack, processor, "IteratorAge")(a)]
        firing = [
            a
            for a in matching
            if a.comparison.startswith("GreaterThan") and a.threshold is not None and a.window is not None
            and all(m.stat == "Maximum" for m in a.metrics)
            and a.threshold / 1000 + a.window <= ITERATOR_AGE_ALARM_WITHIN_SECONDS
        ]
        if not firing:
            problems.append(
                f"no IteratorAge alarm of {processor} that fires within {ITERATOR_AGE_ALARM_WITHIN_SECONDS} s of "
                f"the fan-out stalling (Maximum, threshold + window; found {[a.logical_id for a in matching]})"
            )
        for alarm in firing:
            problems += _notifies(stack, alarm.logical_id)
    return problems


def check_dead_letter_replay(stack: Stack) -> list[str]:
    """The stream processor can dead-letter what it gives up on and replay what it and its event
    sources gave up on: its DEAD_LETTER_QUEUE_URL is the URL (`Ref`) of the on-failure queue of its
    mappings; its role may SendMessage (its own dead letters, and Lambda's on-failure destination),
    ReceiveMessage, DeleteMessage and GetQueueAttributes (the replay) on exactly that queue, the SQS
    actions its code calls (`twopc_fanout::replay`), no other SQS action or queue; no other function
    may send to or read the queue; the queue takes the largest dead letter the code sends
    (MaximumMessageSize unset, SQS's default, or at least `MAX_DEAD_LETTER_BYTES`)."""
    problems = []
    variable = dead_letter_variable()
    code_actions = queue_actions_of_code()
    wanted = REPLAY_ACTIONS | DEAD_LETTER_ACTIONS | ON_FAILURE_ACTIONS
    for action in sorted(code_actions - wanted):
        problems.append(f"the stream processor's code calls {action} on its dead-letter queue: add it to the checks and the grants")
    wanted |= code_actions
    largest = replay_contract()["maxDeadLetterBytes"]
    processors = functions_of(stack, "stream-processor")
    if not processors:
        problems.append("no stream processor")
    queues_used: set[str] = set()
    for processor in processors:
        queues = {
            q
            for m, q in on_failure_queues(stack).items()
            if function_target(stack, stack.props(m).get("FunctionName")) == processor
        }
        if len(queues) != 1 or None in queues:
            problems.append(f"{processor}: its event sources' on-failure queues are {sorted(map(str, queues))}, expected one queue")
            continue
        (queue,) = queues
        queues_used.add(queue)
        value = environment(stack, processor).get(variable)
        if value != "${%s}" % queue:
            problems.append(f"{processor}: {variable} is {value!r}, not the URL of its on-failure queue {queue} (Ref)")
        size = stack.props(queue).get("MaximumMessageSize")
        if size is not None and (number(size) is None or number(size) < largest):
            problems.append(
                f"{queue}: MaximumMessageSize {size!r} is below {largest} bytes, the largest record the stream "
                f"processor dead-letters (replay::MAX_DEAD_LETTER_BYTES): such records would be refused"
            )
        role = role_of(stack, processor)
        arn = "${%s.Arn}" % queue
        for action in sorted(wanted):
            resources = granted(stack, role, action)
            if not resources:
                problems.append(f"{processor}: its role may not {action} on {queue}")
            elif set(resources) != {arn}:
                problems.append(f"{processor}: {action} is granted on {sorted(set(resources))}, not exactly {arn}")
        for statement in allow_statements(stack, role):
            for action in statement["Action"]:
                if str(action).lower().startswith("sqs:") and str(action) not in wanted:
                    problems.append(f"{processor}: its role has {action} (the code calls {sorted(code_actions)})")
    for function in functions(stack):
        if function in processors:
            continue
        for action in sorted(wanted):
            reached = [r for r in granted(stack, role_of(stack, function), action) if any(r == "${%s.Arn}" % q for q in queues_used) or r == "*"]
            if reached:
                problems.append(f"{function}: may {action} on {reached} (only the stream processor uses the dead-letter queue)")
    return sorted(set(problems), key=problems.index)


# ----------------------------------------------------------------------------------------------
# 13. Who may invoke a participant: the message keys and the participants' resource policies
# ----------------------------------------------------------------------------------------------

# Participants accept only messages signed (HMAC-SHA-256) with their service's key, which the
# coordinator and the sweeper read to sign (`twopc::auth`): the constants come from there and from
# `twopc::age` (the age-token key).
AUTH_SOURCE = REPO / "functions" / "twopc" / "src" / "auth.rs"
# The functions that sign participant messages (and hold the registry).
KEY_SIGNERS = ("coordinator", "sweeper")
SECRET_KIND = "AWS::SecretsManager::Secret"
SECRET_READ = "secretsmanager:GetSecretValue"
# What a template generates as a service's key: one key as `KeySet::parse` reads it, {"id": <id>,
# "secret": <generated>}; letters and digits only (it is put back by hand in JSON when rotating), long
# enough for an HMAC-SHA-256 key (the code refuses fewer than 16 bytes; 32 letters and digits carry
# about 190 bits).
KEY_SECRET_FIELD = "secret"
MIN_KEY_LENGTH = 32
# The AWS-managed key of Secrets Manager, which needs no KMS grant (a customer-managed one would).
AWS_MANAGED_SECRETS_KEY = "alias/aws/secretsmanager"
INVOKE = "lambda:InvokeFunction"


def auth_contract(source: Path = AUTH_SOURCE, config: Path = AGE_SOURCE) -> dict[str, Any]:
    """The local development keys' setting, the key variables, the message age and the key cache TTL,
    from `twopc::auth`, and the age-token key's variable, from `twopc::age`."""
    auth = rust_constants(source)
    names = {**auth, **rust_constants(config)}
    missing = [n for n in ["LOCAL_KEYS", "MAX_MESSAGE_AGE_MS"] if n not in auth]
    missing += [n for n in ["PARTICIPANT_KEYS", "PARTICIPANT_KEY", "AGE_TOKEN_KEY"] if n not in names]
    ttl = re.search(r"pub const KEY_CACHE_TTL: Duration = Duration::from_secs\(([0-9_]+)\);", source.read_text())
    if missing or ttl is None:
        raise AssertionError(f"no constant {missing or ['KEY_CACHE_TTL']} in {source} / {config}")
    return {
        "localKeys": str(auth["LOCAL_KEYS"]),
        "keysVariable": str(names["PARTICIPANT_KEYS"]),
        "keyVariable": str(names["PARTICIPANT_KEY"]),
        "ageTokenKeyVariable": str(names["AGE_TOKEN_KEY"]),
        "maxMessageAgeMs": int(auth["MAX_MESSAGE_AGE_MS"]),
        "keyCacheTtlSeconds": int(ttl.group(1).replace("_", "")),
    }


def _secret(stack: Stack, value: Any) -> str | None:
    """The secret of the template a resolved value names (`Ref` of a secret: its ARN)."""
    secret = ref_id(value)
    return secret if secret and stack.kind(secret) == SECRET_KIND and stack.exists(secret) else None


def _secret_reads(stack: Stack, function: str, wanted: set[str], who: str) -> list[str]:
    """The function's role may GetSecretValue on exactly `wanted`, and no other Secrets Manager action."""
    problems = []
    role = role_of(stack, function)
    readable = set(granted(stack, role, SECRET_READ))
    for resource in sorted(wanted - readable):
        problems.append(f"{function} ({who}): its role may not {SECRET_READ} on {resource}")
    for resource in sorted(readable - wanted):
        problems.append(f"{function} ({who}): its role may {SECRET_READ} on {resource}, beyond {sorted(wanted)}")
    for statement in allow_statements(stack, role):
        for action in statement["Action"]:
            if str(action).lower().startswith("secretsmanager:") and str(action).lower() != SECRET_READ.lower():
                problems.append(f"{function} ({who}): its role has {action} (the code only reads keys, {SECRET_READ})")
    return problems


def _key_secret_problems(stack: Stack, secret: str, service: str, contract: dict) -> list[str]:
    """A service's key: generated (never written in the template), {"id", "secret"} of letters and
    digits, long, under the AWS-managed key, shared by no resource policy, its description saying what
    it is and how to rotate it (the key cache TTL ahead, two TTLs after)."""
    problems = []
    where = f"{secret} (the key of {service})"
    props = stack.props(secret)
    if "SecretString" in props:
        problems.append(f"{where}: a SecretString in the template, readable by whoever may read the template: generate it")
    generate = props.get("GenerateSecretString")
    if not isinstance(generate, dict):
        problems.append(f"{where}: no GenerateSecretString")
    else:
        try:
            shape = json.loads(str(generate.get("SecretStringTemplate")))
        except json.JSONDecodeError:
            shape = None
        if not isinstance(shape, dict) or not isinstance(shape.get("id"), str) or not shape["id"] or KEY_SECRET_FIELD in shape:
            problems.append(
                f"{where}: SecretStringTemplate {generate.get('SecretStringTemplate')!r} is not a JSON object with a "
                f"key id (\"id\") and without {KEY_SECRET_FIELD!r} (the generated part)"
            )
        if generate.get("GenerateStringKey") != KEY_SECRET_FIELD:
            problems.append(f"{where}: GenerateStringKey {generate.get('GenerateStringKey')!r}, not {KEY_SECRET_FIELD!r} (what the code reads)")
        length = number(generate.get("PasswordLength"))
        if length is None or length < MIN_KEY_LENGTH:
            problems.append(f"{where}: PasswordLength {generate.get('PasswordLength')!r}, fewer than {MIN_KEY_LENGTH} characters")
        if str(generate.get("ExcludePunctuation")).lower() != "true":
            problems.append(f"{where}: ExcludePunctuation is not true (the key is put back by hand in JSON to rotate)")
    kms = props.get("KmsKeyId")
    if kms is not None and kms != AWS_MANAGED_SECRETS_KEY:
        problems.append(f"{where}: KmsKeyId {kms!r}: a customer-managed key needs kms:Decrypt, which no role has")
    description = " ".join(str(props.get("Description", "")).split())
    ttl = contract["keyCacheTtlSeconds"]
    wanted = ["HMAC-SHA-256", "notBefore", f"{ttl} s", f"{2 * ttl} s"]
    missing = [w for w in wanted if w not in description]
    if missing or service not in description:
        problems.append(f"{where}: its description does not say {missing or [service]} (what it is, how to rotate it)")
    for policy in stack.resources("AWS::SecretsManager::ResourcePolicy"):
        if _secret(stack, stack.props(policy).get("SecretId")) == secret:
            problems.append(f"{where}: resource policy {policy} lets principals beyond the roles read it")
    return problems


def check_participant_keys(stack: Stack) -> list[str]:
    """Every participant's PARTICIPANT_KEY is (the ARN of) a secret of the template of its own, which
    its role alone among the participants may read (GetSecretValue on that secret, nothing else of
    Secrets Manager); the coordinator's and the sweeper's PARTICIPANT_KEYS name every registered
    service's secret and no other, and their roles may read exactly those; no other function reads a
    secret; each key is generated as the code reads it (see `_key_secret_problems`)."""
    contract = auth_contract()
    key_variable, keys_variable = contract["keyVariable"], contract["keysVariable"]
    problems: list[str] = []
    deployments = participant_deployments(stack)
    if not deployments:
        problems.append("no participant deployments")
    keys: dict[str, str] = {}  # service -> `${Secret}`
    owners: dict[str, str] = {}  # secret -> service
    for service, deployment in sorted(deployments.items()):
        function = deployment["function"]
        value = environment(stack, function).get(key_variable)
        secret = _secret(stack, value)
        if value == contract["localKeys"]:
            problems.append(f"participant {service} ({function}): {key_variable} names the local development keys")
        elif secret is None:
            problems.append(f"participant {service} ({function}): {key_variable} is {value!r}, not the ARN (Ref) of a secret of the template")
            continue
        if secret in owners:
            problems.append(f"participants {owners[secret]} and {service} share the key {secret}: each service needs its own")
        owners.setdefault(secret, service)
        keys[service] = "${%s}" % secret
        problems += _secret_reads(stack, function, {keys[service]}, f"participant {service}")
    every_key = set(keys.values())
    signers = [f for binary in KEY_SIGNERS for f in functions_of(stack, binary)]
    # The coordinator reads its own age-token key too (check_age_token_key).
    own = {f: {"${%s}" % secret} for f in functions_of(stack, "coordinator") if (secret := _age_token_secret(stack, f))}
    for binary in KEY_SIGNERS:
        if not functions_of(stack, binary):
            problems.append(f"no {binary}")
    for function in signers:
        if environment(stack, function).get(keys_variable) == contract["localKeys"]:
            problems.append(f"{function}: {keys_variable} names the local development keys")
            problems += _secret_reads(stack, function, every_key | own.get(function, set()), "signs for every service")
            continue
        named = json_variable(stack, function, keys_variable, problems)
        if named is None:
            if keys_variable not in environment(stack, function):
                problems.append(f"{function}: no {keys_variable}")
            continue
        if set(named) != set(deployments):
            problems.append(f"{function}: {keys_variable} names {sorted(named)}, the registered services are {sorted(deployments)}")
        for service, value in sorted(named.items()):
            if service in keys and value != keys[service]:
                problems.append(f"{function}: {keys_variable}[{service}] is {value!r}, not {service}'s key {keys[service]} (its participant's {key_variable})")
        problems += _secret_reads(stack, function, every_key | own.get(function, set()), "signs for every service")
    participants = {d["function"] for d in deployments.values()}
    for function in functions(stack):
        if function in participants or function in signers:
            continue
        problems += _secret_reads(stack, function, set(), "reads no key")
    for secret, service in sorted(owners.items()):
        problems += _key_secret_problems(stack, secret, service, contract)
    return sorted(set(problems), key=problems.index)


def _age_token_secret(stack: Stack, function: str) -> str | None:
    """The secret of the template the function's AGE_TOKEN_KEY names (Ref), or None."""
    return _secret(stack, environment(stack, function).get(auth_contract()["ageTokenKeyVariable"]))


def check_age_token_key(stack: Stack) -> list[str]:
    """Issue 42: the coordinator signs and verifies age tokens with a key of its own. Its AGE_TOKEN_KEY
    is (the ARN of) a secret of the template that is no participant service's message key (a participant
    can read its own: its operator could mint tokens), generated as the keys are (`_key_secret_problems`),
    and the coordinator's role is the only role that may read it (not the sweeper's, not a participant's)."""
    contract = auth_contract()
    variable = contract["ageTokenKeyVariable"]
    problems: list[str] = []
    coordinators = functions_of(stack, "coordinator")
    if not coordinators:
        return ["no coordinator"]
    message_keys = {
        secret
        for d in participant_deployments(stack).values()
        if (secret := _secret(stack, environment(stack, d["function"]).get(contract["keyVariable"])))
    }
    secrets: set[str] = set()
    for function in coordinators:
        value = environment(stack, function).get(variable)
        secret = _secret(stack, value)
        if value is None:
            problems.append(f"{function}: no {variable} (the coordinator's own age-token key)")
        elif value == contract["localKeys"]:
            problems.append(f"{function}: {variable} names the local development keys")
        elif secret is None:
            problems.append(f"{function}: {variable} is {value!r}, not the ARN (Ref) of a secret of the template")
        elif secret in message_keys:
            problems.append(f"{function}: {variable} names {secret}, a participant's message key (its participant can read it)")
        else:
            secrets.add(secret)
            if "${%s}" % secret not in set(granted(stack, role_of(stack, function), SECRET_READ)):
                problems.append(f"{function}: its role may not {SECRET_READ} on its {variable} {secret}")
    readers = {role_of(stack, f) for f in coordinators}
    for secret in sorted(secrets):
        for role in sorted(stack.resources("AWS::IAM::Role")):
            if role not in readers and "${%s}" % secret in set(granted(stack, role, SECRET_READ)):
                problems.append(f"{role}: may {SECRET_READ} on the coordinator's age-token key {secret}; only the coordinator's role may")
        problems += _key_secret_problems(stack, secret, "coordinator", contract)
    return sorted(set(problems), key=problems.index)


def _permission_target(stack: Stack, value: Any) -> str | None:
    """The function a permission's FunctionName names: the function, an alias or version of it, or
    its name or ARN with a qualifier (`${Fn}:live`, `${Fn.Arn}:live`)."""
    target = function_target(stack, value)
    if target is not None:
        return target
    match = re.match(r"^(\$\{[A-Za-z0-9]+(?:\.Arn)?\}):[^:]+$", str(value))
    return function_target(stack, match.group(1)) if match else None


def check_participant_invokers(stack: Stack) -> list[str]:
    """Each participant's resource policy (its AWS::Lambda::Permission resources) allows
    lambda:InvokeFunction on its `live` alias (what the registries name) to exactly the coordinator's and
    the sweeper's roles (their ARNs), and no permission on the participant, on any of its aliases or
    versions, names another principal (a service, an account, "*", another role) or another action."""
    problems: list[str] = []
    callers: dict[str, str] = {}  # `${Role.Arn}` -> function
    for binary in KEY_SIGNERS:
        found = functions_of(stack, binary)
        if not found:
            problems.append(f"no {binary}")
        for function in found:
            role = role_of(stack, function)
            if role is None:
                problems.append(f"{function}: its role is not a role of this template")
            else:
                callers["${%s.Arn}" % role] = function
    deployments = participant_deployments(stack)
    if not deployments:
        problems.append("no participant deployments")
    by_function: dict[str, list[tuple[str, dict]]] = {}
    for permission in sorted(stack.resources("AWS::Lambda::Permission")):
        props = stack.props(permission)
        target = _permission_target(stack, props.get("FunctionName"))
        if target is not None:
            by_function.setdefault(target, []).append((permission, props))
    for service, deployment in sorted(deployments.items()):
        function, alias = deployment["function"], deployment["alias"]
        on_alias: set[str] = set()
        for permission, props in by_function.get(function, []):
            principal = props.get("Principal")
            where = f"{permission} (participant {service})"
            if props.get("Action") != INVOKE:
                problems.append(f"{where}: action {props.get('Action')!r}, not {INVOKE}")
            if principal not in callers:
                problems.append(f"{where}: allows {principal!r}, which is neither the coordinator's nor the sweeper's role")
            elif props.get("Action") == INVOKE and props.get("FunctionName") in alias_references(function, alias):
                on_alias.add(str(principal))
        for principal, caller in sorted(callers.items()):
            if principal not in on_alias:
                problems.append(
                    f"participant {service} ({function}): its '{ALIAS_NAME}' alias has no permission for {caller}'s role "
                    f"{principal} (the resource policy must name exactly the coordinator's and the sweeper's roles)"
                )
    return sorted(set(problems), key=problems.index)


def _paths_of(value: Any, text: str, path: str = "") -> list[str]:
    """Where in a template `text` occurs (in a key or a value)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in ([f"{path}/{k}"] if text in str(k) else []) + _paths_of(v, text, f"{path}/{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _paths_of(v, text, f"{path}/{i}")]
    return [path or "/"] if isinstance(value, str) and text in value else []


def check_no_local_keys(stack: Stack) -> list[str]:
    """The local stack's fixed development keys (`twopc::auth::LOCAL_KEYS`, the same in every checkout,
    the sample events are signed with them) appear nowhere in the template: not as a key variable, a
    parameter's default or allowed value, a mapping, a description."""
    local = auth_contract()["localKeys"]
    return [f"{path}: names {local!r}, the development keys every checkout shares" for path in _paths_of(stack.template, local)]


# ----------------------------------------------------------------------------------------------
# 14. Resource participants: where their resource is, how long they run, what they may touch
# ----------------------------------------------------------------------------------------------

# Each variable a resource participant's binary reads beyond the participant library's (the generic
# participant's variables): the parameter that sets it (the same in both templates), the placeholder
# default (nothing answers there: the deployer gives the real address) and what its description says.
RESOURCE_PARAMETERS = {
    "PAYMENT_API_URL": {
        "parameter": "PaymentApiUrl",
        "default": "https://payments.example.com",
        "description": ["placeholder", "idempotency keys", "authorizations", "capture", "void", "HTTPS", "VPC"],
    },
}
# Another value the parameters are evaluated with, so that a hard-coded default does not pass.
RESOURCE_PARAMETER_OTHER_VALUE = "https://api.payments.test/v2"
# A resource participant's prepare retries its resource until the transaction's deadline (at most the
# contract's maxTransactionTimeoutMs) and the clock margin, then writes its barrier entry: its
# function's timeout exceeds the longest transaction by at least this much (as the coordinator's).
RESOURCE_PREPARE_MARGIN_MS = 10_000
# The barrier: a resource participant's entries in its own table (twopc::participant::barrier).
BARRIER_SOURCE = REPO / "functions" / "twopc" / "src" / "participant" / "barrier.rs"


def barrier_actions(source: Path = BARRIER_SOURCE) -> set[str]:
    """The DynamoDB actions the barrier calls (through template_checks.SDK_CALLS): all a resource
    participant's role needs of DynamoDB, on its own table."""
    text = source.read_text()
    actions = {action for call, action in SDK_CALLS.items() if action.startswith("dynamodb:") and call in text}
    if not actions:
        raise AssertionError(f"{source} calls no DynamoDB action: is the barrier elsewhere now?")
    return actions


def _resource_parameter_problems(stack: Stack) -> list[str]:
    """Each resource variable is set from its parameter on every function of a binary that reads it,
    and on no other function; the parameter is a String whose default is the placeholder."""
    problems: list[str] = []
    contract = stack.code["functionEnvironment"]
    library = set(contract.get(PARTICIPANT_BINARY, []))
    for binary in resource_binaries(stack):
        for variable in sorted(set(contract[binary]) - library):
            if variable not in RESOURCE_PARAMETERS:
                problems.append(f"{binary} reads {variable}, which no parameter of RESOURCE_PARAMETERS sets")
    for variable, spec in RESOURCE_PARAMETERS.items():
        parameter, default = spec["parameter"], spec["default"]
        readers = sorted(binary for binary, names in contract.items() if variable in names)
        if not readers:
            problems.append(f"no binary of the code reads {variable} (RESOURCE_PARAMETERS is stale)")
            continue
        problems += _parameter(stack, parameter, default)
        definition = stack.template.get("Parameters", {}).get(parameter)
        if definition is not None:
            if definition.get("Type") != "String":
                problems.append(f"parameter {parameter}: type {definition.get('Type')!r}, not String")
            description = " ".join(str(definition.get("Description", "")).split())
            missing = [w for w in spec["description"] if w.lower() not in description.lower()]
            if missing:
                problems.append(f"parameter {parameter}: its description does not say {missing}")
        for value in [default, RESOURCE_PARAMETER_OTHER_VALUE]:
            evaluated = stack.with_parameters(**{parameter: value})
            found = [f for binary in readers for f in functions_of(evaluated, binary)]
            if not found:
                problems.append(f"no function runs {readers} (which read {variable})")
            for function in functions(evaluated):
                env = environment(evaluated, function)
                if function in found and env.get(variable) != value:
                    problems.append(f"{function}: {variable} is {env.get(variable)!r} with {parameter}={value}")
                elif function not in found and variable in env:
                    problems.append(f"{function} sets {variable}, which only {readers} read")
    return problems


def check_resource_participants(stack: Stack) -> list[str]:
    """Every resource participant (a participant binary that drives a resource: the example payments)
    gets its resource's address from its parameter (RESOURCE_PARAMETERS: PAYMENT_API_URL from
    PaymentApiUrl, on it alone); its function runs longer than its slowest path (a prepare retrying
    the resource until the latest deadline) and no shorter than any other participant's, outside any
    VPC (it calls its resource over the internet); its role may call on DynamoDB exactly what the
    barrier calls, on its own table only (no item, no transaction record)."""
    problems = _resource_parameter_problems(stack)
    deployments = participant_deployments(stack)
    resources = {service: d for service, d in deployments.items() if d["resource"]}
    if resource_binaries(stack) and not resources:
        problems.append(f"no participant deployment runs a resource participant {resource_binaries(stack)}")
    maximum_ms = stack.code["maxTransactionTimeoutMs"]
    needed_ms = maximum_ms + RESOURCE_PREPARE_MARGIN_MS
    others = {
        d["function"]: number(stack.props(d["function"]).get("Timeout", 3)) for d in deployments.values() if not d["resource"]
    }
    longest_other = max((t for t in others.values() if t is not None), default=0)
    barrier = barrier_actions()
    ids = table_ids(stack)
    for service, deployment in sorted(resources.items()):
        function = deployment["function"]
        where = f"resource participant {service} ({function})"
        props = stack.props(function)
        timeout = number(props.get("Timeout", 3))
        if timeout is None or timeout * 1000 < needed_ms:
            problems.append(
                f"{where}: timeout {timeout} s; a prepare may retry its resource for {maximum_ms} ms (the longest "
                f"transaction), so it needs at least {needed_ms // 1000} s"
            )
        if timeout is not None and timeout < longest_other:
            problems.append(f"{where}: timeout {timeout} s, shorter than another participant's {longest_other} s")
        if props.get("VpcConfig"):
            problems.append(f"{where}: in a VPC ({props['VpcConfig']!r}); it calls its resource over the internet")
        role = role_of(stack, function)
        own = "${%s.Arn}" % ids.get(deployment["table"])
        on_own: set[str] = set()
        for statement in allow_statements(stack, role):
            actions = sorted(str(a) for a in statement["Action"] if str(a).startswith("dynamodb:"))
            if not actions:
                continue
            for resource in statement["Resource"]:
                if resource != own:
                    problems.append(
                        f"{where}: its role {role} may {actions} on {resource}; a resource participant touches "
                        f"its own table's barrier entries only ({own})"
                    )
                else:
                    on_own.update(actions)
        for action in sorted(barrier - on_own):
            problems.append(f"{where}: its role {role} may not {action} on its table; the barrier calls it")
        for action in sorted(on_own - barrier):
            problems.append(f"{where}: its role {role} may {action} on its table; the barrier never calls it")
    return sorted(set(problems), key=problems.index)


# 15. Held transactions: their two routes, and the coordinator's hold policy
# ----------------------------------------------------------------------------------------------

# The bounds and defaults of a hold (`twopc::model`), and the coordinator's variables (`twopc::hold`).
MODEL_SOURCE = REPO / "functions" / "twopc" / "src" / "model" / "request.rs"
HOLD_POLICY_PARAMETER = "HoldPolicy"
MAX_HOLD_PARAMETER = "MaxHoldMs"
# `{}`: no service named, so every service accepts holds up to the code's default (15 minutes).
HOLD_POLICY_DEFAULT = "{}"
# Values the parameters may take besides their defaults: the variables must follow them (the policy is
# the example of functions/twopc/src/hold.rs).
HOLD_POLICY_OTHER_VALUE = '{"service-a": {"maxHoldMs": 600000}, "service-b": {"accepts": false}}'
MAX_HOLD_OTHER_VALUE = "3600000"
# Values no other part of the template could hold by chance: where they show up, the parameter went.
HOLD_POLICY_MARKER = '{"hold-marker-service": {"maxHoldMs": 4321}}'
MAX_HOLD_MARKER = "4321987"


def hold_contract(config: Path = HOLD_SOURCE, model: Path = MODEL_SOURCE) -> dict[str, Any]:
    """The coordinator's hold variables (`twopc::hold`) and the bounds of a hold (`twopc::model`)."""
    names, bounds = rust_constants(config), rust_constants(model)
    missing = [n for n in ["HOLD_POLICY", "MAX_HOLD_MS"] if n not in names] + [
        n for n in ["MIN_HOLD_MS", "DEFAULT_MAX_HOLD_MS", "DEFAULT_SERVICE_MAX_HOLD_MS"] if n not in bounds
    ]
    if missing:
        raise AssertionError(f"no constant {missing} in {config} / {model}")
    return {
        "policyVariable": str(names["HOLD_POLICY"]),
        "maxVariable": str(names["MAX_HOLD_MS"]),
        "minHoldMs": int(bounds["MIN_HOLD_MS"]),
        "maxHoldMs": int(bounds["DEFAULT_MAX_HOLD_MS"]),
        "serviceMaxHoldMs": int(bounds["DEFAULT_SERVICE_MAX_HOLD_MS"]),
    }


def _route_arn_tail(route: tuple[str, str]) -> str:
    """The part of a route's execute-api ARN after the stage: `POST/transactions/x/commit`."""
    verb, path = route
    return verb + re.sub(r"\{[^}/]+\}", "x", path)


def _invoke_permitted(stack: Stack, function: str, api: str, route: tuple[str, str]) -> bool:
    """Whether a permission on the function lets API Gateway invoke it for the route of that API (its
    SourceArn `…:${api}/<stage>/<verb>/<path>`, `*` matching any text, as Lambda matches it)."""
    for name in stack.resources("AWS::Lambda::Permission"):
        props = stack.props(name)
        if function_target(stack, props.get("FunctionName")) != function:
            continue
        if props.get("Principal") != "apigateway.amazonaws.com" or props.get("Action") != "lambda:InvokeFunction":
            continue
        source = str(props.get("SourceArn"))
        marker = ":${%s}/" % api
        if marker not in source:
            continue
        _, _, after_stage = source.split(marker, 1)[1].partition("/")
        if fnmatch.fnmatchcase(_route_arn_tail(route), after_stage):
            return True
    return False


def check_hold_routes(stack: Stack) -> list[str]:
    """POST /transactions/{id}/commit and /abort (a held transaction's decision): on the API of POST
    /transactions, authorized exactly as it is (AWS_IAM, or the JWT authorizer when JwtIssuer is set:
    the coordinator lets only the principal that created a held transaction decide it, and reads that
    principal from the signed request or the authorizer's context), proxied to the coordinator, which
    API Gateway may invoke for that route."""
    problems: list[str] = []
    methods = rest_methods(stack)
    create = methods.get(CREATE_ROUTE)
    if create is None:
        return [f"REST route {' '.join(CREATE_ROUTE)} is missing"]
    if create["authorization"] != expected_rest_authorization(stack):
        problems.append(
            f"REST {' '.join(CREATE_ROUTE)}: authorization {create['authorization']!r}, not {expected_rest_authorization(stack)}"
        )
    coordinators = functions_of(stack, "coordinator")
    if not coordinators:
        problems.append("no coordinator")
    for route in HOLD_ROUTES:
        where = f"REST {' '.join(route)}"
        method = methods.get(route)
        if method is None:
            problems.append(f"{where} is missing (a held transaction could not be decided before its holdUntil)")
            continue
        if method["api"] != create["api"]:
            problems.append(f"{where}: on the API {method['api']}, not on POST /transactions' ({create['api']})")
        if method["authorizer"] != create["authorizer"]:
            problems.append(
                f"{where}: authorized as {method['authorizer']}, not as POST /transactions ({create['authorizer']})"
            )
        if method["integration_type"] != create["integration_type"]:
            problems.append(f"{where}: integration {method['integration_type']!r}, not POST /transactions' {create['integration_type']!r}")
        reached = [c for c in coordinators if "${%s.Arn}" % c in method["uri"]]
        if not reached:
            problems.append(f"{where} does not reach the coordinator: {method['uri']}")
        for coordinator in reached:
            if not _invoke_permitted(stack, coordinator, str(method["api"]), route):
                problems.append(f"{where}: no permission lets API Gateway invoke {coordinator} for it")
    return problems


def check_hold_policy(stack: Stack) -> list[str]:
    """HoldPolicy (String, default `{}`: every service accepts holds up to the code's 15 minutes) and
    MaxHoldMs (Number, default and MaxValue the code's 24 h, MinValue its shortest hold) reach the
    coordinator as HOLD_POLICY and MAX_HOLD_MS, with any value; no other function gets either variable
    or either parameter's value."""
    contract = hold_contract()
    policy_variable, max_variable = contract["policyVariable"], contract["maxVariable"]
    parameters = stack.template.get("Parameters", {})
    problems = _parameter(stack, HOLD_POLICY_PARAMETER, HOLD_POLICY_DEFAULT)
    policy = parameters.get(HOLD_POLICY_PARAMETER)
    if policy is not None:
        if policy.get("Type") != "String":
            problems.append(f"parameter {HOLD_POLICY_PARAMETER}: type {policy.get('Type')!r}, not String")
        pattern = policy.get("AllowedPattern")
        for value in [HOLD_POLICY_DEFAULT, HOLD_POLICY_OTHER_VALUE]:
            if pattern is not None and not re.fullmatch(str(pattern), value):
                problems.append(f"parameter {HOLD_POLICY_PARAMETER}: its AllowedPattern {pattern!r} refuses {value!r}")
    problems += _parameter(stack, MAX_HOLD_PARAMETER, contract["maxHoldMs"])
    maximum = parameters.get(MAX_HOLD_PARAMETER)
    if maximum is not None:
        if maximum.get("Type") != "Number":
            problems.append(f"parameter {MAX_HOLD_PARAMETER}: type {maximum.get('Type')!r}, not Number")
        for bound, want in [("MinValue", contract["minHoldMs"]), ("MaxValue", contract["maxHoldMs"])]:
            if number(maximum.get(bound)) != want:
                problems.append(f"parameter {MAX_HOLD_PARAMETER}: {bound} {maximum.get(bound)!r}, not {want} (the code's bound)")
    if policy is None or maximum is None:
        return problems
    for policy_value, max_value in [
        (stack.parameter(HOLD_POLICY_PARAMETER), stack.parameter(MAX_HOLD_PARAMETER)),
        (HOLD_POLICY_OTHER_VALUE, MAX_HOLD_OTHER_VALUE),
        (HOLD_POLICY_MARKER, MAX_HOLD_MARKER),
    ]:
        evaluated = stack.with_parameters(**{HOLD_POLICY_PARAMETER: policy_value, MAX_HOLD_PARAMETER: max_value})
        coordinators = functions_of(evaluated, "coordinator")
        if not coordinators:
            problems.append("no coordinator")
        for function in coordinators:
            env = environment(evaluated, function)
            if env.get(policy_variable) != policy_value:
                problems.append(
                    f"{function}: {policy_variable} is {env.get(policy_variable)!r} with {HOLD_POLICY_PARAMETER}={policy_value!r}"
                )
            if not _same_number(env.get(max_variable), max_value):
                problems.append(f"{function}: {max_variable} is {env.get(max_variable)!r} with {MAX_HOLD_PARAMETER}={max_value}")
        for function in functions(evaluated):
            if function in coordinators:
                continue
            env = environment(evaluated, function)
            for variable in [policy_variable, max_variable]:
                if variable in env:
                    problems.append(f"{function}: sets {variable}, which only the coordinator reads")
            text = json.dumps(env)
            if (policy_value, max_value) == (HOLD_POLICY_MARKER, MAX_HOLD_MARKER):
                for parameter, marker in [(HOLD_POLICY_PARAMETER, HOLD_POLICY_MARKER), (MAX_HOLD_PARAMETER, MAX_HOLD_MARKER)]:
                    if marker in text or json.dumps(marker)[1:-1] in text:
                        problems.append(f"{function}: its environment carries the {parameter} parameter, which is the coordinator's")
    return sorted(set(problems), key=problems.index)


# ----------------------------------------------------------------------------------------------
# 15. Authorization: IAM, or JSON Web Tokens through the authorizer function; the access policy;
# the connections one caller may hold
# ----------------------------------------------------------------------------------------------

ACCESS_POLICY_PARAMETER = "AccessPolicy"
ACCESS_POLICY_VARIABLE = "ACCESS_POLICY"
# The example wallets' balances are what non-admins may credit (issue 42): `{}` would allow no credits.
ACCESS_POLICY_DEFAULT = '{"allowCredits": {"service-a": ["balance"], "service-b": ["balance"]}}'
# The functions that read the access policy (issue 33's contract): who may do what (coordinator),
# follow what (connections), see what is pushed (stream processor), is an admin (authorizer).
ACCESS_POLICY_READERS = ("coordinator", "connections", "stream-processor", AUTHORIZER_BINARY)
# A policy of every field (infra/DEPLOY.md, "Authorization"): the parameter's pattern must take it.
ACCESS_POLICY_OTHER_VALUE = (
    '{"adminGroups": ["admins"], "adminClaim": "twopc:admin", "iamAdmins": ["ops-role"], '
    '"allowCredits": false, "readTables": ["service-a-data"], "writeServices": ["service-a"]}'
)
# The policy of every field with credits named per service: the parameter's pattern must take it too.
ACCESS_POLICY_NAMED_CREDITS = (
    '{"adminGroups": ["admins"], "iamAdmins": ["ops-role"], '
    '"allowCredits": {"service-a": ["balance"], "inventory": ["stock", "reserved"]}, "writeServices": null}'
)
# Values no other part of the template could hold by chance: where they show up, the parameter went.
ACCESS_POLICY_MARKER = '{"adminGroups": ["access-marker-group"]}'
JWT_ISSUER_MARKER = "https://issuer-marker.example.com/pool-4321"
JWT_AUDIENCE_MARKER = "audience-marker-4321"
JWKS_URL_PARAMETER = "JwksUrl"
JWKS_URL_MARKER = "https://keys-marker.example.com/jwks-4321.json"
JWT_VARIABLES = {"JWT_ISSUER": JWT_ISSUER_PARAMETER, "JWT_AUDIENCE": JWT_AUDIENCE_PARAMETER, "JWKS_URL": JWKS_URL_PARAMETER}
# The authorizer fetches the issuer's keys over HTTPS: it needs no AWS permission beyond its logs
# (and X-Ray's two actions when TracingMode is Active).
AUTHORIZER_LOG_ACTIONS = {"logs:CreateLogStream", "logs:PutLogEvents"}
XRAY_ACTIONS = {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
MAX_CONNECTIONS_PARAMETER = "MaxConnectionsPerPrincipal"
MAX_CONNECTIONS_VARIABLE = "MAX_CONNECTIONS_PER_PRINCIPAL"
MAX_CONNECTIONS_BOUNDS = (1, 1000)
MAX_CONNECTIONS_OTHER_VALUE = "7"
# Push-time authorization: the stream processor reads its subscribers' connection items.
SUBSCRIBER_READ = "dynamodb:BatchGetItem"


def _string_parameter(stack: Stack, name: str, default: str, accepted: list[str], refused: list[str]) -> list[str]:
    """A String parameter with this default whose AllowedPattern (when it has one) takes `accepted` and
    refuses `refused`."""
    problems = _parameter(stack, name, default)
    definition = stack.template.get("Parameters", {}).get(name)
    if definition is None:
        return problems
    if definition.get("Type") != "String":
        problems.append(f"parameter {name}: type {definition.get('Type')!r}, not String")
    pattern = definition.get("AllowedPattern")
    for value in accepted:
        if pattern is not None and not re.fullmatch(str(pattern), value):
            problems.append(f"parameter {name}: its AllowedPattern {pattern!r} refuses {value!r}")
    for value in refused:
        if pattern is None or re.fullmatch(str(pattern), value):
            problems.append(f"parameter {name}: its AllowedPattern {pattern!r} takes {value!r}")
    return problems


def rule_failures(stack: Stack) -> list[str]:
    """The descriptions of the template's rule assertions that fail for its parameter values (what
    CloudFormation would refuse the stack for)."""
    failed = []
    for name, rule in stack.template.get("Rules", {}).items():
        condition = rule.get("RuleCondition")
        if condition is not None and not stack._truth(condition):
            continue
        for assertion in as_list(rule.get("Assertions")):
            if not stack._truth(assertion.get("Assert")):
                failed.append(f"{name}: {assertion.get('AssertDescription')}")
    return failed


def _authorizer_resources(stack: Stack) -> list[str]:
    """Everything that makes an API call an authorizer: authorizer resources, custom authorizers of the
    OpenAPI bodies, and the functions of the authorizer binary."""
    found = sorted(stack.resources("AWS::ApiGateway::Authorizer")) + sorted(stack.resources("AWS::ApiGatewayV2::Authorizer"))
    for api in stack.resources("AWS::ApiGateway::RestApi"):
        definitions = (stack.props(api).get("Body") or {}).get("securityDefinitions", {})
        found += [f"{api} securityDefinitions.{n}" for n, d in definitions.items() if "x-amazon-apigateway-authorizer" in d]
    return found + functions_of(stack, AUTHORIZER_BINARY)


def _authorizer_role_problems(stack: Stack, function: str) -> list[str]:
    """The authorizer's role: its own log group's two actions, X-Ray's with tracing on, nothing else."""
    problems = []
    traced = stack.with_parameters(TracingMode="Active")
    role = role_of(traced, function)
    group = log_group_of(traced, function)
    for statement in allow_statements(traced, role):
        actions = {str(a) for a in statement["Action"]}
        resources = [str(r) for r in statement["Resource"]]
        if actions <= XRAY_ACTIONS and resources == ["*"]:
            continue
        if actions <= AUTHORIZER_LOG_ACTIONS and resources == ["${%s.Arn}" % group]:
            continue
        problems.append(f"{function}: its role may {sorted(actions)} on {resources} (the authorizer needs its log group only)")
    return problems


def _authorizer_permission_problems(stack: Stack, function: str) -> list[str]:
    """API Gateway may invoke the authorizer for the authorizers of the REST API and of the WebSocket API
    (SourceArn `…:${Api}/authorizers/…`), and nobody may otherwise."""
    problems = []
    apis = sorted({m["api"] for m in rest_methods(stack).values() if m["api"]}) + sorted(stack.resources("AWS::ApiGatewayV2::Api"))
    covered: set[str] = set()
    prefix = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:"
    for name in sorted(stack.resources("AWS::Lambda::Permission")):
        props = stack.props(name)
        if function_target(stack, props.get("FunctionName")) != function:
            continue
        source = str(props.get("SourceArn"))
        match = re.fullmatch(re.escape(prefix) + r"\$\{([A-Za-z0-9]+)\}/authorizers/(\*|\$\{[A-Za-z0-9]+\})", source)
        if props.get("Principal") != "apigateway.amazonaws.com" or props.get("Action") != INVOKE or match is None:
            problems.append(
                f"{name}: lets {props.get('Principal')!r} {props.get('Action')!r} the authorizer from {source!r} "
                "(only API Gateway, for an API's authorizers)"
            )
            continue
        if match.group(1) not in apis:
            problems.append(f"{name}: lets the API {match.group(1)} invoke the authorizer, which is none of {apis}")
        covered.add(match.group(1))
    for api in apis:
        if api not in covered:
            problems.append(f"no permission lets API Gateway invoke the authorizer {function} for the authorizers of {api}")
    return problems


def _jwt_mode_problems(stack: Stack) -> list[str]:
    """With JwtIssuer set: one authorizer function, with the issuer, the audience and the access policy,
    only log permissions, invokable by API Gateway for both APIs; every REST method (not the preflight)
    and $connect use it."""
    problems = []
    authorizers = functions_of(stack, AUTHORIZER_BINARY)
    if len(authorizers) != 1:
        problems.append(f"JwtIssuer set: expected one authorizer function, found {authorizers}")
    for function in authorizers:
        env = environment(stack, function)
        for variable, parameter in JWT_VARIABLES.items():
            if env.get(variable) != stack.parameter(parameter):
                problems.append(f"{function}: {variable} is {env.get(variable)!r} with {parameter}={stack.parameter(parameter)!r}")
        problems += _authorizer_role_problems(stack, function)
        problems += _authorizer_permission_problems(stack, function)
    methods = rest_methods(stack)
    if not methods:
        problems.append("no REST methods")
    for (verb, path), method in sorted(methods.items()):
        if verb == "OPTIONS":
            if method["authorization"] != "NONE":
                problems.append(f"REST OPTIONS {path}: authorization {method['authorization']!r} (browsers never sign nor carry a token in a preflight)")
            continue
        problems += rest_authorization_problems(stack, f"REST {verb} {path}", method)
    routes = {str(stack.props(r).get("RouteKey")): stack.props(r) for r in stack.resources("AWS::ApiGatewayV2::Route")}
    if "$connect" not in routes:
        problems.append("no WebSocket $connect route")
    else:
        problems += connect_authorization_problems(stack, routes["$connect"])
    for key, route in sorted(routes.items()):
        if key != "$connect" and route.get("AuthorizationType") != "NONE":
            problems.append(f"WebSocket {key}: authorization {route.get('AuthorizationType')!r} (only $connect is authorized)")
    return problems


def check_authorization(stack: Stack) -> list[str]:
    """JwtIssuer, JwtAudience and JwksUrl: Strings defaulting to empty (the issuer and the keys' URL
    https:// URLs when set), a rule refusing an issuer without an audience. With JwtIssuer empty: every REST method (not the
    preflight) and $connect are AWS_IAM, no authorizer of any kind and no authorizer function exist.
    With it set: the authorizer function (JWT_ISSUER, JWT_AUDIENCE and JWKS_URL from the parameters, a role on its
    log group only, API Gateway allowed to invoke it for each API's authorizers) authorizes every REST
    method (REQUEST, the Authorization header, TTL 0) and $connect (REQUEST, no identity source)."""
    problems = _string_parameter(stack, JWT_ISSUER_PARAMETER, "", ["", JWT_ISSUER_EXAMPLE, JWT_ISSUER_MARKER], ["issuer.example.com", "http://issuer.example.com"])
    problems += _string_parameter(stack, JWT_AUDIENCE_PARAMETER, "", ["", JWT_AUDIENCE_EXAMPLE, JWT_AUDIENCE_MARKER], [])
    problems += _string_parameter(stack, JWKS_URL_PARAMETER, "", ["", JWKS_URL_MARKER], ["keys.example.com"])
    parameters = stack.template.get("Parameters", {})
    if JWT_ISSUER_PARAMETER not in parameters or JWT_AUDIENCE_PARAMETER not in parameters:
        return problems
    # The rule: an issuer needs an audience; neither, or both, deploy.
    if not rule_failures(with_jwt(stack, audience="")):
        problems.append(f"no rule refuses {JWT_ISSUER_PARAMETER} set with {JWT_AUDIENCE_PARAMETER} empty")
    for evaluated in [stack.with_parameters(JwtIssuer="", JwtAudience=""), with_jwt(stack)]:
        failed = rule_failures(evaluated)
        if failed:
            problems.append(f"rules refuse JwtIssuer={evaluated.parameter(JWT_ISSUER_PARAMETER)!r}: {failed}")
    # Without tokens: IAM everywhere, nothing of the authorizer.
    iam = stack.with_parameters(JwtIssuer="", JwtAudience="")
    if jwt_enabled(iam):
        problems.append("JwtIssuer empty still counts as set")
    for found in _authorizer_resources(iam):
        problems.append(f"JwtIssuer empty: {found} exists")
    for (verb, path), method in sorted(rest_methods(iam).items()):
        if verb != "OPTIONS" and method["authorization"] != "AWS_IAM":
            problems.append(f"JwtIssuer empty: REST {verb} {path}: authorization {method['authorization']!r}, not AWS_IAM")
    for route in iam.resources("AWS::ApiGatewayV2::Route"):
        props = iam.props(route)
        if props.get("RouteKey") == "$connect":
            problems += [f"JwtIssuer empty: {p}" for p in connect_authorization_problems(iam, props)]
            if "AuthorizerId" in props:
                problems.append(f"JwtIssuer empty: $connect names the authorizer {props['AuthorizerId']!r}")
    # With tokens (and with values no other part of the template could hold).
    problems += _jwt_mode_problems(with_jwt(stack))
    marked = with_jwt(stack, JWT_ISSUER_MARKER, JWT_AUDIENCE_MARKER).with_parameters(**{JWKS_URL_PARAMETER: JWKS_URL_MARKER})
    problems += _jwt_mode_problems(marked)
    for function in functions(marked):
        if function in functions_of(marked, AUTHORIZER_BINARY):
            continue
        text = json.dumps(environment(marked, function))
        for variable, marker in [("JWT_ISSUER", JWT_ISSUER_MARKER), ("JWT_AUDIENCE", JWT_AUDIENCE_MARKER), ("JWKS_URL", JWKS_URL_MARKER)]:
            if variable in environment(marked, function) or marker in text:
                problems.append(f"{function}: its environment carries {variable} (the authorizer's)")
    return sorted(set(problems), key=problems.index)


def check_access_policy(stack: Stack) -> list[str]:
    """AccessPolicy (String, a JSON object, its default naming the example wallets' balances as what
    non-admins may credit) reaches the coordinator, the connections function, the stream processor and
    (with JwtIssuer set) the authorizer as ACCESS_POLICY, with any value; no other function gets the
    variable or the parameter's value."""
    problems = _string_parameter(
        stack,
        ACCESS_POLICY_PARAMETER,
        ACCESS_POLICY_DEFAULT,
        ["{}", ACCESS_POLICY_DEFAULT, ACCESS_POLICY_OTHER_VALUE, ACCESS_POLICY_NAMED_CREDITS, ACCESS_POLICY_MARKER],
        ["admins"],
    )
    if ACCESS_POLICY_PARAMETER not in stack.template.get("Parameters", {}):
        return problems
    for base in [stack.with_parameters(JwtIssuer="", JwtAudience=""), with_jwt(stack)]:
        for value in [ACCESS_POLICY_DEFAULT, ACCESS_POLICY_OTHER_VALUE, ACCESS_POLICY_MARKER]:
            evaluated = base.with_parameters(**{ACCESS_POLICY_PARAMETER: value})
            readers: set[str] = set()
            for binary in ACCESS_POLICY_READERS:
                found = functions_of(evaluated, binary)
                if not found and (binary != AUTHORIZER_BINARY or jwt_enabled(evaluated)):
                    problems.append(f"no {binary} function (JwtIssuer {evaluated.parameter(JWT_ISSUER_PARAMETER)!r})")
                for function in found:
                    readers.add(function)
                    got = environment(evaluated, function).get(ACCESS_POLICY_VARIABLE)
                    if got != value:
                        problems.append(f"{function}: {ACCESS_POLICY_VARIABLE} is {got!r} with {ACCESS_POLICY_PARAMETER}={value!r}")
            for function in functions(evaluated):
                env = environment(evaluated, function)
                if function not in readers and ACCESS_POLICY_VARIABLE in env:
                    problems.append(f"{function}: sets {ACCESS_POLICY_VARIABLE}, which only {list(ACCESS_POLICY_READERS)} read")
                # The parameter goes to ACCESS_POLICY and nowhere else.
                others = json.dumps({k: v for k, v in env.items() if k != ACCESS_POLICY_VARIABLE})
                if value == ACCESS_POLICY_MARKER and (value in others or json.dumps(value)[1:-1] in others):
                    problems.append(f"{function}: a variable other than {ACCESS_POLICY_VARIABLE} carries the {ACCESS_POLICY_PARAMETER} parameter")
    return sorted(set(problems), key=problems.index)


def max_connections_contract(config: Path = CONNECTIONS_SOURCE, variables: Path = ENVIRONMENT_SOURCE) -> dict[str, Any]:
    """The variable's name (`twopc::environment`) and its default (`twopc_fanout::connections`)."""
    names = {**rust_constants(variables), **rust_constants(config)}
    missing = [n for n in ["MAX_CONNECTIONS_PER_PRINCIPAL", "DEFAULT_MAX_CONNECTIONS_PER_PRINCIPAL"] if n not in names]
    if missing:
        raise AssertionError(f"no constant {missing} in {variables} or {config}")
    return {"variable": str(names["MAX_CONNECTIONS_PER_PRINCIPAL"]), "default": int(names["DEFAULT_MAX_CONNECTIONS_PER_PRINCIPAL"])}


def check_max_connections(stack: Stack) -> list[str]:
    """MaxConnectionsPerPrincipal: a Number defaulting to the code's default (10), from 1 to 1000;
    every connections function's MAX_CONNECTIONS_PER_PRINCIPAL is its value (also with another), no
    other function's."""
    contract = max_connections_contract()
    if contract["variable"] != MAX_CONNECTIONS_VARIABLE:
        return [f"twopc::environment names the variable {contract['variable']!r}, not {MAX_CONNECTIONS_VARIABLE!r}"]
    problems = _parameter(stack, MAX_CONNECTIONS_PARAMETER, contract["default"])
    definition = stack.template.get("Parameters", {}).get(MAX_CONNECTIONS_PARAMETER)
    if definition is None:
        return problems
    if definition.get("Type") != "Number":
        problems.append(f"parameter {MAX_CONNECTIONS_PARAMETER}: type {definition.get('Type')!r}, not Number")
    for bound, want in zip(["MinValue", "MaxValue"], MAX_CONNECTIONS_BOUNDS):
        if number(definition.get(bound)) != want:
            problems.append(f"parameter {MAX_CONNECTIONS_PARAMETER}: {bound} {definition.get(bound)!r}, not {want}")
    for value in [str(contract["default"]), MAX_CONNECTIONS_OTHER_VALUE]:
        for evaluated in [stack.with_parameters(**{MAX_CONNECTIONS_PARAMETER: value}), with_jwt(stack).with_parameters(**{MAX_CONNECTIONS_PARAMETER: value})]:
            connections = functions_of(evaluated, "connections")
            if not connections:
                problems.append("no connections function")
            for function in functions(evaluated):
                got = environment(evaluated, function).get(MAX_CONNECTIONS_VARIABLE)
                if function in connections and not _same_number(got, value):
                    problems.append(f"{function}: {MAX_CONNECTIONS_VARIABLE} is {got!r} with {MAX_CONNECTIONS_PARAMETER}={value}")
                if function not in connections and got is not None:
                    problems.append(f"{function}: sets {MAX_CONNECTIONS_VARIABLE}, which only the connections function reads")
    return sorted(set(problems), key=problems.index)


def check_subscriber_reads(stack: Stack) -> list[str]:
    """Push-time authorization: the stream processor may BatchGetItem the connections table (its
    subscribers' connection items), nothing else with it, and no other function may."""
    problems = []
    tables = table_ids(stack)
    connections = "${%s.Arn}" % tables.get("connections")
    processors = functions_of(stack, "stream-processor")
    if not processors:
        problems.append("no stream processor")
    for function in functions(with_jwt(stack)):
        granted_on = granted(with_jwt(stack), role_of(with_jwt(stack), function), SUBSCRIBER_READ)
        if function in processors:
            if granted_on != [connections]:
                problems.append(f"{function}: {SUBSCRIBER_READ} on {granted_on}, not on the connections table {connections} alone")
        elif connections in granted_on:
            problems.append(f"{function}: may {SUBSCRIBER_READ} the connections table (only the stream processor reads its subscribers)")
    return problems


# ----------------------------------------------------------------------------------------------
# A deployment an auditor signs off: the alarm topic, the APIs' access logs, the lake's versions and
# access logging, the narrower writes of transaction records, who may invoke each function, the WAF
# ----------------------------------------------------------------------------------------------

ALARM_TOPIC_OUTPUT = "AlarmTopicArn"
KMS_FOR_CLOUDWATCH = {"kms:decrypt", "kms:generatedatakey*"}


def _alarm_topic(stack: Stack) -> str | None:
    """The topic the stack creates for its alarms (AlarmActionArn empty), if exactly one."""
    topics = sorted(stack.with_parameters(AlarmActionArn="").resources("AWS::SNS::Topic"))
    return topics[0] if len(topics) == 1 else None


def _alarm_actions(stack: Stack, alarm: str) -> list[str]:
    """With AlarmActionArn set the alarm notifies exactly that topic; empty, exactly the stack's own."""
    problems = []
    with_topic = stack.with_parameters(AlarmActionArn=SNS_TOPIC).props(alarm).get("AlarmActions")
    if as_list(with_topic) != [SNS_TOPIC]:
        problems.append(f"{alarm}: with AlarmActionArn set, its actions are {with_topic!r}, not that topic")
    own = _alarm_topic(stack)
    without = stack.with_parameters(AlarmActionArn="").props(alarm).get("AlarmActions")
    if own is None or as_list(without) != ["${%s}" % own]:
        problems.append(f"{alarm}: with AlarmActionArn empty, its actions are {without!r}, not the stack's own topic ({own})")
    return problems


def check_alarm_topic(stack: Stack) -> list[str]:
    """AlarmActionArn empty (the default): the stack creates one SNS topic, encrypted with a KMS key of
    its own (rotated, its policy letting CloudWatch use it: alarms cannot publish to a topic under the
    AWS-managed aws/sns key), and the output AlarmTopicArn names it; AlarmActionArn set: no topic and
    no key, the output names the given topic. Every alarm notifies the one the output names."""
    problems = _parameter(stack, "AlarmActionArn", "")
    empty = stack.with_parameters(AlarmActionArn="")
    given = stack.with_parameters(AlarmActionArn=SNS_TOPIC)
    topic = _alarm_topic(stack)
    if topic is None:
        problems.append(f"with AlarmActionArn empty, SNS topics {sorted(empty.resources('AWS::SNS::Topic'))}, not one")
    else:
        key = ref_id(empty.props(topic).get("KmsMasterKeyId")) or att_id(empty.props(topic).get("KmsMasterKeyId"), "Arn")
        if key is None or empty.kind(key) != "AWS::KMS::Key" or not empty.exists(key):
            problems.append(f"{topic}: not encrypted with a KMS key of the template ({empty.props(topic).get('KmsMasterKeyId')!r})")
        else:
            props = empty.props(key)
            if str(props.get("EnableKeyRotation")).lower() != "true":
                problems.append(f"{key}: key rotation is off")
            allowed = set()
            for statement in as_list(props.get("KeyPolicy", {}).get("Statement")):
                if statement.get("Effect") != "Allow":
                    continue
                principal = statement.get("Principal")
                if principal in ("*", {"AWS": "*"}):
                    problems.append(f"{key}: its policy allows everyone")
                if isinstance(principal, dict) and principal.get("Service") == "cloudwatch.amazonaws.com":
                    allowed |= {str(a).lower() for a in as_list(statement.get("Action"))}
            if not KMS_FOR_CLOUDWATCH <= allowed:
                problems.append(f"{key}: its policy does not let CloudWatch alarms use it ({sorted(KMS_FOR_CLOUDWATCH)})")
    outputs = stack.template.get("Outputs", {})
    if ALARM_TOPIC_OUTPUT not in outputs:
        problems.append(f"no output {ALARM_TOPIC_OUTPUT}")
    else:
        if topic and empty.resolve(outputs[ALARM_TOPIC_OUTPUT].get("Value")) != "${%s}" % topic:
            problems.append(f"output {ALARM_TOPIC_OUTPUT} does not name the stack's topic {topic} when AlarmActionArn is empty")
        if given.resolve(outputs[ALARM_TOPIC_OUTPUT].get("Value")) != SNS_TOPIC:
            problems.append(f"output {ALARM_TOPIC_OUTPUT} does not name AlarmActionArn when it is set")
    for kind in ["AWS::SNS::Topic", "AWS::KMS::Key"]:
        if given.resources(kind):
            problems.append(f"with AlarmActionArn set, the stack still creates {sorted(given.resources(kind))}")
    if not alarms(stack):
        problems.append("no alarms")
    for alarm in alarms(stack):
        problems += _alarm_actions(stack, alarm.logical_id)
    return problems


# --- the APIs' access logs -----------------------------------------------------------------------

ACCOUNT_ROLE_PARAMETER = "ApiGatewayAccountRole"
ACCOUNT_ROLE_VALUES = ["Create", "Existing"]
LOG_RETENTION_OTHER_VALUE = "90"
# What every access log line must say, by field meaning: the variables that tell it (any one of each).
ACCESS_LOG_FIELDS = {
    "rest": {
        "request id": ["$context.requestId"],
        "caller (IAM)": ["$context.identity.userArn"],
        "principal (JWT)": ["$context.authorizer.principal"],
        "method": ["$context.httpMethod"],
        "route": ["$context.resourcePath"],
        "status": ["$context.status"],
        "latency": ["$context.responseLatency"],
        "error message (quoted by API Gateway)": ["$context.error.messageString"],
    },
    "websocket": {
        "request id": ["$context.requestId"],
        "caller (IAM)": ["$context.identity.userArn"],
        "principal (JWT)": ["$context.authorizer.principal"],
        "route": ["$context.routeKey"],
        "status": ["$context.status"],
        "latency": ["$context.integrationLatency"],
        "error message (quoted by API Gateway)": ["$context.error.messageString"],
    },
}
# Free text API Gateway writes as it is: a `"` in it would break the JSON line (and the metric filters
# reading it), so no access log names these. The error message goes in as $context.error.messageString,
# which API Gateway writes quoted and escaped itself: never inside quotes of the format's own.
ACCESS_LOG_UNESCAPED = ["$context.error.message", "$context.path"]
ACCESS_LOG_SELF_QUOTED = ["$context.error.messageString"]


def _access_log_problems(stack: Stack, where: str, settings: Any, kind: str, function_groups: set[str]) -> tuple[list[str], str | None]:
    if not isinstance(settings, dict) or not settings.get("DestinationArn"):
        return [f"{where}: no access log"], None
    problems = []
    group = att_id(settings.get("DestinationArn"), "Arn")
    if group is None or stack.kind(group) != "AWS::Logs::LogGroup":
        problems.append(f"{where}: access log {settings.get('DestinationArn')!r} is not a log group of the template")
    elif group in function_groups:
        problems.append(f"{where}: access log {group} is a function's log group")
    else:
        other = stack.with_parameters(LogRetentionInDays=LOG_RETENTION_OTHER_VALUE).props(group).get("RetentionInDays")
        if not _same_number(other, LOG_RETENTION_OTHER_VALUE):
            problems.append(f"{group}: retention {other!r} with LogRetentionInDays={LOG_RETENTION_OTHER_VALUE}")
    text = str(settings.get("Format"))
    for variable in ACCESS_LOG_UNESCAPED:
        if re.search(re.escape(variable) + r"(?![A-Za-z0-9_.])", text):
            problems.append(f"{where}: access log names {variable}, free text API Gateway does not escape (a quote in it breaks the line)")
    # Each self-quoted variable stands for a JSON string: in quotes of the format's own, the line breaks.
    for variable in ACCESS_LOG_SELF_QUOTED:
        text = re.sub(re.escape(variable) + r"(?![A-Za-z0-9_])", lambda _, v=variable: json.dumps(v), text)
    try:
        fields = json.loads(text)
    except json.JSONDecodeError:
        return problems + [f"{where}: access log format is not JSON (with {ACCESS_LOG_SELF_QUOTED} as the strings API Gateway writes): {settings.get('Format')!r}"], group
    values = " ".join(str(v) for v in fields.values()) if isinstance(fields, dict) else ""
    for meaning, variables in ACCESS_LOG_FIELDS[kind].items():
        if not any(v in values.split() or f"{v} " in values or values.endswith(v) for v in variables):
            problems.append(f"{where}: access log lines do not say the {meaning} ({variables})")
    return problems, group


def check_access_logs(stack: Stack) -> list[str]:
    """Each REST and WebSocket stage writes JSON access logs (request id, IAM caller and JWT principal,
    route, status, latency) to a log group of its own with the LogRetentionInDays retention; with
    ApiGatewayAccountRole=Create (the default) the stack sets API Gateway's account CloudWatch role (an
    AWS::ApiGateway::Account naming a retained role API Gateway assumes) and each access log group
    references it (so the setting exists before a stage logs), with Existing it touches neither."""
    problems = _parameter(stack, ACCOUNT_ROLE_PARAMETER, "Create", ACCOUNT_ROLE_VALUES)
    function_groups = {g for f in functions(stack) if (g := log_group_of(stack, f))}
    groups = []
    stages = [(s, stack.props(s).get("AccessLogSetting"), "rest") for s in stack.resources("AWS::ApiGateway::Stage")]
    stages += [(s, stack.props(s).get("AccessLogSettings"), "websocket") for s in stack.resources("AWS::ApiGatewayV2::Stage")]
    if {kind for _, _, kind in stages} != {"rest", "websocket"}:
        problems.append(f"stages {[s for s, _, _ in stages]}: not a REST and a WebSocket stage")
    for stage, settings, kind in stages:
        found, group = _access_log_problems(stack, stage, settings, kind, function_groups)
        problems += found
        if group:
            groups.append(group)
    create = stack.with_parameters(**{ACCOUNT_ROLE_PARAMETER: "Create"})
    accounts = sorted(create.resources("AWS::ApiGateway::Account"))
    if len(accounts) != 1:
        problems.append(f"with {ACCOUNT_ROLE_PARAMETER}=Create: API Gateway accounts {accounts}, not one")
    for account in accounts:
        role = att_id(create.props(account).get("CloudWatchRoleArn"), "Arn")
        if role is None or create.kind(role) != "AWS::IAM::Role" or not create.exists(role):
            problems.append(f"{account}: its CloudWatchRoleArn is not a role of the template")
        else:
            trust = json.dumps(create.props(role).get("AssumeRolePolicyDocument"))
            if "apigateway.amazonaws.com" not in trust:
                problems.append(f"{role}: API Gateway may not assume it")
            if create.template["Resources"][role].get("DeletionPolicy") != "Retain":
                problems.append(f"{role}: not retained (the account setting that names it outlives the stack)")
        for group in groups:
            if "${%s}" % account not in json.dumps(create.props(group)):
                problems.append(f"{group}: does not reference {account} (a stage could log before the account role is set)")
    existing = stack.with_parameters(**{ACCOUNT_ROLE_PARAMETER: "Existing"})
    if existing.resources("AWS::ApiGateway::Account"):
        problems.append(f"with {ACCOUNT_ROLE_PARAMETER}=Existing the stack still sets API Gateway's account settings")
    for role in existing.resources("AWS::IAM::Role"):
        if "apigateway.amazonaws.com" in json.dumps(existing.props(role).get("AssumeRolePolicyDocument")):
            problems.append(f"with {ACCOUNT_ROLE_PARAMETER}=Existing the stack still creates API Gateway's role {role}")
    return problems


# --- the lake: versions, and who read or wrote it --------------------------------------------------

LAKE_ACCESS_PARAMETER = "LakeAccessLogging"
LAKE_ACCESS_VALUES = ["S3ServerAccessLogs", "CloudTrailDataEvents"]


def _lake_buckets(stack: Stack) -> list[str]:
    out = []
    for stream in stack.resources("AWS::KinesisFirehose::DeliveryStream"):
        bucket = att_id(stack.props(stream).get("ExtendedS3DestinationConfiguration", {}).get("BucketARN"), "Arn")
        if bucket:
            out.append(bucket)
    return out


def _bucket_allows(stack: Stack, bucket: str, service: str, action: str) -> list[dict]:
    """The Allow statements of the bucket's policies granting `action` to a service principal."""
    out = []
    for policy in stack.resources("AWS::S3::BucketPolicy"):
        props = stack.props(policy)
        if ref_id(props.get("Bucket")) != bucket:
            continue
        for statement in as_list(props.get("PolicyDocument", {}).get("Statement")):
            principal = statement.get("Principal")
            if (
                statement.get("Effect") == "Allow"
                and isinstance(principal, dict) and principal.get("Service") == service
                and action in as_list(statement.get("Action"))
            ):
                out.append(statement)
    return out


def check_lake_versions_and_access(stack: Stack) -> list[str]:
    """The lake bucket is versioned with a lifecycle rule expiring noncurrent versions; who read or
    wrote it is logged into another bucket of the template, by LakeAccessLogging: S3 server access
    logs (the bucket's LoggingConfiguration, the log bucket's policy letting S3's logging service of this
    account write for the lake only) or a logging CloudTrail trail of the lake's object-level data
    events (log file validation on, into a bucket of the template that lets CloudTrail write), never
    neither."""
    problems = _parameter(stack, LAKE_ACCESS_PARAMETER, "S3ServerAccessLogs", LAKE_ACCESS_VALUES)
    lakes = _lake_buckets(stack)
    if not lakes:
        problems.append("no lake bucket (Firehose destination)")
    for lake in lakes:
        props = stack.props(lake)
        if props.get("VersioningConfiguration", {}).get("Status") != "Enabled":
            problems.append(f"{lake}: not versioned")
        rules = [
            r for r in as_list(props.get("LifecycleConfiguration", {}).get("Rules"))
            if r.get("Status") == "Enabled" and (number((r.get("NoncurrentVersionExpiration") or {}).get("NoncurrentDays")) or 0) > 0
        ]
        if not rules:
            problems.append(f"{lake}: no enabled lifecycle rule expiring noncurrent versions")
        server = stack.with_parameters(**{LAKE_ACCESS_PARAMETER: "S3ServerAccessLogs"})
        logging = server.props(lake).get("LoggingConfiguration") or {}
        target = ref_id(logging.get("DestinationBucketName"))
        if target is None or server.kind(target) != "AWS::S3::Bucket" or target == lake:
            problems.append(f"{lake}: with S3ServerAccessLogs, no server access logs into another bucket of the template ({logging!r})")
        else:
            granted_to_logging = [
                s for s in _bucket_allows(server, target, "logging.s3.amazonaws.com", "s3:PutObject")
                if json.dumps(s.get("Condition", {})).count("${%s.Arn}" % lake) == 1 and "aws:SourceAccount" in json.dumps(s.get("Condition", {}))
            ]
            if not granted_to_logging:
                problems.append(f"{target}: its policy does not let S3 server access logging write the lake's logs (SourceArn the lake, SourceAccount)")
        trail = stack.with_parameters(**{LAKE_ACCESS_PARAMETER: "CloudTrailDataEvents"})
        if trail.props(lake).get("LoggingConfiguration"):
            problems.append(f"{lake}: with CloudTrailDataEvents, server access logs too")
        trails = []
        for name in trail.resources("AWS::CloudTrail::Trail"):
            tp = trail.props(name)
            selectors = json.dumps(tp.get("AdvancedEventSelectors") or tp.get("EventSelectors") or [])
            if "${%s.Arn}/" % lake in selectors and "Data" in selectors and "AWS::S3::Object" in selectors:
                trails.append((name, tp))
        if not trails:
            problems.append(f"{lake}: with CloudTrailDataEvents, no trail of its object-level data events")
        for name, tp in trails:
            if str(tp.get("IsLogging")).lower() != "true":
                problems.append(f"{name}: not logging")
            if str(tp.get("EnableLogFileValidation")).lower() != "true":
                problems.append(f"{name}: no log file validation")
            bucket = ref_id(tp.get("S3BucketName"))
            if bucket is None or trail.kind(bucket) != "AWS::S3::Bucket" or bucket == lake:
                problems.append(f"{name}: does not deliver to another bucket of the template")
            elif not _bucket_allows(trail, bucket, "cloudtrail.amazonaws.com", "s3:PutObject"):
                problems.append(f"{bucket}: its policy does not let CloudTrail write the trail {name}")
        if server.resources("AWS::CloudTrail::Trail"):
            problems.append(f"with S3ServerAccessLogs, a trail too: {sorted(server.resources('AWS::CloudTrail::Trail'))}")
    return problems


# --- the narrower writes of transaction records ------------------------------------------------------

TABLES_SOURCE = REPO / "functions" / "twopc" / "src" / "tables.rs"
ATTRIBUTES_CONDITION = "ForAllValues:StringNotEquals"
ATTRIBUTES_KEY = "dynamodb:Attributes"
# What each narrower writer writes to a record, from the code through the contract
# (`transactionRecordWrites`, printed from twopc::record): `attributes`, every top-level attribute a record
# can have (RECORD_ATTRIBUTES); `recovery`, what the sweeper writes (RECOVERY_WRITES: recovery's status
# changes, the postponement, the ABORTED record of an absent owner); `ownerAbort`, the abort of an expired
# owner (OWNER_ABORT_WRITES: to ABORTING, full or shortened; the sweeper's and the coordinator's, issue 42). Each list names
# the key, which every request names. The unit tests of twopc::record build every write of those writers
# and fail on an attribute their list does not name: DynamoDB Local enforces no IAM, so this is where a
# new attribute written by recovery meets the templates' conditions.
RECORD_WRITES = "transactionRecordWrites"
RECORD_WRITERS = {"attributes": "RECORD_ATTRIBUTES", "recovery": "RECOVERY_WRITES", "ownerAbort": "OWNER_ABORT_WRITES"}


def record_writes(code: dict) -> dict[str, set[str]]:
    """The contract's `transactionRecordWrites`: `attributes`, `recovery` and `ownerAbort`, each a set of
    attribute names (the writers' within `attributes`)."""
    writes = code.get(RECORD_WRITES)
    if not isinstance(writes, dict):
        raise AssertionError(f"the contract prints no {RECORD_WRITES} (twopc::record, functions/twopc/examples/contract.rs)")
    out = {}
    for key, constant in RECORD_WRITERS.items():
        names = writes.get(key)
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise AssertionError(f"the contract's {RECORD_WRITES}.{key} is not a list of names (twopc::record::{constant}): {names!r}")
        out[key] = set(names)
    for key in ("recovery", "ownerAbort"):
        if out[key] - out["attributes"]:
            raise AssertionError(f"the contract's {RECORD_WRITES}.{key} names {sorted(out[key] - out['attributes'])}, not attributes of a record")
    return out


def transaction_attributes(source: Path = TABLES_SOURCE) -> dict[str, str]:
    """`twopc::tables::tx_attr`: constant name -> attribute name."""
    match = re.search(r"pub mod tx_attr \{(.*?)\n\}", source.read_text(), re.S)
    assert match, f"no tx_attr in {source}"
    return dict(re.findall(r'pub const ([A-Z_]+): &str = "([^"]+)";', match.group(1)))


def _refused_attributes(statement: dict) -> tuple[set[str] | None, str | None]:
    """The attributes a statement's condition refuses, or why it is not such a condition."""
    condition = statement.get("Condition")
    if not isinstance(condition, dict) or list(condition) != [ATTRIBUTES_CONDITION]:
        return None, f"condition {condition!r}, not {ATTRIBUTES_CONDITION} on {ATTRIBUTES_KEY} alone"
    inner = condition[ATTRIBUTES_CONDITION]
    if not isinstance(inner, dict) or list(inner) != [ATTRIBUTES_KEY]:
        return None, f"condition {condition!r}, not on {ATTRIBUTES_KEY} alone"
    return {str(a) for a in as_list(inner[ATTRIBUTES_KEY])}, None


def _record_write_problems(stack: Stack, who: str, role: str, table_arn: str, actions: list[str],
                           refused: set[str], written: set[str]) -> list[str]:
    problems = []
    granted_actions = set()
    for statement in allow_statements(stack, role):
        wanted = [a for a in statement["Action"] if str(a) in actions]
        if not wanted or table_arn not in statement["Resource"]:
            continue
        granted_actions |= set(wanted)
        got, why = _refused_attributes(statement)
        where = f"{who} ({role}) statement {statement.get('Sid')} ({wanted})"
        if got is None:
            problems.append(f"{where}: {why}")
            continue
        if refused - got:
            problems.append(f"{where}: does not refuse {sorted(refused - got)}")
        if got & written:
            problems.append(f"{where}: refuses {sorted(got & written)}, which its code writes (the write would fail)")
    for action in sorted(set(actions) - granted_actions):
        problems.append(f"{who} ({role}): may not {action} on the transactions table (its code does)")
    return problems


def check_record_writes(stack: Stack) -> list[str]:
    """The sweeper's PutItem and UpdateItem on the transactions table carry a condition on
    dynamodb:Attributes (ForAllValues:StringNotEquals) refusing what its code never writes, and never an
    attribute its code writes: every attribute but those recovery writes (the coordinator's own:
    principal, requestHash, executionId, holdMs, holdUntil and the chain's), from the code (the contract's
    `transactionRecordWrites`). A participant may write no record but those of its own one-phase commits
    (`check_participants_cannot_decide`: GetItem, and PutItem under `1p~<service>~*` only)."""
    try:
        writes = record_writes(stack.code)
    except AssertionError as error:
        return [str(error)]
    problems = []
    ids = table_ids(stack)
    if "transactions" not in ids:
        return ["no transactions table"]
    table_arn = "${%s.Arn}" % ids["transactions"]
    sweeper_written = writes["recovery"]
    sweeper_refused = writes["attributes"] - sweeper_written
    for sweeper in functions_of(stack, "sweeper"):
        problems += _record_write_problems(stack, "sweeper", role_of(stack, sweeper), table_arn,
                                           ["dynamodb:PutItem", "dynamodb:UpdateItem"], sweeper_refused, sweeper_written)
    # Issue 42: a participant writes no record but its own one-phase commits' (its abort of an expired owner
    # is asked of the coordinator, or left to the sweeper).
    problems += check_participants_cannot_decide(stack)
    return problems


# --- who may invoke each function ------------------------------------------------------------------

# Who may invoke each function: its resource policy (AWS::Lambda::Permission) and the roles granted
# lambda:InvokeFunction on it. The participant binaries are told by the contract.
INVOKERS = {
    "coordinator": "API Gateway, for the methods of a REST API of the template (SourceArn on that API)",
    "participant": "the coordinator's and the sweeper's roles, on its live alias (and their grants)",
    "sweeper": "EventBridge, for the schedule rule that targets it (SourceArn that rule)",
    "stream-processor": "nobody: its event source mappings read the streams with its own role",
    OUTCOMES_BINARY: "nobody: its event source mapping reads the transactions table's stream with its own role",
    "connections": "API Gateway, for the WebSocket API that integrates it (SourceArn on that API)",
    AUTHORIZER_BINARY: "API Gateway, for the authorizers of the template's APIs (SourceArn …/authorizers/…)",
}
EXECUTE_API_SOURCE = re.compile(
    r"^arn:(?:\$\{AWS::Partition\}|aws):execute-api:\$\{AWS::Region\}:\$\{AWS::AccountId\}:\$\{(?P<api>[A-Za-z0-9]+)\}/(?P<rest>.+)$"
)
WEBSOCKET_API_VARIABLE = "WEBSOCKET_API_ID"


def _websocket_apis_of(stack: Stack, function: str) -> set[str]:
    """The WebSocket APIs whose integrations invoke the function."""
    out = set()
    for integration in stack.resources("AWS::ApiGatewayV2::Integration"):
        props = stack.props(integration)
        if "${%s.Arn}" % function in str(props.get("IntegrationUri")):
            api = ref_id(props.get("ApiId"))
            if api:
                out.add(api)
    return out


def _invoker_problems(stack: Stack) -> list[str]:
    problems: list[str] = []
    participants = {d["function"] for d in participant_deployments(stack).values()}
    callers = {"${%s.Arn}" % role_of(stack, f) for b in KEY_SIGNERS for f in functions_of(stack, b) if role_of(stack, f)}
    caller_roles = {role_of(stack, f) for b in KEY_SIGNERS for f in functions_of(stack, b)}
    rest_apis = set(stack.resources("AWS::ApiGateway::RestApi"))
    websocket_apis = {a for a in stack.resources("AWS::ApiGatewayV2::Api") if stack.props(a).get("ProtocolType") == "WEBSOCKET"}
    schedules = {
        "${%s.Arn}" % rule: {function_target(stack, t.get("Arn")) for t in as_list(stack.props(rule).get("Targets"))}
        for rule in stack.resources("AWS::Events::Rule")
    }
    invoked: dict[str, set[str]] = {}
    for permission in sorted(stack.resources("AWS::Lambda::Permission")):
        props = stack.props(permission)
        target = _permission_target(stack, props.get("FunctionName"))
        if target is None:
            problems.append(f"{permission}: names no function of the template ({props.get('FunctionName')!r})")
            continue
        binary = "participant" if target in participants else binary_of(stack, target)
        where = f"{permission} (on {target}, {binary})"
        principal, source = props.get("Principal"), props.get("SourceArn")
        if props.get("Action") != INVOKE:
            problems.append(f"{where}: action {props.get('Action')!r}, not {INVOKE}")
        if "FunctionUrlAuthType" in props:
            problems.append(f"{where}: a function URL")
        match = EXECUTE_API_SOURCE.match(str(source)) if source else None
        ok = False
        if binary == "coordinator":
            ok = principal == "apigateway.amazonaws.com" and bool(match) and match.group("api") in rest_apis \
                and not match.group("rest").startswith("authorizers/")
        elif binary == "participant":
            ok = principal in callers
        elif binary == "sweeper":
            ok = principal == "events.amazonaws.com" and target in schedules.get(str(source), set())
        elif binary == "connections":
            ok = principal == "apigateway.amazonaws.com" and bool(match) \
                and match.group("api") in websocket_apis & _websocket_apis_of(stack, target) \
                and not match.group("rest").startswith("authorizers/")
        elif binary == AUTHORIZER_BINARY:
            ok = principal == "apigateway.amazonaws.com" and bool(match) \
                and match.group("api") in rest_apis | websocket_apis and match.group("rest").startswith("authorizers/")
        if not ok:
            problems.append(
                f"{where}: allows {principal!r} (source {source!r}); only {INVOKERS.get(binary, 'nobody (no rule for this binary)')} may"
            )
        else:
            invoked.setdefault(target, set()).add(str(principal))
    for function in functions(stack):
        binary = "participant" if function in participants else binary_of(stack, function)
        if binary in STREAM_READERS:
            continue
        got = invoked.get(function, set())
        if binary == "participant":
            if got != callers:
                problems.append(f"{function} (participant): invokable by {sorted(got)}, not exactly the coordinator's and the sweeper's roles")
        elif not got:
            problems.append(f"{function} ({binary}): {INVOKERS.get(binary, 'nobody')} may not invoke it")
    # Identity grants: only the coordinator's and the sweeper's roles, only on participants.
    for role in stack.resources("AWS::IAM::Role"):
        for resource in granted(stack, role, INVOKE):
            target = _permission_target(stack, resource)
            if target is None:
                problems.append(f"{role}: may invoke {resource!r}, no function of the template by name")
            elif target not in participants or role not in caller_roles:
                problems.append(f"{role}: may invoke {target}; only the coordinator's and the sweeper's roles may invoke, and only participants")
    transactions_stream = "${%s.StreamArn}" % table_ids(stack).get("transactions")
    for mapping in stack.resources("AWS::Lambda::EventSourceMapping"):
        target = function_target(stack, stack.props(mapping).get("FunctionName"))
        binary = binary_of(stack, target) if target else None
        source = stack.props(mapping).get("EventSourceArn")
        if binary == OUTCOMES_BINARY and source == transactions_stream:
            continue
        if target is None or binary != "stream-processor":
            problems.append(
                f"{mapping}: an event source mapping into {target}, not the stream processor (nor the outcomes "
                "function on the transactions table's stream)"
            )
    for url in stack.resources("AWS::Lambda::Url"):
        problems.append(f"{url}: a function URL (anyone reaching it may invoke the function)")
    for function in functions_of(stack, "connections"):
        apis = _websocket_apis_of(stack, function)
        value = environment(stack, function).get(WEBSOCKET_API_VARIABLE)
        if len(apis) != 1 or value != "${%s}" % next(iter(apis)):
            problems.append(f"{function}: {WEBSOCKET_API_VARIABLE} is {value!r}, not the WebSocket API it serves {sorted(apis)}")
    return problems


def check_invokers(stack: Stack) -> list[str]:
    """Every function may be invoked only by its source (INVOKERS), with tokens off and on (the
    authorizer exists only then): each permission's principal and SourceArn, each role's
    lambda:InvokeFunction grants, the event source mappings, no function URL; and the connections
    function's WEBSOCKET_API_ID is the WebSocket API it serves."""
    problems = _invoker_problems(stack) + _invoker_problems(with_jwt(stack))
    return sorted(set(problems), key=problems.index)


# --- the WAF on the REST stage ---------------------------------------------------------------------

WAF_PARAMETER = "WafEnabled"
WAF_RATE_PARAMETER = "WafRateLimit"
WAF_RATE_DEFAULT = 2000
WAF_RATE_OTHER_VALUE = "1234"


def check_waf(stack: Stack) -> list[str]:
    """WafEnabled (default "false"): with it, a REGIONAL web ACL (default Allow) with a rate-based rule
    per client IP blocking above WafRateLimit (a Number, default 2000, evaluated with another value),
    associated with the REST API's stage and logging to an aws-waf-logs-* log group; without it none."""
    problems = _parameter(stack, WAF_PARAMETER, "false", ["true", "false"])
    problems += _parameter(stack, WAF_RATE_PARAMETER, WAF_RATE_DEFAULT)
    definition = stack.template.get("Parameters", {}).get(WAF_RATE_PARAMETER, {})
    if definition.get("Type") != "Number" or (number(definition.get("MinValue")) or 0) < 100:
        problems.append(f"parameter {WAF_RATE_PARAMETER}: not a Number of at least 100 ({definition!r})")
    off = stack.with_parameters(**{WAF_PARAMETER: "false"})
    for kind in ["AWS::WAFv2::WebACL", "AWS::WAFv2::WebACLAssociation"]:
        if off.resources(kind):
            problems.append(f"with {WAF_PARAMETER}=false: {sorted(off.resources(kind))}")
    on = stack.with_parameters(**{WAF_PARAMETER: "true", WAF_RATE_PARAMETER: WAF_RATE_OTHER_VALUE})
    acls = sorted(on.resources("AWS::WAFv2::WebACL"))
    if len(acls) != 1:
        return problems + [f"with {WAF_PARAMETER}=true: web ACLs {acls}, not one"]
    acl = acls[0]
    props = on.props(acl)
    if props.get("Scope") != "REGIONAL" or "Allow" not in (props.get("DefaultAction") or {}):
        problems.append(f"{acl}: not REGIONAL with a default Allow")
    rate_rules = [
        r for r in as_list(props.get("Rules"))
        if _same_number((r.get("Statement", {}).get("RateBasedStatement") or {}).get("Limit"), WAF_RATE_OTHER_VALUE)
        and (r.get("Statement", {}).get("RateBasedStatement") or {}).get("AggregateKeyType") == "IP"
        and "Block" in (r.get("Action") or {})
    ]
    if not rate_rules:
        problems.append(f"{acl}: no rule blocking a client IP above {WAF_RATE_PARAMETER} (evaluated with {WAF_RATE_OTHER_VALUE})")
    stages = {"${%s}" % s: ref_id(on.props(s).get("RestApiId")) for s in on.resources("AWS::ApiGateway::Stage")}
    associated = False
    for association in on.resources("AWS::WAFv2::WebACLAssociation"):
        ap = on.props(association)
        match = re.match(r"^arn:\$\{AWS::Partition\}:apigateway:\$\{AWS::Region\}::/restapis/\$\{([A-Za-z0-9]+)\}/stages/(.+)$", str(ap.get("ResourceArn")))
        if ap.get("WebACLArn") == "${%s.Arn}" % acl and match and stages.get(match.group(2)) == match.group(1):
            associated = True
    if not associated:
        problems.append(f"{acl}: not associated with the REST API's stage (by the stage's Ref)")
    logged = False
    for config in on.resources("AWS::WAFv2::LoggingConfiguration"):
        cp = on.props(config)
        if cp.get("ResourceArn") == "${%s.Arn}" % acl:
            for destination in as_list(cp.get("LogDestinationConfigs")):
                group = re.search(r":log-group:\$\{([A-Za-z0-9]+)\}$", str(destination))
                if group and on.kind(group.group(1)) == "AWS::Logs::LogGroup" and str(on.props(group.group(1)).get("LogGroupName", "")).startswith("aws-waf-logs-"):
                    logged = True
    if not logged:
        problems.append(f"{acl}: its requests are not logged to an aws-waf-logs-* log group of the template")
    return problems
