"""Adding a participant service to the SAM template, done as infra/DEPLOY.md describes (its table,
its message key, its deployment, the registries, the grants, its resource policy, its stream, its
alarms), keeps every check green; each step left out is caught. The third service is added to a copy of the template in
memory (and linted with cfn-lint as a JSON template). SAM only: it edits the SAM file as written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cfn import REPO, Stack, sam_transform
from production_checks import (
    check_alarms,
    check_aliases,
    check_no_local_keys,
    check_participant_invokers,
    check_participant_keys,
)
from template_checks import (
    check_environment,
    check_event_sources,
    check_iam,
    check_invoke_only_registered,
    check_participant_isolation,
    check_permissions_complete,
    check_service_operations,
    check_tables,
)

STEPS = ["table", "key", "deployment", "registry", "iam", "permissions", "stream", "alarms"]
# The venv's cfn-lint (infra/check.sh runs the tests with the venv's interpreter).
CFN_LINT = str(Path(sys.executable).with_name("cfn-lint"))

RENAMES = {
    "ServiceAName": "ServiceCName",
    "ServiceATableName": "ServiceCTableName",
    "ServiceATable": "ServiceCTable",
    "ParticipantAFunction": "ParticipantCFunction",
    "ParticipantAFunction.Alias": "ParticipantCFunction.Alias",
    "ServiceAMessageKey": "ServiceCMessageKey",
    "ParticipantAInvokeByCoordinator": "ParticipantCInvokeByCoordinator",
    "ParticipantAInvokeBySweeper": "ParticipantCInvokeBySweeper",
    "ParticipantARole": "ParticipantCRole",
    "ParticipantALogGroup": "ParticipantCLogGroup",
    "ParticipantAErrorsAlarm": "ParticipantCErrorsAlarm",
    "ParticipantAThrottlesAlarm": "ParticipantCThrottlesAlarm",
    "ServiceATableThrottlesAlarm": "ServiceCTableThrottlesAlarm",
}


def _rename(value: Any) -> Any:
    """A copy with the logical ids of service A replaced by those of service C."""
    if isinstance(value, dict):
        return {_rename(k): _rename(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename(v) for v in value]
    if isinstance(value, str):
        for old, new in sorted(RENAMES.items(), key=lambda kv: -len(kv[0])):
            value = value.replace("${" + old + "}", "${" + new + "}").replace("${" + old + ".", "${" + new + ".")
        return RENAMES.get(value, value)
    return value


def _statement(template: dict, role: str, sid: str) -> dict:
    return next(
        s
        for p in template["Resources"][role]["Properties"]["Policies"]
        for s in p["PolicyDocument"]["Statement"]
        if s.get("Sid") == sid
    )


def _append_json_entry(variables: dict, name: str, entry: str, **values: Any) -> None:
    """Adds `entry` to the JSON object of a `!Sub` (its text, or its text and variables)."""
    sub = variables[name]["Fn::Sub"]
    text, bound = (sub, {}) if isinstance(sub, str) else (sub[0], dict(sub[1]))
    assert text.endswith("}")
    text = text[:-1] + ", " + entry + "}"
    bound.update(values)
    variables[name] = {"Fn::Sub": [text, bound] if bound else text}


def add_service_c(raw: dict, skip: str | None = None) -> dict:
    template = json.loads(json.dumps(raw))  # plain dicts and strings
    params, res = template["Parameters"], template["Resources"]
    if skip != "table":
        # 1. the service's table (and its name parameter)
        params["ServiceCName"] = {"Type": "String", "Default": "service-c"}
        params["ServiceCTableName"] = {"Type": "String", "Default": "service-c-data"}
        res["ServiceCTable"] = _rename(res["ServiceATable"])
    if skip != "key":
        # 2. the service's message key (a secret of its own, generated)
        res["ServiceCMessageKey"] = _rename(res["ServiceAMessageKey"])
    if skip != "deployment":
        # 3. the participant deployment: log group, role (its own table and key), function (binary
        # `participant`, its PARTICIPANT_KEY)
        for logical_id in ["ParticipantALogGroup", "ParticipantARole", "ParticipantAFunction"]:
            res[RENAMES[logical_id]] = _rename(res[logical_id])
    if skip != "registry":
        # 4. the registry entries
        for function in ["CoordinatorFunction", "SweeperFunction"]:
            variables = res[function]["Properties"]["Environment"]["Variables"]
            _append_json_entry(
                variables, "PARTICIPANTS", '"${ServiceCName}": "${ServiceC}"', ServiceC={"Ref": "ParticipantCFunction.Alias"}
            )
            _append_json_entry(variables, "PARTICIPANT_KEYS", '"${ServiceCName}": "${ServiceCMessageKey}"')
        for function in ["CoordinatorFunction", "SweeperFunction", "StreamProcessorFunction"]:
            variables = res[function]["Properties"]["Environment"]["Variables"]
            _append_json_entry(variables, "PARTICIPANT_TABLES", '"${ServiceCName}": "${ServiceCTable}"')
    if skip != "iam":
        # 5. IAM of the functions that reach every service
        for role in ["CoordinatorRole", "SweeperRole"]:
            _statement(template, role, "RegisteredParticipants")["Resource"].append({"Ref": "ParticipantCFunction.Alias"})
            _statement(template, role, "ParticipantKeys")["Resource"].append({"Ref": "ServiceCMessageKey"})
        _statement(template, "SweeperRole", "SparseIndexes")["Resource"].append(
            {"Fn::Sub": "${ServiceCTable.Arn}/index/locks-by-expiry"}
        )
        _statement(template, "SweeperRole", "ReadLockedItems")["Resource"].append({"Fn::GetAtt": ["ServiceCTable", "Arn"]})
        # The operators' views read the new table's locks index and items too.
        _statement(template, "CoordinatorRole", "OperatorViews")["Resource"].append(
            {"Fn::Sub": "${ServiceCTable.Arn}/index/locks-by-expiry"}
        )
        _statement(template, "CoordinatorRole", "OperatorReads")["Resource"].append({"Fn::GetAtt": ["ServiceCTable", "Arn"]})
        _statement(template, "StreamProcessorRole", "ReadStreams")["Resource"].append(
            {"Fn::GetAtt": ["ServiceCTable", "StreamArn"]}
        )
    if skip != "permissions":
        # 6. the participant's resource policy: the coordinator's and the sweeper's roles
        for caller in ["Coordinator", "Sweeper"]:
            res[f"ParticipantCInvokeBy{caller}"] = _rename(res[f"ParticipantAInvokeBy{caller}"])
    if skip != "stream":
        # 7. the stream event source
        events = res["StreamProcessorFunction"]["Properties"]["Events"]
        events["ServiceCStream"] = _rename(events["ServiceAStream"])
    if skip != "alarms":
        # 8. the alarms of the new function and table
        for logical_id in ["ParticipantAErrorsAlarm", "ParticipantAThrottlesAlarm", "ServiceATableThrottlesAlarm"]:
            res[RENAMES[logical_id]] = _rename(res[logical_id])
    return template


def all_problems(raw: dict, contract: dict) -> list[str]:
    try:
        stack = Stack("sam", sam_transform(raw), contract)
    except AssertionError as error:
        return [str(error)]
    return (
        check_tables(stack)
        + check_environment(stack)
        + check_iam(stack)
        + check_invoke_only_registered(stack)
        + check_participant_isolation(stack)
        + check_permissions_complete(stack)
        + check_event_sources(stack)
        + check_aliases(stack)
        + check_alarms(stack)
        + check_participant_keys(stack)
        + check_participant_invokers(stack)
        + check_no_local_keys(stack)
        + check_service_operations(stack)
    )


def test_a_third_service_added_as_documented_passes(raw, contract, tmp_path):
    template = add_service_c(raw)
    assert all_problems(template, contract) == []
    path = tmp_path / "template.json"
    path.write_text(json.dumps(template, indent=1))
    lint = subprocess.run([CFN_LINT, str(path)], cwd=REPO, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("skip", STEPS)
def test_each_step_left_out_is_caught(raw, contract, skip):
    assert all_problems(add_service_c(raw, skip=skip), contract) != []
