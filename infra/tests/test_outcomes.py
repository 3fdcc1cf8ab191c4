"""5. The outcome events (infra/DEPLOY.md, "Outcome events"), on both deployed templates: the outcomes
bus (named after the stack, operators only: no resource policy, no rule or consumer of the stack's, its
name and ARN as outputs); PutEvents only by the outcomes function's and the sweeper's roles, only on the
bus's ARN; the outcomes function (EVENT_BUS_NAME the bus's name, as the sweeper's; the stream
processor's timeout and memory; a role on its own log group, the transactions table's stream, its own
on-failure queue and the bus, nothing else); its event source mapping on the transactions table's
stream from LATEST, with partial batch failures, bisection, bounded retries and record age and an
encrypted SQS on-failure queue of its own, batched as the stream processor's mapping of that stream,
the stream's readers no more than two; its alarms (the on-failure queue's messages, errors, throttles,
iterator age) notifying AlarmActionArn; the sweeper's OPEN_ALERT_AFTER_MS from OpenAlertAfterMs. Each
check is shown to fail on broken copies of both templates, and the two templates to define the outcome
resources alike."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

import breaking as b
from cfn import REPO, as_list
from outcome_checks import (
    CHECKS,
    OPEN_ALERT_PARAMETER,
    OUTPUTS,
    SAME_FUNCTION_PROPERTIES,
    SAME_IN_BOTH,
    SAME_POLICY_IN_BOTH,
    outcomes_contract,
    outcomes_queue,
)
from production_checks import alarms, check_invokers
from system import environment, functions_of, role_of
from template_checks import check_event_sources, check_grants_match_code, check_named_resources


@pytest.mark.parametrize("check", CHECKS)
def test_outcome_events(stack, check):
    assert CHECKS[check](stack) == []


def test_the_outcome_settings_are_read_from_the_code():
    # twopc_fanout::outcomes and twopc::environment: the names the templates set, the sweeper's default.
    assert outcomes_contract() == {
        "busVariable": "EVENT_BUS_NAME",
        "openAlertVariable": "OPEN_ALERT_AFTER_MS",
        "defaultOpenAlertAfterMs": 900000,
        "source": "twopc",
    }


# --- the two templates define the outcome events alike ---------------------------------------------


def test_the_outcome_resources_are_the_same_in_both_templates(sam, cdk):
    for logical_id in SAME_IN_BOTH:
        assert logical_id in sam.template["Resources"] and logical_id in cdk.template["Resources"], logical_id
        assert sam.template["Resources"][logical_id]["Type"] == cdk.template["Resources"][logical_id]["Type"], logical_id
        assert sam.props(logical_id) == cdk.props(logical_id), logical_id
    # The outcome history's log group policy: the same document (SAM writes it with Fn::Sub, CDK with
    # Fn::Join), under the same name.
    sam_policy, cdk_policy = sam.props(SAME_POLICY_IN_BOTH), cdk.props(SAME_POLICY_IN_BOTH)
    assert sam_policy["PolicyName"] == cdk_policy["PolicyName"]
    assert json.loads(sam_policy["PolicyDocument"]) == json.loads(cdk_policy["PolicyDocument"])
    for template in (sam, cdk):
        assert functions_of(template, "outcomes") == ["OutcomesFunction"], template.name
    assert environment(sam, "CoordinatorFunction")["OUTCOME_LOG_GROUP"] == environment(cdk, "CoordinatorFunction")["OUTCOME_LOG_GROUP"]
    for key in SAME_FUNCTION_PROPERTIES:
        assert sam.props("OutcomesFunction").get(key) == cdk.props("OutcomesFunction").get(key), key
    # With tracing on too (the X-Ray statement of the role, the function's tracing).
    traced_sam, traced_cdk = sam.with_parameters(TracingMode="Active"), cdk.with_parameters(TracingMode="Active")
    assert traced_sam.props("OutcomesRole") == traced_cdk.props("OutcomesRole")
    assert traced_sam.props("OutcomesFunction").get("TracingConfig") == traced_cdk.props("OutcomesFunction").get("TracingConfig")


def test_the_outcome_parameter_and_outputs_are_the_same_in_both_templates(sam, cdk):
    assert sam.template["Parameters"][OPEN_ALERT_PARAMETER] == cdk.template["Parameters"][OPEN_ALERT_PARAMETER]
    for name in OUTPUTS:
        assert name in sam.template["Outputs"] and name in cdk.template["Outputs"], name
        assert sam.template["Outputs"][name]["Description"] == cdk.template["Outputs"][name]["Description"], name
        assert sam.resolve(sam.template["Outputs"][name]["Value"]) == cdk.resolve(cdk.template["Outputs"][name]["Value"]), name


def test_the_sweeper_gets_the_same_outcome_settings_in_both_templates(sam, cdk):
    sweepers = {t.name: functions_of(t, "sweeper") for t in (sam, cdk)}
    assert sweepers == {"sam": ["SweeperFunction"], "cdk": ["SweeperFunction"]}
    for variable in ["EVENT_BUS_NAME", "OPEN_ALERT_AFTER_MS"]:
        assert environment(sam, "SweeperFunction")[variable] == environment(cdk, "SweeperFunction")[variable], variable
    statements = {
        t.name: [s for policy in t.props(role_of(t, "SweeperFunction"))["Policies"] for s in policy["PolicyDocument"]["Statement"]
                 if "events:PutEvents" in as_list(s.get("Action"))]
        for t in (sam, cdk)
    }
    assert statements["sam"] == statements["cdk"] and len(statements["sam"]) == 1


# --- the checks can fail: broken copies of each template -------------------------------------------


def _bus(stack) -> str:
    return b.only(stack, "AWS::Events::EventBus")


def _outcomes_mapping(stack) -> dict:
    return b.props(stack, b.mapping_of(stack, "transactions", "outcomes"))


def _stream_processor_queue(stack):
    """The raw destination (the queue's ARN) of the stream processor's mapping of the transactions stream."""
    return copy.deepcopy(b.props(stack, b.mapping_of(stack, "transactions"))["DestinationConfig"]["OnFailure"]["Destination"])


def _history_rule(stack) -> str:
    bus = _bus(stack)
    return next(r for r in sorted(stack.resources("AWS::Events::Rule")) if stack.props(r).get("EventBusName") == "${%s}" % bus)


def _history_group(stack) -> str:
    return next(g for g in stack.resources("AWS::Logs::LogGroup") if "/aws/events/" in str(stack.props(g).get("LogGroupName")))


def _history_policy(stack) -> str:
    return b.only(stack, "AWS::Logs::ResourcePolicy")


def _edit_history_policy(stack, edit) -> None:
    """Rewrites the history's log group policy (as the resolved JSON, edited)."""
    policy = _history_policy(stack)
    document = json.loads(stack.props(policy)["PolicyDocument"])
    edit(document["Statement"][0])
    b.props(stack, policy)["PolicyDocument"] = json.dumps(document)


def _alarm_ids(stack, predicate) -> list[str]:
    return [a.logical_id for a in alarms(stack) if predicate(a)]


def _outcomes_alarms(stack, metric: str) -> list[str]:
    function = b.function(stack, "outcomes")
    return _alarm_ids(
        stack, lambda a: any(m.name == metric and m.dimensions.get("FunctionName") == "${%s}" % function for m in a.metrics)
    )


def _queue_alarms(stack) -> list[str]:
    queue = outcomes_queue(stack)
    return _alarm_ids(stack, lambda a: a.on("AWS/SQS", "ApproximateNumberOfMessagesVisible", QueueName="${%s.QueueName}" % queue))


def _drop_statements(stack, binary: str, action: str) -> None:
    for statements in b.raw_statements(stack, role_of(stack, b.function(stack, binary))):
        statements[:] = [s for s in statements if not (isinstance(s, dict) and action in as_list(s.get("Action")))]


def _add_statement(stack, binary: str, statement: dict) -> None:
    b.raw_statements(stack, role_of(stack, b.function(stack, binary)))[0].append(statement)


BREAKAGES = {
    # the bus
    "bus-resource-policy": ("bus", lambda s: b.props(s, _bus(s)).update(Policy={
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "events:PutEvents", "Resource": "*"}],
    })),
    "bus-policy-for-another-account": ("bus", lambda s: s.template["Resources"].update(OtherAccountPolicy={
        "Type": "AWS::Events::EventBusPolicy",
        "Properties": {"EventBusName": b.ref(_bus(s)), "StatementId": "other", "Action": "events:PutEvents", "Principal": "111122223333"},
    })),
    "bus-named-without-the-stack": ("bus", lambda s: b.props(s, _bus(s)).update(Name="outcomes")),
    "no-bus": ("bus", lambda s: s.template["Resources"].pop(_bus(s))),
    "a-rule-of-the-stack-on-the-bus": ("bus", lambda s: s.template["Resources"].update(EverythingRule={
        "Type": "AWS::Events::Rule",
        "Properties": {
            "EventBusName": b.ref(_bus(s)),
            "EventPattern": {"source": ["twopc"]},
            "Targets": [{"Id": "x", "Arn": "arn:aws:sqs:us-east-1:111122223333:elsewhere"}],
        },
    })),
    "no-arn-output": ("bus", lambda s: [
        s.template["Outputs"].pop(name)
        for name in [n for n, o in s.template["Outputs"].items() if s.resolve(o.get("Value")) == "${%s.Arn}" % _bus(s)]
    ]),
    # the outcome history (GET /admin/outcomes)
    "history-into-another-accounts-log-group": ("history", lambda s: b.props(s, _history_rule(s))["Targets"][0].update(
        Arn="arn:aws:logs:us-east-1:111122223333:log-group:elsewhere"
    )),
    "history-into-a-functions-log-group": ("history", lambda s: b.props(s, _history_rule(s))["Targets"][0].update(
        Arn={"Fn::Sub": "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:${%s}" % (
            b.props(s, b.function(s, "coordinator"))["LoggingConfig"]["LogGroup"]["Ref"])}
    )),
    "history-transformed": ("history", lambda s: b.props(s, _history_rule(s))["Targets"][0].update(InputPath="$.detail")),
    "history-of-every-event": ("history", lambda s: b.props(s, _history_rule(s))["EventPattern"].pop("detail-type")),
    "history-disabled": ("history", lambda s: b.props(s, _history_rule(s)).update(State="DISABLED")),
    "history-kept-forever": ("history", lambda s: b.props(s, _history_group(s)).pop("RetentionInDays")),
    "history-policy-for-everyone": ("history", lambda s: _edit_history_policy(s, lambda st: st.update(Principal="*"))),
    "history-policy-for-any-rule": ("history", lambda s: _edit_history_policy(s, lambda st: st.pop("Condition"))),
    "history-policy-on-every-log-group": ("history", lambda s: _edit_history_policy(
        s, lambda st: st.update(Resource="arn:aws:logs:us-east-1:123456789012:log-group:*")
    )),
    "history-policy-missing": ("history", lambda s: s.template["Resources"].pop(_history_policy(s))),
    "history-not-the-coordinators": ("history", lambda s: b.variables(s, "coordinator").update(OUTCOME_LOG_GROUP="elsewhere")),
    "history-read-by-the-sweeper": ("history", lambda s: _add_statement(s, "sweeper", {
        "Effect": "Allow", "Action": "logs:FilterLogEvents", "Resource": b.getatt(_history_group(s), "Arn"),
    })),
    "history-unreadable-by-the-coordinator": ("history", lambda s: _drop_statements(s, "coordinator", "logs:FilterLogEvents")),
    "a-second-rule-on-the-bus": ("history", lambda s: s.template["Resources"].update(
        SecondHistory=copy.deepcopy(b.resource(s, _history_rule(s)))
    )),
    # who may put events
    "put-events-on-every-bus": ("grants", lambda s: b.statement(s, "outcomes", "events:PutEvents").update(Resource="*")),
    "put-events-on-the-default-bus": ("grants", lambda s: b.statement(s, "sweeper", "events:PutEvents").update(
        Resource=["arn:aws:events:us-east-1:123456789012:event-bus/default"]
    )),
    "the-coordinator-may-put-events": ("grants", lambda s: _add_statement(s, "coordinator", {
        "Effect": "Allow", "Action": "events:PutEvents", "Resource": b.getatt(_bus(s), "Arn"),
    })),
    "the-sweeper-may-not-put-events": ("grants", lambda s: _drop_statements(s, "sweeper", "events:PutEvents")),
    "another-eventbridge-action": ("grants", lambda s: b.statement(s, "outcomes", "events:PutEvents").update(
        Action=["events:PutEvents", "events:PutRule"]
    )),
    # the function
    "bus-variable-names-the-default-bus": ("function", lambda s: b.variables(s, "outcomes").update(EVENT_BUS_NAME="default")),
    "sweeper-bus-variable-names-the-default-bus": ("function", lambda s: b.variables(s, "sweeper").update(EVENT_BUS_NAME="default")),
    "shorter-timeout-than-the-stream-processor": ("function", lambda s: b.props(s, b.function(s, "outcomes")).update(Timeout=10)),
    "reads-a-table": ("function", lambda s: _add_statement(s, "outcomes", {
        "Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": b.getatt(b.table(s, "transactions"), "Arn"),
    })),
    "reads-another-stream": ("function", lambda s: b.statement(s, "outcomes", "dynamodb:GetRecords")["Resource"].append(
        b.getatt(b.table(s, "service-a-data"), "StreamArn")
    )),
    "sends-to-the-stream-processors-queue": ("function", lambda s: b.statement(s, "outcomes", "sqs:SendMessage")["Resource"].append(
        _stream_processor_queue(s)
    )),
    # the event source mapping
    "from-trim-horizon": ("mapping", lambda s: _outcomes_mapping(s).update(StartingPosition="TRIM_HORIZON")),
    "no-partial-failures": ("mapping", lambda s: _outcomes_mapping(s).update(FunctionResponseTypes=[])),
    "no-bisect": ("mapping", lambda s: _outcomes_mapping(s).pop("BisectBatchOnFunctionError")),
    "retries-until-the-record-ages-out": ("mapping", lambda s: _outcomes_mapping(s).update(MaximumRetryAttempts=-1)),
    "records-older-than-the-stream-keeps-for-a-replay": ("mapping", lambda s: _outcomes_mapping(s).update(MaximumRecordAgeInSeconds=86400)),
    "no-record-age-limit": ("mapping", lambda s: _outcomes_mapping(s).pop("MaximumRecordAgeInSeconds")),
    "no-on-failure-destination": ("mapping", lambda s: _outcomes_mapping(s).pop("DestinationConfig")),
    "the-stream-processors-queue": ("mapping", lambda s: _outcomes_mapping(s).update(DestinationConfig={
        "OnFailure": {"Destination": _stream_processor_queue(s)}
    })),
    "unencrypted-queue": ("mapping", lambda s: [b.props(s, outcomes_queue(s)).pop(k, None) for k in ["KmsMasterKeyId", "SqsManagedSseEnabled"]]),
    "another-stream": ("mapping", lambda s: _outcomes_mapping(s).update(EventSourceArn=b.getatt(b.table(s, "service-a-data"), "StreamArn"))),
    "another-batch-size": ("mapping", lambda s: _outcomes_mapping(s).update(BatchSize=10)),
    "disabled": ("mapping", lambda s: _outcomes_mapping(s).update(Enabled=False)),
    "a-third-reader": ("mapping", lambda s: s.template["Resources"].update(
        ThirdReader=copy.deepcopy(b.resource(s, b.mapping_of(s, "transactions")))
    )),
    "another-role-reads-the-queue": ("mapping", lambda s: _add_statement(s, "sweeper", {
        "Effect": "Allow", "Action": "sqs:ReceiveMessage", "Resource": b.getatt(outcomes_queue(s), "Arn"),
    })),
    # the alarms
    "no-queue-alarm": ("alarms", lambda s: [s.template["Resources"].pop(a) for a in _queue_alarms(s)]),
    "no-errors-alarm": ("alarms", lambda s: [s.template["Resources"].pop(a) for a in _outcomes_alarms(s, "Errors")]),
    "no-throttles-alarm": ("alarms", lambda s: [s.template["Resources"].pop(a) for a in _outcomes_alarms(s, "Throttles")]),
    "no-iterator-age-alarm": ("alarms", lambda s: [s.template["Resources"].pop(a) for a in _outcomes_alarms(s, "IteratorAge")]),
    "iterator-age-alarm-at-ten-minutes": ("alarms", lambda s: [
        b.props(s, a).update(Threshold=600000) for a in _outcomes_alarms(s, "IteratorAge")
    ]),
    "queue-alarm-notifies-nobody": ("alarms", lambda s: [b.props(s, a).update(AlarmActions=[]) for a in _queue_alarms(s)]),
    "queue-alarm-without-its-runbook": ("alarms", lambda s: [
        b.props(s, a).update(AlarmDescription="Messages in a queue.") for a in _queue_alarms(s)
    ]),
    # the sweeper's alerts
    "open-alert-hard-coded": ("open-alert", lambda s: b.variables(s, "sweeper").update(OPEN_ALERT_AFTER_MS="900000")),
    "open-alert-default": ("open-alert", lambda s: s.template["Parameters"][OPEN_ALERT_PARAMETER].update(Default=60000)),
    "open-alert-below-a-sweep": ("open-alert", lambda s: s.template["Parameters"][OPEN_ALERT_PARAMETER].update(MinValue=1000)),
    "open-alert-on-the-outcomes-function": ("open-alert", lambda s: b.variables(s, "outcomes").update(
        OPEN_ALERT_AFTER_MS=b.ref(OPEN_ALERT_PARAMETER)
    )),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_outcome_check_catches(breakage, stack):
    check, breaking = BREAKAGES[breakage]
    breaking(stack)
    assert CHECKS[check](stack) != []


