"""Shared fixtures: the template (as written and after the SAM transform) and the code's contract."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import template_checks  # noqa: E402


@pytest.fixture(scope="session")
def _raw() -> dict:
    return template_checks.load()


@pytest.fixture(scope="session")
def _transformed(_raw) -> dict:
    return template_checks.transform(_raw)


@pytest.fixture
def raw(_raw) -> dict:
    """The template as written (a copy: tests may break it)."""
    return copy.deepcopy(_raw)


@pytest.fixture
def transformed(_transformed) -> dict:
    """The template after the SAM transform (a copy: tests may break it)."""
    return copy.deepcopy(_transformed)


@pytest.fixture(scope="session")
def contract() -> dict:
    """`cargo run -q -p twopc --example contract`: the code's tables and function environment."""
    return template_checks.contract()
