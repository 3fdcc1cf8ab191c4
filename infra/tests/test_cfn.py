"""The resolver the checks rest on: SAM's and CDK's spellings of one value resolve to the same text,
conditions are evaluated for the parameter values given, AWS::NoValue removes a value."""

from __future__ import annotations

from cfn import NO_VALUE, Stack, att_id, ref_id

TEMPLATE = {
    "Parameters": {"Stage": {"Type": "String", "Default": "prod"}, "Mode": {"Type": "String", "Default": "Off"}},
    "Conditions": {"On": {"Fn::Equals": [{"Ref": "Mode"}, "On"]}, "Off": {"Fn::Not": [{"Condition": "On"}]}},
    "Resources": {
        "TableA1B2": {"Type": "AWS::DynamoDB::Table", "Properties": {"TableName": "transactions"}},
        "Api": {"Type": "AWS::ApiGatewayV2::Api", "Properties": {}},
        "Extra": {"Type": "AWS::SQS::Queue", "Condition": "On", "Properties": {}},
    },
}


def _stack(**overrides: str) -> Stack:
    return Stack("test", TEMPLATE, {}).with_parameters(**overrides)


def test_sub_and_join_resolve_alike():
    stack = _stack()
    sub = {"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${Api}/${Stage}/POST/@connections/*"}
    join = {
        "Fn::Join": [
            "",
            ["arn:", {"Ref": "AWS::Partition"}, ":execute-api:", {"Ref": "AWS::Region"}, ":", {"Ref": "AWS::AccountId"},
             ":", {"Ref": "Api"}, "/", {"Ref": "Stage"}, "/POST/@connections/*"],
        ]
    }
    expected = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${Api}/prod/POST/@connections/*"
    assert stack.resolve(sub) == stack.resolve(join) == expected


def test_getatt_forms_and_sub_variables():
    stack = _stack()
    assert stack.resolve({"Fn::GetAtt": "TableA1B2.Arn"}) == stack.resolve({"Fn::GetAtt": ["TableA1B2", "Arn"]})
    assert att_id(stack.resolve({"Fn::GetAtt": ["TableA1B2", "StreamArn"]}), "StreamArn") == "TableA1B2"
    assert stack.resolve({"Fn::Sub": ["${T}/index/x", {"T": {"Fn::GetAtt": ["TableA1B2", "Arn"]}}]}) == "${TableA1B2.Arn}/index/x"
    # ${!x} is a literal ${x}
    assert stack.resolve({"Fn::Sub": "s3://b/${!year}/"}) == "s3://b/${year}/"


def test_a_table_ref_is_its_name_other_refs_are_placeholders():
    stack = _stack()
    assert stack.resolve({"Ref": "TableA1B2"}) == "transactions"
    assert ref_id(stack.resolve({"Ref": "Api"})) == "Api"


def test_conditions_follow_the_parameters():
    value = {"Fn::If": ["On", "traced", {"Ref": "AWS::NoValue"}]}
    assert _stack().resolve(value) is NO_VALUE
    assert _stack(Mode="On").resolve(value) == "traced"
    assert _stack().resolve([value, "kept"]) == ["kept"]
    assert _stack().resolve({"a": value, "b": 1}) == {"b": 1}
    assert "Extra" not in _stack().resources("AWS::SQS::Queue")
    assert "Extra" in _stack(Mode="On").resources("AWS::SQS::Queue")


def test_select_and_split():
    stack = _stack()
    assert stack.resolve({"Fn::Select": [1, {"Fn::Split": ["/", "a/b/c"]}]}) == "b"
