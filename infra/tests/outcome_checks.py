"""Checks of the outcome events (infra/DEPLOY.md, "Outcome events"), on a deployed template (SAM after
the transform, or CDK), found by meaning as in template_checks.py: the outcomes function reads the
transactions table's stream (its second reader, beside the stream processor) and sends one EventBridge
event per outcome to the stack's outcomes bus; the sweeper sends its "open too long" alerts there too.
Each check returns a list of problems (empty: fine).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cfn import REPO, Stack, as_list, att_id, number
from production_checks import ENVIRONMENT_SOURCE, _lambda, _notifies, _parameter, _same_number, alarms, rust_constants
from system import (
    allow_statements,
    environment,
    function_target,
    functions,
    functions_of,
    granted,
    log_group_of,
    role_of,
    table_ids,
)
from template_checks import OUTCOMES_BINARY

BUS_KIND = "AWS::Events::EventBus"
BUS_VARIABLE = "EVENT_BUS_NAME"
PUT_EVENTS = "events:PutEvents"
# The functions whose code sends outcome events (twopc_fanout::outcomes): the only ones that may.
EVENT_SENDERS = (OUTCOMES_BINARY, "sweeper")
# The sweeper's "Transaction Open Too Long" threshold (milliseconds): its parameter (whose default is
# the code's, twopc_fanout::outcomes::DEFAULT_OPEN_ALERT_AFTER_MS) and the floor (the sweeper runs once
# a minute: a shorter age is not seen sooner).
OPEN_ALERT_PARAMETER = "OpenAlertAfterMs"
OPEN_ALERT_VARIABLE = "OPEN_ALERT_AFTER_MS"
OPEN_ALERT_MIN_MS = 60000
# What the code says (functions/fanout/src/outcomes.rs, twopc_fanout::outcomes).
OUTCOMES_SOURCE = REPO / "functions" / "fanout" / "src" / "outcomes.rs"
OPEN_ALERT_OTHER_VALUE = "123456"
# DynamoDB Streams: no more than two processes should read one shard at a time.
MAX_READERS_PER_SHARD = 2
# Lambda's largest retry count for stream sources (a bounded count: never -1, "until the record ages out").
MAX_RETRY_ATTEMPTS = 10000
# The records' age limit: at least a minute (Lambda's floor), at most 22 h, two hours inside the
# stream's 24 h retention, so that what it gives up on can still be read from the stream.
RECORD_AGE_BOUNDS = (60, 79200)
# An on-failure message is alarmed within this long; a stalled reader within this long (threshold + window).
QUEUE_ALARM_WITHIN_SECONDS = 300
ITERATOR_AGE_ALARM_WITHIN_SECONDS = 600
# What the outcomes role may do, besides X-Ray's two actions when TracingMode is Active.
OUTCOMES_ROLE_ACTIONS = {
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "dynamodb:DescribeStream",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:ListStreams",
    "sqs:SendMessage",
    PUT_EVENTS,
}
STREAM_READS = ["dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"]


def outcomes_contract(source: Path = OUTCOMES_SOURCE, variables: Path = ENVIRONMENT_SOURCE) -> dict[str, Any]:
    """The outcome events' settings as the code declares them: the variables (twopc::environment's
    EVENT_BUS_NAME, OPEN_ALERT_AFTER_MS), the sweeper's default threshold and the events' source."""
    constants, names = rust_constants(source), rust_constants(variables)
    missing = [n for n in ["DEFAULT_OPEN_ALERT_AFTER_MS", "SOURCE"] if n not in constants]
    missing += [n for n in [BUS_VARIABLE, OPEN_ALERT_VARIABLE] if n not in names]
    if missing:
        raise AssertionError(f"no constant {missing} in {source} / {variables}")
    return {
        "busVariable": str(names[BUS_VARIABLE]),
        "openAlertVariable": str(names[OPEN_ALERT_VARIABLE]),
        "defaultOpenAlertAfterMs": int(constants["DEFAULT_OPEN_ALERT_AFTER_MS"]),
        "source": str(constants["SOURCE"]),
    }


def outcome_buses(stack: Stack) -> list[str]:
    return sorted(stack.resources(BUS_KIND))


def outcomes_functions(stack: Stack) -> list[str]:
    return functions_of(stack, OUTCOMES_BINARY)


def _transactions_stream(stack: Stack) -> str:
    return "${%s.StreamArn}" % table_ids(stack).get("transactions")


def mappings_into(stack: Stack, function: str) -> list[str]:
    return sorted(
        m
        for m in stack.resources("AWS::Lambda::EventSourceMapping")
        if function_target(stack, stack.props(m).get("FunctionName")) == function
    )


def _on_failure_queue(stack: Stack, mapping: str) -> str | None:
    destination = stack.props(mapping).get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
    queue = att_id(destination, "Arn")
    return queue if queue and stack.kind(queue) == "AWS::SQS::Queue" else None


def outcomes_queue(stack: Stack) -> str | None:
    """The on-failure queue of the outcomes function's mapping (when there is exactly one of each)."""
    functions_ = outcomes_functions(stack)
    if len(functions_) != 1:
        return None
    mappings = mappings_into(stack, functions_[0])
    return _on_failure_queue(stack, mappings[0]) if len(mappings) == 1 else None