# --- the shared checks know the outcomes function ---------------------------------------------------


def test_event_source_check_catches_the_outcomes_function_on_another_stream(stack):
    _outcomes_mapping(stack)["EventSourceArn"] = b.getatt(b.table(stack, "service-b-data"), "StreamArn")
    assert any("outcomes" in p for p in check_event_sources(stack))


def test_event_source_check_still_wants_the_stream_processor_on_the_transactions_stream(stack):
    # The outcomes function's mapping does not stand in for the stream processor's.
    del stack.template["Resources"][b.mapping_of(stack, "transactions")]
    assert check_event_sources(stack) != []


def test_invoker_check_catches_the_outcomes_function_on_another_stream(stack):
    _outcomes_mapping(stack)["EventSourceArn"] = b.getatt(b.table(stack, "service-a-data"), "StreamArn")
    assert check_invokers(stack) != []


def test_invoker_check_catches_a_permission_on_the_outcomes_function(stack):
    stack.template["Resources"]["OutcomesInvokeByAnyone"] = {
        "Type": "AWS::Lambda::Permission",
        "Properties": {"Action": "lambda:InvokeFunction", "FunctionName": b.getatt(b.function(stack, "outcomes"), "Arn"), "Principal": "events.amazonaws.com"},
    }
    assert check_invokers(stack) != []


