"""CrewAI's tests run in a venv of their own (``target/python-venv-crewai``, with crewai pinned in
the ``test-crewai`` dependency group of clients/python/pyproject.toml, installed by
``scripts/python-test-deps VENV test-crewai``): crewai
needs openai<3 and mcp<2, which the shared test venv's openai-agents and fastmcp cannot live with.
The shared run does not collect this folder (``collect_ignore`` in the conftest above);
``scripts/test-all`` runs it on its own, where a missing crewai fails every test.

CrewAI is kept off the network: no telemetry, no traces, no version check (it reads these when it
is imported)."""

from __future__ import annotations

import os

for name, value in {
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
}.items():
    os.environ[name] = value


def pytest_configure(config: object) -> None:
    # CrewAI's own deprecations (of its own fields, as it reads them), not the tests'.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:crewai")  # type: ignore[attr-defined]