# ----------------------------------------------------------------------------------------------
# The bus
# ----------------------------------------------------------------------------------------------


def check_outcome_bus(stack: Stack) -> list[str]:
    """One EventBridge bus, named after the stack (`<stack>-outcomes`: two stacks in one account never
    share one), operators only: no resource policy (no Policy property, no AWS::Events::EventBusPolicy,
    so no other account and no broad principal may put events on it or add rules to it), and no rule,
    archive or pipe of the template on it but the operators' outcome history (a rule whose targets are
    log groups of the template: check_outcome_history); outputs name it and its ARN."""
    problems = []
    buses = outcome_buses(stack)
    if len(buses) != 1:
        return [f"event buses {buses}, not one (the outcomes bus)"]
    (bus,) = buses
    props = stack.props(bus)
    if props.get("Name") != "${AWS::StackName}-outcomes":
        problems.append(f"{bus}: named {props.get('Name')!r}, not <stack>-outcomes")
    for key in ["Policy", "EventSourceName"]:
        if key in props:
            problems.append(f"{bus}: has {key} {props[key]!r} (operators only: no resource policy, no partner source)")
    for kind in ["AWS::Events::EventBusPolicy", "AWS::Events::Rule", "AWS::Events::Archive", "AWS::Pipes::Pipe"]:
        for resource in stack.resources(kind):
            on = stack.props(resource)
            names = [on.get("EventBusName"), on.get("SourceArn"), on.get("Target")]
            if not any(str(n) in ("${%s}" % bus, "${%s.Arn}" % bus, "${%s.Name}" % bus) for n in names):
                continue
            if kind == "AWS::Events::Rule" and _history_targets(stack, resource):
                continue
            problems.append(
                f"{resource} ({kind}) is on the outcomes bus: the stack adds no policy or consumer to it but the "
                "operators' outcome history (a rule into a log group of the template)"
            )
    if stack.resources("AWS::Events::EventBusPolicy"):
        problems.append(f"{sorted(stack.resources('AWS::Events::EventBusPolicy'))}: an event bus policy (the outcomes bus is operators only)")
    values = [stack.resolve(o.get("Value")) for o in stack.template.get("Outputs", {}).values()]
    for wanted, what in [("${%s}" % bus, "name"), ("${%s.Arn}" % bus, "ARN")]:
        if wanted not in values:
            problems.append(f"no output of the outcomes bus's {what} ({wanted})")
    return problems


def _log_group_of_target(stack: Stack, arn: Any) -> str | None:
    """The log group of the template an EventBridge target ARN names
    (`arn:<partition>:logs:<region>:<account>:log-group:${Group}`)."""
    match = re.match(r"^arn:\$\{AWS::Partition\}:logs:\$\{AWS::Region\}:\$\{AWS::AccountId\}:log-group:\$\{([A-Za-z0-9]+)\}$", str(arn))
    group = match.group(1) if match else None
    return group if group and stack.kind(group) == "AWS::Logs::LogGroup" else None


def _history_targets(stack: Stack, rule: str) -> list[str]:
    """The log groups of the template a rule's targets are, when every target is one (else [])."""
    targets = as_list(stack.props(rule).get("Targets"))
    groups = [_log_group_of_target(stack, t.get("Arn")) for t in targets]
    return groups if groups and all(groups) else []


