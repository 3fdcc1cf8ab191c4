"""CloudFormation templates read and evaluated offline: the SAM template (transformed with the SAM
translator's public API, as CloudFormation would) and the CDK app's synthesized template.

The checks compare meanings, not spellings: SAM writes `!Sub "${Table.Arn}/index/x"` where CDK writes
`{"Fn::Join": ["", [{"Fn::GetAtt": [...]}, "/index/x"]]}`, and CDK's logical ids carry hash suffixes.
So every value is *resolved* to one canonical form before it is looked at:

- a parameter becomes its value (the default unless the caller overrides it), as a string;
- a `Ref` to a table becomes the table's name (what `Ref` returns and what the code reads); a `Ref`
  to any other resource becomes `${LogicalId}`, an attribute `${LogicalId.Attribute}`, a pseudo
  parameter `${AWS::Name}`; `AWS::NoValue` removes the value;
- `Fn::Sub`, `Fn::Join`, `Fn::Select`, `Fn::Split`, `Fn::If` (with the template's conditions evaluated
  for those parameter values) and `Fn::FindInMap` are carried out.

So `${Table.Arn}/index/x` is the same text from either template, and a resource's conditions are
honoured (a resource whose condition is false does not exist).
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SAM_TEMPLATE = REPO / "infra" / "template.yaml"
# INFRA_CDK_TEMPLATE checks another synthesized template (for example one synthesized elsewhere).
CDK_TEMPLATE = Path(
    os.environ.get("INFRA_CDK_TEMPLATE") or REPO / "infra" / "cdk" / "cdk.out" / "TwoPhaseCommit.template.json"
)

# The value of `Ref: AWS::NoValue`: removed from the list or object that holds it.
NO_VALUE = object()

PLACEHOLDER = re.compile(r"^\$\{(?P<id>[A-Za-z0-9]+)(?:\.(?P<attribute>[A-Za-z0-9.]+))?\}$")


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def load_sam(path: Path = SAM_TEMPLATE) -> dict:
    """The SAM template as written (short-form tags such as !Ref become their long forms)."""
    from samtranslator.yaml_helper import yaml_parse

    return json.loads(json.dumps(yaml_parse(path.read_text())))


def _with_s3_code(template: dict) -> dict:
    """A copy whose local CodeUri values are S3 URIs, as `sam package` leaves them: the translator
    accepts nothing else, and where the code comes from changes nothing the checks look at."""
    template = copy.deepcopy(template)
    function_globals = template.get("Globals", {}).get("Function", {})
    if "CodeUri" in function_globals:
        function_globals["CodeUri"] = "s3://bucket/code.zip"
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Serverless::Function":
            resource.setdefault("Properties", {})["CodeUri"] = "s3://bucket/code.zip"
    return template


def sam_transform(raw: dict) -> dict:
    """The SAM template after the AWS::Serverless-2016-10-31 transform (what CloudFormation deploys).

    Runs offline: managed policies are looked up in an empty map (the template must not use any)
    and the boto session only names a region, it never calls AWS."""
    import boto3
    from samtranslator.model.exceptions import InvalidDocumentException
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator

    translator = Translator({}, Parser(), boto_session=boto3.session.Session(region_name="us-east-1"))
    try:
        transformed = translator.translate(
            _with_s3_code(raw),
            parameter_values={},
            passthrough_metadata=True,
            get_managed_policy_map=lambda: {},
        )
    except InvalidDocumentException as error:
        raise AssertionError(f"SAM transform failed: {[cause.message for cause in error.causes]}") from None
    return json.loads(json.dumps(transformed))


def load_cdk(path: Path = CDK_TEMPLATE) -> dict:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: run `bash infra/cdk/synth.sh` (infra/check.sh runs it first)"
        )
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------


@dataclass
class Stack:
    """A deployed template, the code's contract, and the parameter values it is evaluated with."""

    name: str
    template: dict
    code: dict
    overrides: dict[str, str] = field(default_factory=dict)

    def with_parameters(self, **values: Any) -> Stack:
        """The same template evaluated with other parameter values (the template is shared)."""
        return Stack(self.name, self.template, self.code, {**self.overrides, **{k: str(v) for k, v in values.items()}})

    # --- parameters and conditions ---------------------------------------------------------------

    def parameter(self, name: str) -> str | None:
        if name in self.overrides:
            return self.overrides[name]
        definition = self.template.get("Parameters", {}).get(name)
        if definition is None or "Default" not in definition:
            return None
        default = definition["Default"]
        if isinstance(default, list):
            return ",".join(str(d) for d in default)
        return str(default)

    def condition(self, name: str) -> bool:
        definition = self.template.get("Conditions", {}).get(name)
        if definition is None:
            raise KeyError(f"no condition {name}")
        return self._truth(definition)

    def _truth(self, expression: Any) -> bool:
        if isinstance(expression, dict) and len(expression) == 1:
            (function, arguments), = expression.items()
            if function == "Condition":
                return self.condition(arguments)
            if function == "Fn::Equals":
                left, right = (self.resolve(a) for a in arguments)
                return _scalar(left) == _scalar(right)
            if function == "Fn::Not":
                return not self._truth(arguments[0])
            if function == "Fn::And":
                return all(self._truth(a) for a in arguments)
            if function == "Fn::Or":
                return any(self._truth(a) for a in arguments)
        raise ValueError(f"not a condition: {expression!r}")

    # --- resources -------------------------------------------------------------------------------

    def exists(self, logical_id: str) -> bool:
        resource = self.template.get("Resources", {}).get(logical_id)
        if resource is None:
            return False
        condition = resource.get("Condition")
        return condition is None or self.condition(condition)

    def resources(self, kind: str) -> dict[str, dict]:
        """Logical id -> resource, of the resources of this type that exist for these parameters."""
        return {
            logical_id: resource
            for logical_id, resource in self.template.get("Resources", {}).items()
            if resource.get("Type") == kind and self.exists(logical_id)
        }

    def kind(self, logical_id: str) -> str | None:
        return self.template.get("Resources", {}).get(logical_id, {}).get("Type")

    def props(self, logical_id: str) -> dict:
        """A resource's properties, resolved."""
        value = self.resolve(self.template["Resources"][logical_id].get("Properties", {}))
        return value if isinstance(value, dict) else {}

    def table_name(self, logical_id: str) -> str:
        """What `Ref` of a table returns: its name (the logical id as a placeholder when CloudFormation
        names it)."""
        name = self.template["Resources"][logical_id].get("Properties", {}).get("TableName")
        return str(self.resolve(name)) if name is not None else "${%s}" % logical_id

    # --- values ----------------------------------------------------------------------------------

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [v for v in (self.resolve(item) for item in value) if v is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (function, arguments), = value.items()
            if function == "Ref":
                return self._ref(arguments)
            if function == "Condition":
                return self.condition(arguments)
            handler = _FUNCTIONS.get(function)
            if handler is not None:
                return handler(self, arguments)
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not NO_VALUE}

    def _ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name.startswith("AWS::"):
            return "${%s}" % name
        if name in self.template.get("Parameters", {}):
            value = self.parameter(name)
            return value if value is not None else "${%s}" % name
        if self.kind(name) == "AWS::DynamoDB::Table":
            return self.table_name(name)
        return "${%s}" % name

    def _sub(self, arguments: Any) -> str:
        text, variables = (arguments, {}) if isinstance(arguments, str) else (arguments[0], arguments[1])

        def substitute(match: re.Match) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                return _scalar(self.resolve(variables[name]))
            if "." in name and not name.startswith("AWS::"):
                return "${%s}" % name
            return _scalar(self._ref(name))

        return re.sub(r"\$\{([^}]+)\}", substitute, text)


