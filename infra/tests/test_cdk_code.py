"""CDK only: each function deploys the code of the binary its environment belongs to.

The deployed checks tell a function's binary by its environment; SAM's build metadata names the
binary it builds (test_sam_source.py). The CDK template names its code by asset hash only, so here
the staged asset (cdk.out/<aws:asset:path>, a zip as infra/cdk/synth.sh stages it, or a directory)
is opened and its `bootstrap` compared with the binaries infra/build.sh built
(target/lambda-debug/<binary>/bootstrap.zip, target/lambda/<binary>/bootstrap.zip, or the
TWOPC_LAMBDA_ZIPS directory synth.sh was given). Where two binaries read the same environment (the
generic participant and the inventory's), the function's `twopc:binary` metadata tells its binary,
and this holds that declaration to the code."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

import breaking as b
from cfn import CDK_TEMPLATE, REPO, Stack
from system import CDK_BINARY_METADATA, binary_of, functions


def build_dirs() -> list[Path]:
    dirs = [REPO / "target" / "lambda-debug", REPO / "target" / "lambda"]
    if os.environ.get("TWOPC_LAMBDA_ZIPS"):
        dirs.insert(0, REPO / os.environ["TWOPC_LAMBDA_ZIPS"])
    return dirs


def _bootstrap_digest(path: Path) -> str | None:
    """sha256 of the `bootstrap` in a zip or a directory (None when there is none)."""
    if path.is_dir():
        bootstrap = path / "bootstrap"
        return hashlib.sha256(bootstrap.read_bytes()).hexdigest() if bootstrap.is_file() else None
    if path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            if "bootstrap" in archive.namelist():
                return hashlib.sha256(archive.read("bootstrap")).hexdigest()
    return None


def built_binaries(dirs: list[Path]) -> dict[str, str]:
    """bootstrap digest -> binary, over every build directory."""
    built = {}
    for directory in dirs:
        for zip_path in sorted(directory.glob("*/bootstrap.zip")):
            if (digest := _bootstrap_digest(zip_path)) is not None:
                built[digest] = zip_path.parent.name
    return built


def check_cdk_code(stack: Stack, cdk_out: Path, dirs: list[Path]) -> list[str]:
    built = built_binaries(dirs)
    if not built:
        return [f"no built binaries under {[str(d) for d in dirs]}: run `infra/build.sh --quick` (synth.sh does)"]
    problems = []
    for function in functions(stack):
        asset = stack.template["Resources"][function].get("Metadata", {}).get("aws:asset:path")
        if asset is None:
            problems.append(f"{function}: no aws:asset:path metadata: its code cannot be told")
            continue
        digest = _bootstrap_digest(cdk_out / asset)
        if digest is None:
            problems.append(f"{function}: {cdk_out / asset} has no bootstrap (synthesize again: bash infra/cdk/synth.sh)")
        elif built.get(digest) is None:
            problems.append(f"{function}: its bootstrap is none of the binaries built under {[str(d) for d in dirs]}")
        elif built[digest] != binary_of(stack, function):
            problems.append(f"{function}: deploys {built[digest]!r}, its environment is that of {binary_of(stack, function)!r}")
    return problems


def test_cdk_functions_deploy_their_binaries(cdk):
    assert check_cdk_code(cdk, CDK_TEMPLATE.parent, build_dirs()) == []


def test_cdk_code_check_catches_swapped_code(cdk):
    coordinator, participant = b.function(cdk, "coordinator"), b.participant(cdk, 0)["function"]
    resources = cdk.template["Resources"]
    resources[coordinator]["Metadata"]["aws:asset:path"] = resources[participant]["Metadata"]["aws:asset:path"]
    assert check_cdk_code(cdk, CDK_TEMPLATE.parent, build_dirs()) != []


@pytest.mark.parametrize("own", ["inventory", "payments"])
def test_cdk_code_check_catches_the_generic_participant_deployed_for_a_services_own(cdk, own):
    # The inventory's (or the payments') function with the generic participant's code.
    function, generic = b.function(cdk, own), b.function(cdk, "participant")
    resources = cdk.template["Resources"]
    resources[function]["Metadata"]["aws:asset:path"] = resources[generic]["Metadata"]["aws:asset:path"]
    assert check_cdk_code(cdk, CDK_TEMPLATE.parent, build_dirs()) != []


def test_cdk_code_check_catches_a_wrong_binary_declaration(cdk):
    # The inventory's code, declared as the generic participant's (twopc:binary tells the two apart).
    inventory = b.function(cdk, "inventory")
    cdk.template["Resources"][inventory]["Metadata"][CDK_BINARY_METADATA] = "participant"
    assert check_cdk_code(cdk, CDK_TEMPLATE.parent, build_dirs()) != []