def check_outcome_grants(stack: Stack) -> list[str]:
    """Only the outcomes function's and the sweeper's roles may put events, only `events:PutEvents`,
    on the outcomes bus's ARN and nothing else (no other bus, no "*"); both may. No role has any other
    EventBridge action. Checked with tracing on, so that conditional statements are seen."""
    traced = stack.with_parameters(TracingMode="Active") if "TracingMode" in stack.template.get("Parameters", {}) else stack
    problems = []
    buses = outcome_buses(traced)
    bus_arn = "${%s.Arn}" % buses[0] if len(buses) == 1 else None
    senders = {role_of(traced, f) for binary in EVENT_SENDERS for f in functions_of(traced, binary)}
    for role in sorted(traced.resources("AWS::IAM::Role")):
        for statement in allow_statements(traced, role):
            for action in (str(a) for a in statement["Action"]):
                if not action.lower().startswith("events:"):
                    continue
                if action != PUT_EVENTS:
                    problems.append(f"{role}: may {action} (only {PUT_EVENTS} is the code's)")
                    continue
                if role not in senders:
                    problems.append(f"{role}: may {PUT_EVENTS}; only the outcomes function's and the sweeper's roles may")
                for resource in statement["Resource"]:
                    if resource != bus_arn:
                        problems.append(f"{role}: may {PUT_EVENTS} on {resource!r}, not only the outcomes bus ({bus_arn})")
    for binary in EVENT_SENDERS:
        functions_ = functions_of(traced, binary)
        if not functions_:
            problems.append(f"no {binary} function")
        for function in functions_:
            if bus_arn not in granted(traced, role_of(traced, function), PUT_EVENTS):
                problems.append(f"{function} ({binary}): its role may not {PUT_EVENTS} on the outcomes bus")
    return problems


# The operators' outcome history: the rule on the bus, its log group, who reads it.
HISTORY_VARIABLE = "OUTCOME_LOG_GROUP"
HISTORY_DETAIL_TYPES = ["Transaction Committed", "Transaction Aborted"]
HISTORY_WRITERS = {"events.amazonaws.com", "delivery.logs.amazonaws.com"}
HISTORY_WRITES = {"logs:CreateLogStream", "logs:PutLogEvents"}
LOG_READS = ("logs:FilterLogEvents", "logs:GetLogEvents", "logs:StartQuery", "logs:StartLiveTail", "logs:GetLogRecord")