def _scalar(value: Any) -> str:
    if value is NO_VALUE:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _getatt(stack: Stack, arguments: Any) -> str:
    if isinstance(arguments, str):
        logical_id, _, attribute = arguments.partition(".")
    else:
        logical_id, attribute = arguments[0], _scalar(stack.resolve(arguments[1]))
    return "${%s.%s}" % (logical_id, attribute)


def _join(stack: Stack, arguments: Any) -> str:
    separator, values = arguments
    values = stack.resolve(values)
    if not isinstance(values, list):
        return "${Fn::Join}"
    return separator.join(_scalar(v) for v in values)


def _select(stack: Stack, arguments: Any) -> Any:
    index, values = int(_scalar(stack.resolve(arguments[0]))), stack.resolve(arguments[1])
    if isinstance(values, list) and 0 <= index < len(values):
        return values[index]
    return "${Fn::Select:%d}" % index


def _split(stack: Stack, arguments: Any) -> Any:
    separator, text = arguments[0], stack.resolve(arguments[1])
    return text.split(separator) if isinstance(text, str) else "${Fn::Split}"


def _if(stack: Stack, arguments: Any) -> Any:
    condition, when_true, when_false = arguments
    return stack.resolve(when_true if stack.condition(condition) else when_false)


def _find_in_map(stack: Stack, arguments: Any) -> Any:
    keys = [_scalar(stack.resolve(k)) for k in arguments[:3]]
    value: Any = stack.template.get("Mappings", {})
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return "${Fn::FindInMap:%s}" % ".".join(keys)
        value = value[key]
    return stack.resolve(value)


_FUNCTIONS = {
    "Fn::GetAtt": _getatt,
    "Fn::Sub": Stack._sub,
    "Fn::Join": _join,
    "Fn::Select": _select,
    "Fn::Split": _split,
    "Fn::If": _if,
    "Fn::FindInMap": _find_in_map,
    "Fn::Equals": lambda stack, arguments: stack._truth({"Fn::Equals": arguments}),
    "Fn::Not": lambda stack, arguments: stack._truth({"Fn::Not": arguments}),
    "Fn::And": lambda stack, arguments: stack._truth({"Fn::And": arguments}),
    "Fn::Or": lambda stack, arguments: stack._truth({"Fn::Or": arguments}),
}


# ----------------------------------------------------------------------------------------------
# Placeholders
# ----------------------------------------------------------------------------------------------


def placeholder(text: Any) -> tuple[str, str | None] | None:
    """(logical id, attribute or None) of a resolved value that is exactly `${Id}` / `${Id.Attr}`."""
    if not isinstance(text, str):
        return None
    match = PLACEHOLDER.match(text)
    if match is None or match.group("id").startswith("AWS"):
        return None
    return match.group("id"), match.group("attribute")


def ref_id(text: Any) -> str | None:
    """The logical id of a resolved `Ref` (`${Id}`)."""
    target = placeholder(text)
    return target[0] if target and target[1] is None else None


def att_id(text: Any, attribute: str) -> str | None:
    """The logical id of a resolved `Fn::GetAtt Id.<attribute>`."""
    target = placeholder(text)
    return target[0] if target and target[1] == attribute else None


def as_list(value: Any) -> list:
    if value is None or value is NO_VALUE:
        return []
    return value if isinstance(value, list) else [value]


def number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
