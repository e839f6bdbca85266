"""The integrations' tests use the real frameworks from PyPI, at the versions pinned in the `test`
dependency group of clients/python/pyproject.toml (installed by scripts/python-test-deps); a
missing one fails the module."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from idemgate import Engine, Policy

# CrewAI's tests need a venv of their own (crewai needs openai<3, openai-agents here openai>=3):
# scripts/test-all runs them there, as `pytest clients/python/tests/integrations/crewai`.
collect_ignore = ["crewai"]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """A fresh engine on a temporary SQLite file (the store the command line uses)."""
    yield Engine.open(
        f"sqlite://{tmp_path / 'idemgate.db'}",
        journal=str(tmp_path / "journal"),
        default=Policy(wait=30),
    )