def check_outcome_history(stack: Stack) -> list[str]:
    """The operators' outcome history (GET /admin/outcomes): one enabled rule on the outcomes bus, for
    the terminal outcomes (source twopc, Transaction Committed and Aborted), whose one target is a log
    group of the template (no function's own, with a retention) taking the whole event (no input
    transformation: the coordinator parses it) and no role; that log group's resource policy lets
    EventBridge (events and delivery.logs, services only) create streams and put events there only, for
    that rule only (aws:SourceArn); the coordinator's OUTCOME_LOG_GROUP names it, its role may
    FilterLogEvents there and nowhere else, and no other role may read it."""
    problems = []
    buses = outcome_buses(stack)
    if len(buses) != 1:
        return [f"event buses {buses}, not one"]
    bus = buses[0]
    rules = [
        r for r in sorted(stack.resources("AWS::Events::Rule"))
        if str(stack.props(r).get("EventBusName")) in ("${%s}" % bus, "${%s.Arn}" % bus)
    ]
    if len(rules) != 1:
        return [f"rules on the outcomes bus {rules}, not one (the outcome history's)"]
    (rule,) = rules
    props = stack.props(rule)
    if props.get("State", "ENABLED") != "ENABLED":
        problems.append(f"{rule}: not ENABLED")
    pattern = props.get("EventPattern") or {}
    if isinstance(pattern, str):
        pattern = json.loads(pattern)
    if as_list(pattern.get("source")) != ["twopc"] or sorted(as_list(pattern.get("detail-type"))) != sorted(HISTORY_DETAIL_TYPES):
        problems.append(f"{rule}: pattern {pattern!r}, not source twopc and the terminal outcomes {HISTORY_DETAIL_TYPES}")
    targets = as_list(props.get("Targets"))
    groups = _history_targets(stack, rule)
    if len(targets) != 1 or len(groups) != 1:
        return problems + [f"{rule}: targets {targets!r}, not one log group of the template"]
    (group,) = groups
    target = targets[0]
    for key in ["Input", "InputPath", "InputTransformer", "RoleArn"]:
        if key in target:
            problems.append(f"{rule}: its target has {key} (the history keeps the whole event, written under the log group's policy)")
    if group in {log_group_of(stack, f) for f in functions(stack)}:
        problems.append(f"{rule}: writes to {group}, a function's own log group")
    if stack.props(group).get("RetentionInDays") is None:
        problems.append(f"{group}: no retention")
    # Who may write it: EventBridge, for this rule, under the log group's resource policy.
    allowed = False
    for policy in sorted(stack.resources("AWS::Logs::ResourcePolicy")):
        try:
            document = json.loads(str(stack.props(policy).get("PolicyDocument")))
        except json.JSONDecodeError as error:
            problems.append(f"{policy}: its PolicyDocument is not JSON ({error})")
            continue
        for statement in as_list(document.get("Statement")):
            if statement.get("Effect") != "Allow":
                continue
            principal = statement.get("Principal")
            services = set(as_list(principal.get("Service"))) if isinstance(principal, dict) and set(principal) == {"Service"} else None
            if services is None or not services <= HISTORY_WRITERS:
                problems.append(f"{policy}: allows {principal!r}, not only EventBridge ({sorted(HISTORY_WRITERS)})")
                continue
            actions, resources = set(as_list(statement.get("Action"))), as_list(statement.get("Resource"))
            source = (statement.get("Condition") or {}).get("ArnEquals", {}).get("aws:SourceArn")
            if not actions <= HISTORY_WRITES or resources != ["${%s.Arn}" % group] or source != "${%s.Arn}" % rule:
                problems.append(
                    f"{policy}: {sorted(actions)} on {resources} for {source!r}: EventBridge may only "
                    f"{sorted(HISTORY_WRITES)} on {group} for {rule}"
                )
                continue
            allowed = allowed or actions == HISTORY_WRITES
    if not allowed:
        problems.append(f"no log group resource policy lets EventBridge write {group} for {rule} ({sorted(HISTORY_WRITES)})")
    # Who reads it: the coordinator, for the operators' API.
    coordinators = functions_of(stack, "coordinator")
    if not coordinators:
        problems.append("no coordinator")
    for coordinator in coordinators:
        if environment(stack, coordinator).get(HISTORY_VARIABLE) != "${%s}" % group:
            problems.append(f"{coordinator}: {HISTORY_VARIABLE} is {environment(stack, coordinator).get(HISTORY_VARIABLE)!r}, not {group}'s name")
        reads = set(granted(stack, role_of(stack, coordinator), "logs:FilterLogEvents"))
        if reads != {"${%s.Arn}" % group}:
            problems.append(f"{coordinator}: logs:FilterLogEvents on {sorted(reads)}, not exactly {group}")
    readers = {role_of(stack, c) for c in coordinators}
    for role in sorted(stack.resources("AWS::IAM::Role")):
        for action in LOG_READS:
            for resource in granted(stack, role, action):
                if role not in readers or action != "logs:FilterLogEvents":
                    problems.append(f"{role}: may {action} on {resource} (only the coordinator reads the outcome history)")
    return problems


# ----------------------------------------------------------------------------------------------
# The outcomes function and its event source
# ----------------------------------------------------------------------------------------------


