"""Fixtures for the trace tests: a real OTLP receiver (gRPC and HTTP/protobuf) and what every door
needs to run against it: the `idemgate` binary, the Python package in this interpreter, Node 22 and
the Node package.

Each door runs in a process of its own, pointed at the receiver by the standard OTEL_* variables,
as an operator would configure it; the tests then read what arrived.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = ["grpc", "http/protobuf"]

# A caller's span: every door is given this context and must make its call's span a child of it.
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


@pytest.fixture(scope="session")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="session")
def binary() -> Path:
    path = Path(os.environ.get("IDEMGATE_BIN", ROOT / "target" / "debug" / "idemgate"))
    if not path.exists():
        pytest.fail(f"no idemgate binary at {path}: run `cargo build -p idemgate-cli` or set IDEMGATE_BIN")
    return path


@pytest.fixture(scope="session")
def node() -> Path:
    found = os.environ.get("IDEMGATE_TEST_NODE") or shutil.which("node")
    if not found:
        pytest.fail("no Node: set IDEMGATE_TEST_NODE (scripts/test-traces does)")
    return Path(found)


def door_env(receiver: OtlpReceiver, protocol: str, service: str, **extra: str) -> dict[str, str]:
    """The environment of a door process that exports to `receiver` over `protocol`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACE"))}
    env.update(receiver.env(protocol))
    env["OTEL_SERVICE_NAME"] = service
    env.update(extra)
    return env


def of_service(spans: list[dict[str, Any]], service: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["resource"].get("service.name") == service]


def one(spans: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    """The one span whose fields (and `attributes` members) match."""
    attrs = match.pop("attributes", {})
    found = [
        s
        for s in spans
        if all(s[k] == v for k, v in match.items())
        and all(s["attributes"].get(k) == v for k, v in attrs.items())
    ]
    assert len(found) == 1, f"{len(found)} spans match {match} {attrs}: {[x['name'] for x in spans]}"
    return found[0]


def children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The children of `parent`, by name."""
    return {s["name"]: s for s in spans if s["parent_span_id"] == parent["span_id"]}


def assert_call(
    spans: list[dict[str, Any]],
    tool: str,
    door: str,
    verdict: str,
    parent: str | None = CALLER_SPAN,
) -> dict[str, Any]:
    """The span of the one call of `tool` with `verdict`: the GenAI attributes, a child of
    `parent` in the caller's trace (when there is one), its phases in the same trace, and the
    attributes every call carries; returns it."""
    call = one(spans, name=f"execute_tool {tool}", attributes={"idemgate.verdict": verdict})
    a = call["attributes"]
    assert a["gen_ai.operation.name"] == "execute_tool"
    assert a["gen_ai.tool.name"] == tool
    assert a["idemgate.door"] == door
    if parent is not None:
        assert call["trace_id"] == CALLER_TRACE
        assert call["parent_span_id"] == parent
    assert len(a["idemgate.key_hash"]) == 12
    kids = children(spans, call)
    assert "idemgate.reserve" in kids, kids.keys()
    for kid in kids.values():
        assert kid["trace_id"] == call["trace_id"]
        assert call["start"] <= kid["start"] <= kid["end"] <= call["end"]
    return call


def assert_secret_absent(spans: list[dict[str, Any]], *secrets: str) -> None:
    """No attribute of any span holds a key or an argument in clear."""
    for s in spans:
        for k, v in {**s["attributes"], **s["resource"]}.items():
            for secret in secrets:
                assert secret not in str(v), f"{secret!r} in {s['name']} {k}={v!r}"
