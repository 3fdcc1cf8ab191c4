"""SAM only: what the SAM file itself must say beyond what it deploys. `sam build` builds each function
with cargo-lambda from the binary its Metadata names, so that binary must be the one whose
environment the function gets (the deployed checks tell a function's binary by its environment)."""

from __future__ import annotations

import pytest

from cfn import Stack
from system import binary_of


def check_build_metadata(raw: dict, stack: Stack) -> list[str]:
    """Every function is built by cargo-lambda from the binary its environment belongs to (`stack`:
    `raw` after the transform; the build metadata changes nothing it deploys)."""
    problems = []
    for name, resource in raw["Resources"].items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        metadata = resource.get("Metadata", {})
        if metadata.get("BuildMethod") != "rust-cargolambda":
            problems.append(f"{name}: BuildMethod is {metadata.get('BuildMethod')!r}, not rust-cargolambda")
        binary = metadata.get("BuildProperties", {}).get("Binary")
        if binary != binary_of(stack, name):
            problems.append(f"{name}: builds {binary!r}, its environment is that of {binary_of(stack, name)!r}")
    return problems


def test_build_metadata(raw, sam):
    assert check_build_metadata(raw, sam) == []


@pytest.mark.parametrize(
    "breakage",
    ["build-method", "wrong-binary", "no-binary", "inventory-as-the-generic-participant", "payments-as-the-generic-participant"],
)
def test_build_metadata_check_catches(breakage, raw, sam):
    metadata = lambda name: raw["Resources"][name]["Metadata"]  # noqa: E731
    if breakage == "build-method":
        metadata("SweeperFunction")["BuildMethod"] = "makefile"
    elif breakage == "wrong-binary":
        # the coordinator's environment, the participant's code
        metadata("CoordinatorFunction")["BuildProperties"]["Binary"] = "participant"
    elif breakage == "no-binary":
        del metadata("ConnectionsFunction")["BuildProperties"]
    elif breakage == "inventory-as-the-generic-participant":
        # The same environment, the generic participant's code: it knows neither reserve nor release.
        metadata("ParticipantInventoryFunction")["BuildProperties"]["Binary"] = "participant"
    elif breakage == "payments-as-the-generic-participant":
        # The payments' environment, the generic participant's code: it knows no charge.
        metadata("ParticipantPaymentsFunction")["BuildProperties"]["Binary"] = "participant"
    assert check_build_metadata(raw, sam) != []


def test_globals_carry_the_logging_and_tracing(raw):
    # One place for every function (Globals), so a function added later gets them too.
    function_globals = raw["Globals"]["Function"]
    assert function_globals["LoggingConfig"] == {
        "LogFormat": "JSON",
        "ApplicationLogLevel": {"Ref": "LogLevel"},
        "SystemLogLevel": "WARN",
    }
    assert function_globals["Tracing"] == {"Ref": "TracingMode"}
    assert "Environment" not in function_globals