def check_outcomes_function(stack: Stack) -> list[str]:
    """One outcomes function whose EVENT_BUS_NAME is the outcomes bus's name (`Ref`), as the sweeper's;
    the stream processor's timeout and memory (the same batches of the same stream); its role on its
    own log group, the transactions table's stream (reads and ListStreams), its own on-failure queue
    (SendMessage) and the outcomes bus (PutEvents), and nothing else."""
    problems = []
    functions_ = outcomes_functions(stack)
    if len(functions_) != 1:
        return [f"outcomes functions {functions_}, not one"]
    (function,) = functions_
    buses = outcome_buses(stack)
    bus = "${%s}" % buses[0] if len(buses) == 1 else None
    for f in functions_ + functions_of(stack, "sweeper"):
        if environment(stack, f).get(BUS_VARIABLE) != bus:
            problems.append(f"{f}: {BUS_VARIABLE} is {environment(stack, f).get(BUS_VARIABLE)!r}, not the outcomes bus's name ({bus})")
    processors = functions_of(stack, "stream-processor")
    if processors:
        mine, theirs = stack.props(function), stack.props(processors[0])
        for key, default in [("Timeout", 3), ("MemorySize", 128)]:
            if not _same_number(mine.get(key, default), theirs.get(key, default)):
                problems.append(f"{function}: {key} {mine.get(key, default)!r}, not the stream processor's {theirs.get(key, default)!r}")
    plain = stack.with_parameters(TracingMode="PassThrough") if "TracingMode" in stack.template.get("Parameters", {}) else stack
    role = role_of(plain, function)
    actions = {str(a) for s in allow_statements(plain, role) for a in s["Action"]}
    for action in sorted(actions - OUTCOMES_ROLE_ACTIONS):
        problems.append(f"{function}: its role may {action} (the outcomes function needs only {sorted(OUTCOMES_ROLE_ACTIONS)})")
    for action in sorted(OUTCOMES_ROLE_ACTIONS - actions):
        problems.append(f"{function}: its role may not {action}")
    stream = _transactions_stream(plain)
    for action in STREAM_READS:
        resources = set(granted(plain, role, action))
        if resources and resources != {stream}:
            problems.append(f"{function}: {action} on {sorted(resources)}, not the transactions table's stream alone")
    queue = outcomes_queue(plain)
    sends = set(granted(plain, role, "sqs:SendMessage"))
    if queue is None or sends != {"${%s.Arn}" % queue}:
        problems.append(f"{function}: sqs:SendMessage on {sorted(sends)}, not exactly its mapping's on-failure queue ({queue})")
    return problems


def check_outcomes_mapping(stack: Stack) -> list[str]:
    """One event source mapping into the outcomes function, on the transactions table's stream: from
    LATEST (an upgrade sends no outcome decided before it), partial batch failures reported, the batch
    bisected on an error, retries bounded (a count, at most 10000, never -1) and records no older than
    22 h (two hours inside the stream's retention), then its own encrypted SQS on-failure queue (no
    other mapping's, no other role's: only the outcomes role may send there); the batch size and window
    of the stream processor's mapping of the same stream; and no more than two readers (mappings) on
    that stream, DynamoDB Streams' recommended limit per shard."""
    problems = []
    functions_ = outcomes_functions(stack)
    if len(functions_) != 1:
        return [f"outcomes functions {functions_}, not one"]
    (function,) = functions_
    mappings = mappings_into(stack, function)
    if len(mappings) != 1:
        return [f"{function}: event source mappings {mappings}, not one"]
    (mapping,) = mappings
    props = stack.props(mapping)
    stream = _transactions_stream(stack)
    if props.get("EventSourceArn") != stream:
        problems.append(f"{mapping}: reads {props.get('EventSourceArn')!r}, not the transactions table's stream ({stream})")
    if props.get("StartingPosition") != "LATEST":
        problems.append(f"{mapping}: StartingPosition {props.get('StartingPosition')!r}, not LATEST (an upgrade would send the last 24 h again)")
    if "ReportBatchItemFailures" not in as_list(props.get("FunctionResponseTypes")):
        problems.append(f"{mapping}: no ReportBatchItemFailures")
    if str(props.get("BisectBatchOnFunctionError")).lower() != "true":
        problems.append(f"{mapping}: BisectBatchOnFunctionError is not true")
    if str(props.get("Enabled", True)).lower() != "true":
        problems.append(f"{mapping}: not enabled")
    retries = number(props.get("MaximumRetryAttempts"))
    if retries is None or not 0 <= retries <= MAX_RETRY_ATTEMPTS or retries != int(retries):
        problems.append(f"{mapping}: MaximumRetryAttempts {props.get('MaximumRetryAttempts')!r}, not a bounded count (0..{MAX_RETRY_ATTEMPTS})")
    age = number(props.get("MaximumRecordAgeInSeconds"))
    low, high = RECORD_AGE_BOUNDS
    if age is None or not low <= age <= high:
        problems.append(f"{mapping}: MaximumRecordAgeInSeconds {props.get('MaximumRecordAgeInSeconds')!r}, not within {low}..{high}")
    queue = _on_failure_queue(stack, mapping)
    if queue is None:
        problems.append(f"{mapping}: no SQS on-failure destination")
    else:
        queue_props = stack.props(queue)
        if str(queue_props.get("SqsManagedSseEnabled")).lower() != "true" and "KmsMasterKeyId" not in queue_props:
            problems.append(f"{mapping}: its on-failure queue {queue} is not encrypted")
        others = [m for m in stack.resources("AWS::Lambda::EventSourceMapping") if m != mapping and _on_failure_queue(stack, m) == queue]
        if others:
            problems.append(f"{mapping}: its on-failure queue {queue} is also {others}'s (the outcomes queue is its own)")
        arn = "${%s.Arn}" % queue
        own = role_of(stack, function)
        for role in sorted(stack.resources("AWS::IAM::Role")):
            if role == own:
                continue
            reached = sorted({
                str(a)
                for s in allow_statements(stack, role)
                for a in s["Action"]
                if arn in s["Resource"] or ("*" in s["Resource"] and str(a).lower().startswith("sqs:"))
            })
            if reached:
                problems.append(f"{role}: may {reached} on the outcomes on-failure queue {queue}")
    processor_mappings = [
        m
        for binary_function in functions_of(stack, "stream-processor")
        for m in mappings_into(stack, binary_function)
        if stack.props(m).get("EventSourceArn") == stream
    ]
    if len(processor_mappings) != 1:
        problems.append(f"the stream processor's mappings of the transactions stream are {processor_mappings}, not one")
    else:
        theirs = stack.props(processor_mappings[0])
        for key in ["BatchSize", "MaximumBatchingWindowInSeconds"]:
            if not (props.get(key) == theirs.get(key) or _same_number(props.get(key), theirs.get(key))):
                problems.append(f"{mapping}: {key} {props.get(key)!r}, not the stream processor's {theirs.get(key)!r}")
    readers = [m for m in stack.resources("AWS::Lambda::EventSourceMapping") if stack.props(m).get("EventSourceArn") == stream]
    if len(readers) > MAX_READERS_PER_SHARD:
        problems.append(
            f"the transactions table's stream has {len(readers)} readers {sorted(readers)}: DynamoDB Streams recommends "
            f"at most {MAX_READERS_PER_SHARD} per shard"
        )
    return problems