def test_named_resources_check_catches_a_history_of_no_template(stack):
    b.variables(stack, "coordinator")["OUTCOME_LOG_GROUP"] = "/aws/events/elsewhere"
    assert any("OUTCOME_LOG_GROUP" in p for p in check_named_resources(stack))


def test_grant_check_catches_a_history_read_no_role_may(stack):
    _drop_statements(stack, "coordinator", "logs:FilterLogEvents")
    assert "the code calls logs:FilterLogEvents, no role may" in check_grants_match_code(stack)


def test_named_resources_check_catches_a_bus_of_no_template(stack):
    b.variables(stack, "outcomes")["EVENT_BUS_NAME"] = "default"
    assert any("EVENT_BUS_NAME" in p for p in check_named_resources(stack))


def test_grant_check_catches_put_events_the_code_makes_that_no_role_may(stack):
    for binary in ["outcomes", "sweeper"]:
        _drop_statements(stack, binary, "events:PutEvents")
    assert "the code calls events:PutEvents, no role may" in check_grants_match_code(stack)


def test_grant_check_catches_a_put_events_grant_the_code_no_longer_uses(tmp_path, stack):
    # The code stops sending events: the PutEvents grants are left over.
    functions_dir = tmp_path / "functions"
    shutil.copytree(REPO / "functions", functions_dir, ignore=shutil.ignore_patterns("target", "*.zip"))
    for source in functions_dir.glob("*/src/**/*.rs"):
        text = source.read_text()
        if ".put_events()" in text:
            source.write_text(text.replace(".put_events()", ".events_put()"))
    assert "events:PutEvents is granted, the code never calls it" in check_grants_match_code(stack, functions_dir)
