"""Shared fixtures: the code's contract; `stack`, each deployed template (ids `sam`: the SAM template
after the transform; `cdk`: the CDK app's synthesized template); `raw`, the SAM template as written,
for the tests about the SAM file itself."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cfn  # noqa: E402
import template_checks  # noqa: E402

TEMPLATES = ["sam", "cdk"]


@pytest.fixture(scope="session")
def contract() -> dict:
    """`cargo run -q -p twopc --example contract`: the code's tables and function environment."""
    return template_checks.contract()


@pytest.fixture(scope="session")
def _raw() -> dict:
    return cfn.load_sam()


@pytest.fixture(scope="session")
def _deployed(_raw) -> Callable[[str], dict]:
    """Each deployed template, loaded once (a failure to load is remembered and told each time)."""
    loaders = {"sam": lambda: cfn.sam_transform(_raw), "cdk": cfn.load_cdk}
    loaded: dict[str, dict | Exception] = {}

    def get(name: str) -> dict:
        if name not in loaded:
            try:
                loaded[name] = loaders[name]()
            except (FileNotFoundError, AssertionError) as error:
                loaded[name] = error
        result = loaded[name]
        if isinstance(result, Exception):
            # Not a skip: a missing CDK template must not pass for a checked one.
            pytest.fail(f"{name} template: {result}", pytrace=False)
        return result

    return get


@pytest.fixture(params=TEMPLATES)
def stack(request, _deployed, contract) -> cfn.Stack:
    """A deployed template (a copy: tests may break it), with the code's contract."""
    return cfn.Stack(request.param, copy.deepcopy(_deployed(request.param)), contract)


@pytest.fixture
def raw(_raw) -> dict:
    """The SAM template as written (a copy: tests may break it)."""
    return copy.deepcopy(_raw)


@pytest.fixture
def sam(_deployed, contract) -> cfn.Stack:
    """The SAM template after the transform (a copy), for SAM-only tests."""
    return cfn.Stack("sam", copy.deepcopy(_deployed("sam")), contract)


@pytest.fixture
def cdk(_deployed, contract) -> cfn.Stack:
    """The CDK app's synthesized template (a copy), for CDK-only tests."""
    return cfn.Stack("cdk", copy.deepcopy(_deployed("cdk")), contract)