def check_outcomes_alarms(stack: Stack) -> list[str]:
    """The outcomes function's alarms, each notifying AlarmActionArn (the stack's own topic when empty):
    its on-failure queue holding a message (ApproximateNumberOfMessagesVisible, Maximum > 0 within 5
    minutes), its Errors and Throttles (Sum > 0 over 5 minutes), its IteratorAge (Maximum, firing within
    10 minutes of the function stalling: threshold plus window); and a description on the queue's alarm
    that says what it means and where the runbook is ("Outcome events")."""
    problems = []
    functions_ = outcomes_functions(stack)
    if len(functions_) != 1:
        return [f"outcomes functions {functions_}, not one"]
    (function,) = functions_
    found = alarms(stack)
    queue = outcomes_queue(stack)
    wanted = []
    if queue is None:
        problems.append(f"{function}: no on-failure queue")
    else:
        wanted.append((
            f"the messages of the outcomes on-failure queue {queue}",
            lambda a: a.on("AWS/SQS", "ApproximateNumberOfMessagesVisible", QueueName="${%s.QueueName}" % queue),
            lambda a: a.above(0) and all(m.stat == "Maximum" for m in a.metrics) and a.window is not None
            and a.window <= QUEUE_ALARM_WITHIN_SECONDS,
        ))
    for metric in ["Errors", "Throttles"]:
        wanted.append((
            f"the {metric} of {function}",
            _lambda(stack, function, metric),
            lambda a: a.above(0) and all(m.stat == "Sum" for m in a.metrics) and a.window == 300,
        ))
    wanted.append((
        f"the IteratorAge of {function}",
        _lambda(stack, function, "IteratorAge"),
        lambda a: a.comparison.startswith("GreaterThan") and a.threshold is not None and a.window is not None
        and all(m.stat == "Maximum" for m in a.metrics) and a.threshold / 1000 + a.window <= ITERATOR_AGE_ALARM_WITHIN_SECONDS,
    ))
    for what, matches, fires in wanted:
        firing = [a for a in found if matches(a) and fires(a)]
        if not firing:
            problems.append(f"no alarm on {what} that fires as it should (found {[a.logical_id for a in found if matches(a)]})")
        for alarm in firing:
            problems += _notifies(stack, alarm.logical_id)
            if alarm.missing != "notBreaching":
                problems.append(f"{alarm.logical_id}: TreatMissingData {alarm.missing!r}, not notBreaching")
    if queue is not None:
        for alarm in found:
            if alarm.on("AWS/SQS", "ApproximateNumberOfMessagesVisible", QueueName="${%s.QueueName}" % queue):
                text = " ".join(str(alarm.props.get("AlarmDescription", "")).split())
                for words in ["outcome", "Outcome events", "two hours"]:
                    if words.lower() not in text.lower():
                        problems.append(f"{alarm.logical_id}: its description does not say {words!r}")
    return problems


