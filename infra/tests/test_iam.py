"""2. Least privilege: no action wildcards, no "*" resource except the justified allow-list
(template_checks.STAR_RESOURCE_ALLOWED: dynamodb:ListStreams, which IAM cannot scope), wildcards
inside ARNs only as `bucket/*` and `stage/POST/@connections/*`, no managed policies, one role per
function, lambda:InvokeFunction only on the registered participants; and the actions granted on each
table are exactly the SDK calls the code's store for that table makes."""

from __future__ import annotations

import shutil

import pytest

from template_checks import (
    TEMPLATE,
    REPO,
    check_grants_match_code,
    check_iam,
    check_invoke_only_registered,
    check_participant_isolation,
    check_permissions_complete,
    load,
    transform,
)


def test_no_wildcards_and_no_managed_policies(transformed):
    assert check_iam(transformed) == []


def test_invoke_only_registered_participants(raw, transformed):
    assert check_invoke_only_registered(raw, transformed) == []


def test_the_only_star_resource_is_list_streams(transformed):
    stars = []
    for name, resource in transformed["Resources"].items():
        if resource["Type"] != "AWS::IAM::Role":
            continue
        for policy in resource["Properties"].get("Policies", []):
            for statement in policy["PolicyDocument"]["Statement"]:
                if statement["Effect"] == "Allow" and "*" in (
                    statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                ):
                    stars.append((name, statement["Action"]))
    assert stars == [("StreamProcessorRole", "dynamodb:ListStreams")]


# --- the checks can fail: broken copies of the template, written to a temporary directory -------


def _broken_copy(tmp_path, old: str, new: str) -> dict:
    text = TEMPLATE.read_text()
    assert old in text, f"{old!r} not in the template"
    path = tmp_path / "template.yaml"
    path.write_text(text.replace(old, new, 1))
    return transform(load(path), str(path))


@pytest.mark.parametrize(
    "old,new",
    [
        # an action wildcard
        ("Action: [dynamodb:GetItem, dynamodb:PutItem, dynamodb:UpdateItem]", "Action: [dynamodb:*]"),
        ("Action: [dynamodb:GetItem, dynamodb:PutItem, dynamodb:UpdateItem]", "Action: [dynamodb:Get*]"),
        # a "*" resource for an action that can be scoped
        ("Action: firehose:PutRecordBatch\n                Resource: !GetAtt LakeDeliveryStream.Arn",
         'Action: firehose:PutRecordBatch\n                Resource: "*"'),
        # a wildcard inside an ARN: every index of the table instead of the one used
        ("${ConnectionsTable.Arn}/index/by-topic", "${ConnectionsTable.Arn}/index/*"),
        # every route of the API instead of @connections
        ("${WebSocketStageName}/POST/@connections/*", "${WebSocketStageName}/*"),
        # a SAM-generated role: SAM attaches AWSLambdaDynamoDBExecutionRole (Resource "*")
        ("      Role: !GetAtt StreamProcessorRole.Arn\n", "      Policies: []\n"),
    ],
)
def test_iam_check_catches(tmp_path, old, new):
    assert check_iam(_broken_copy(tmp_path, old, new)) != []


def test_invoke_check_catches_an_unregistered_target(raw):
    statement = next(
        s
        for p in raw["Resources"]["CoordinatorRole"]["Properties"]["Policies"]
        for s in p["PolicyDocument"]["Statement"]
        if s["Action"] == "lambda:InvokeFunction"
    )
    statement["Resource"].append({"Fn::GetAtt": ["SweeperFunction", "Arn"]})
    assert check_invoke_only_registered(raw, transform(raw)) != []


def test_participants_reach_only_their_own_table(raw, transformed):
    assert check_participant_isolation(raw, transformed) == []


def test_permissions_cover_every_table(raw, transformed):
    assert check_permissions_complete(raw, transformed) == []


def _statement(raw, role, sid):
    return next(
        s
        for p in raw["Resources"][role]["Properties"]["Policies"]
        for s in p["PolicyDocument"]["Statement"]
        if s.get("Sid") == sid
    )


def test_isolation_check_catches_a_participant_reaching_another_table(raw):
    _statement(raw, "ParticipantARole", "OwnDataTable")["Resource"] = [
        {"Fn::GetAtt": ["ServiceATable", "Arn"]},
        {"Fn::GetAtt": ["ServiceBTable", "Arn"]},
    ]
    assert check_participant_isolation(raw, transform(raw)) != []


@pytest.mark.parametrize("role,sid", [("SweeperRole", "SparseIndexes"), ("StreamProcessorRole", "ReadStreams")])
def test_completeness_check_catches_a_missing_grant(raw, role, sid):
    _statement(raw, role, sid)["Resource"].pop()
    assert check_permissions_complete(raw, transform(raw)) != []


def test_invoke_check_catches_a_registered_participant_it_cannot_invoke(raw):
    _statement(raw, "SweeperRole", "RegisteredParticipants")["Resource"].pop()
    assert check_invoke_only_registered(raw, transform(raw)) != []


def test_grants_match_the_code(raw, transformed):
    assert check_grants_match_code(raw, transformed) == []


def test_grant_check_catches_a_grant_the_code_never_uses(raw):
    _statement(raw, "ParticipantARole", "OwnDataTable")["Action"].append("dynamodb:PutItem")
    assert check_grants_match_code(raw, transform(raw)) != []


@pytest.mark.parametrize(
    "path,call",
    [
        # a participant starts writing its table with BatchWriteItem: no role may
        ("twopc/src/items.rs", "client.batch_write_item()"),
        # the transactions store starts deleting records: no role may
        ("twopc/src/record.rs", "client.delete_item()"),
        # a function starts calling DynamoDB outside the known table stores
        ("twopc/src/sweeper.rs", "client.scan()"),
        # the stream processor starts closing connections through the management API: allowed
        # (ManageConnections is granted), so this one must NOT be reported
        ("twopc/src/fanout/realtime.rs", "client.delete_connection()"),
    ],
)
def test_grant_check_reads_the_source(tmp_path, raw, transformed, path, call):
    functions = tmp_path / "functions"
    shutil.copytree(REPO / "functions", functions, ignore=shutil.ignore_patterns("target", "*.zip"))
    with open(functions / path, "a") as source:
        source.write(f"\n// added by the test\nfn _probe() {{ {call}; }}\n")
    problems = check_grants_match_code(raw, transformed, functions)
    if "delete_connection" in call:
        assert problems == []
    else:
        assert problems != []
