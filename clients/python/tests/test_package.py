"""The package's metadata: its version has one source (the Cargo workspace), its extras admit the
framework versions the tests pin, and its literal types are exactly what the engine accepts."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path
from typing import Any, get_args

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import idemgate
from idemgate import OnUnknown, Policy, RecordState, Resolution, ToolKind

PACKAGE = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((PACKAGE / "pyproject.toml").read_text())


def test_the_version_is_the_cargo_workspaces():
    workspace = tomllib.loads((PACKAGE.parents[1] / "Cargo.toml").read_text())
    cargo = workspace["workspace"]["package"]["version"]
    assert idemgate.__version__ == cargo
    assert importlib.metadata.version("idemgate") == cargo
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert "version" not in PYPROJECT["project"]


def test_the_license_is_an_spdx_expression():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"


def _pins(group: str) -> dict[str, Requirement]:
    groups: dict[str, list[Any]] = PYPROJECT["dependency-groups"]
    pins: dict[str, Requirement] = {}
    for item in groups[group]:
        if isinstance(item, dict):
            pins |= _pins(item["include-group"])
        else:
            req = Requirement(item)
            assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", item
            pins[canonicalize_name(req.name)] = req
    return pins


def test_every_extra_admits_the_versions_the_tests_pin():
    pinned = _pins("test") | _pins("test-crewai")
    extras: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras) == {"langgraph", "langchain", "openai-agents", "pydantic-ai", "fastmcp", "crewai"}
    for extra, requirements in extras.items():
        for text in requirements:
            req = Requirement(text)
            pin = pinned.get(canonicalize_name(req.name))
            assert pin is not None, f"[{extra}] {text}: no test group pins {req.name}"
            version = next(iter(pin.specifier)).version
            assert req.specifier.contains(version), f"[{extra}] {text} refuses the tested {version}"
            assert any(s.operator in ("<", "<=", "~=") for s in req.specifier), f"[{extra}] {text}"


@pytest.mark.parametrize("kind", get_args(ToolKind))
def test_every_tool_kind_of_the_type_is_one_the_engine_takes(kind: ToolKind):
    assert Policy(kind=kind).kind == kind


@pytest.mark.parametrize("on_unknown", get_args(OnUnknown))
def test_every_on_unknown_of_the_type_is_one_the_engine_takes(on_unknown: OnUnknown):
    assert Policy(on_unknown=on_unknown).on_unknown == on_unknown


def test_the_engine_refuses_what_the_types_leave_out():
    with pytest.raises(ValueError):
        Policy(kind="delete")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Policy(on_unknown="shrug")  # type: ignore[arg-type]


def test_the_record_states_and_resolutions_of_the_types_are_the_engines(tmp_path: Path):
    engine = idemgate.Engine.open(f"sqlite:///{tmp_path / 'idemgate.db'}")
    try:
        for state in get_args(RecordState):
            assert engine.records(state) == []
        with pytest.raises(ValueError):
            engine.records("lost")  # type: ignore[arg-type]
        for resolution in get_args(Resolution):  # taken: no such record
            with pytest.raises(idemgate.NotFound):
                engine.resolve("t", "k", 1, resolution, None if resolution == "release" else 1)
        with pytest.raises(ValueError):
            engine.resolve("t", "k", 1, "forget")  # type: ignore[arg-type]
    finally:
        engine.close()