# ----------------------------------------------------------------------------------------------
# The sweeper's "open too long" alerts
# ----------------------------------------------------------------------------------------------


def check_open_alert(stack: Stack) -> list[str]:
    """OpenAlertAfterMs (a Number whose default is the code's, DEFAULT_OPEN_ALERT_AFTER_MS, 900000; at
    least 60000) is the sweeper's OPEN_ALERT_AFTER_MS (evaluated with another value too, so a hard-coded
    default does not pass), and no other function's."""
    default = outcomes_contract()["defaultOpenAlertAfterMs"]
    problems = _parameter(stack, OPEN_ALERT_PARAMETER, default)
    definition = stack.template.get("Parameters", {}).get(OPEN_ALERT_PARAMETER, {})
    if definition.get("Type") != "Number" or (number(definition.get("MinValue")) or 0) < OPEN_ALERT_MIN_MS:
        problems.append(f"parameter {OPEN_ALERT_PARAMETER}: not a Number of at least {OPEN_ALERT_MIN_MS} ({definition!r})")
    sweepers = functions_of(stack, "sweeper")
    if not sweepers:
        problems.append("no sweeper")
    for value in [str(default), OPEN_ALERT_OTHER_VALUE]:
        evaluated = stack.with_parameters(**{OPEN_ALERT_PARAMETER: value})
        for function in functions(evaluated):
            got = environment(evaluated, function).get(OPEN_ALERT_VARIABLE)
            if function in sweepers and not _same_number(got, value):
                problems.append(f"{function} (sweeper): {OPEN_ALERT_VARIABLE} is {got!r} with {OPEN_ALERT_PARAMETER}={value}")
            if function not in sweepers and got is not None:
                problems.append(f"{function}: sets {OPEN_ALERT_VARIABLE} (only the sweeper alerts)")
    return problems


CHECKS = {
    "bus": check_outcome_bus,
    "grants": check_outcome_grants,
    "history": check_outcome_history,
    "function": check_outcomes_function,
    "mapping": check_outcomes_mapping,
    "alarms": check_outcomes_alarms,
    "open-alert": check_open_alert,
}

# Resources of the outcome events by the logical ids both templates give them (the CDK app keeps the
# SAM template's): their resolved properties must be the same in both.
SAME_IN_BOTH = [
    "OutcomesEventBus",
    "OutcomesFailureQueue",
    "OutcomesLogGroup",
    "OutcomesRole",
    "OutcomesFunctionTransactionsStream",
    "OutcomesFailuresAlarm",
    "OutcomesErrorsAlarm",
    "OutcomesThrottlesAlarm",
    "OutcomesIteratorAgeAlarm",
    "OutcomeHistoryLogGroup",
    "OutcomeHistoryRule",
]
# Compared as the JSON they hold (the SAM template writes the document with Fn::Sub, CDK with Fn::Join).
SAME_POLICY_IN_BOTH = "OutcomeHistoryLogPolicy"
SAME_FUNCTION_PROPERTIES = ["Description", "Timeout", "MemorySize", "Environment", "Role", "LoggingConfig", "Architectures", "Runtime", "Handler"]
OUTPUTS = ["OutcomesEventBusName", "OutcomesEventBusArn", "OutcomesFailureQueueUrl", "OutcomesFunctionName", "OutcomeHistoryLogGroupName"]
