"""Imports the frameworks the integration tests drive, or fails loudly."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest


def require(module: str) -> ModuleType:
    """Imports a framework, or fails loudly (never skips) naming the script that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(
            f"{module} is not installed: run scripts/python-test-deps ({e})", pytrace=False
        )
