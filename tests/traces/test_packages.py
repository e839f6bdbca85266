"""The Python and Node packages, in-process: the caller's current OpenTelemetry span is the parent
of the call's span (no context given explicitly), and the function's ticket names idemgate.effect."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import (
    CALLER_SPAN,
    CALLER_TRACE,
    PROTOCOLS,
    ROOT,
    assert_call,
    assert_secret_absent,
    children,
    door_env,
    of_service,
)
from otlp_receiver import OtlpReceiver

KEY = "refund-5150-secret"

PYTHON_DOOR = f"""
import json, sys
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from idemgate import Engine, idempotent

engine = Engine.open(sys.argv[1])
ran = []

@idempotent(engine, "refund", key=lambda amount: {KEY!r})
def refund(amount):
    ran.append(amount)
    return {{"refunded": amount}}

caller = NonRecordingSpan(SpanContext(
    trace_id=0x{CALLER_TRACE}, span_id=0x{CALLER_SPAN}, is_remote=True, trace_flags=TraceFlags(1)))
with trace.use_span(caller):
    refund(7070)
    refund(7070)
    # Engine.call, in the same current span.
    seen = []
    engine.call("note", "note-1", {{"n": 1}}, lambda: seen.append(1) or "ok")
print(json.dumps({{"ran": ran}}))
"""

NODE_DOOR = f"""
const {{ AsyncHooksContextManager }} = require('@opentelemetry/context-async-hooks');
const api = require('@opentelemetry/api');
const {{ Engine, idempotent }} = require({str(ROOT / 'clients' / 'node' / 'index.cjs')!r});

api.context.setGlobalContextManager(new AsyncHooksContextManager().enable());
(async () => {{
  const engine = await Engine.open(process.argv[2]);
  const ran = [];
  const refund = idempotent(engine, 'refund', async (amount) => {{ ran.push(amount); return {{ refunded: amount }}; }},
    {{ key: () => {KEY!r} }});
  const caller = api.trace.wrapSpanContext({{
    traceId: '{CALLER_TRACE}', spanId: '{CALLER_SPAN}', traceFlags: 1, isRemote: true }});
  await api.context.with(api.trace.setSpan(api.context.active(), caller), async () => {{
    await refund(7070);
    await refund(7070);
  }});
  console.log(JSON.stringify({{ ran }}));
}})().catch((e) => {{ console.error(e); process.exit(1); }});
"""


def check(spans: list, door: str) -> None:
    ran = assert_call(spans, "refund", door, "executed")
    phases = children(spans, ran)
    assert set(phases) >= {"idemgate.reserve", "idemgate.effect", "idemgate.complete"}, phases.keys()
    assert phases["idemgate.effect"]["end"] <= phases["idemgate.complete"]["start"]
    assert_call(spans, "refund", door, "replayed")
    assert_secret_absent(spans, KEY, "7070")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_python_package(receiver: OtlpReceiver, tmp_path: Path, protocol: str) -> None:
    python = os.environ.get("IDEMGATE_TEST_PYTHON")
    if not python:
        pytest.fail("set IDEMGATE_TEST_PYTHON to a Python with the idemgate package (scripts/test-traces does)")
    service = f"python-{protocol}"
    done = subprocess.run(
        [python, "-c", PYTHON_DOOR, f"sqlite://{tmp_path / 'r.db'}"],
        env=door_env(receiver, protocol, service),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"ran": [7070]}
    spans = of_service(
        receiver.wait_for(lambda s: len([x for x in of_service(s, service) if x["name"].startswith("execute_tool")]) == 3),
        service,
    )
    check(spans, "python")
    # Engine.call (not the decorator) in the same current span: the same trace.
    note = assert_call(spans, "note", "python", "executed")
    assert note["trace_id"] == CALLER_TRACE


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_node_package(receiver: OtlpReceiver, node: Path, tmp_path: Path, protocol: str) -> None:
    service = f"node-{protocol}"
    script = tmp_path / "door.cjs"
    script.write_text(NODE_DOOR)
    env = door_env(receiver, protocol, service, NODE_PATH=str(ROOT / "clients" / "node" / "node_modules"))
    done = subprocess.run(
        [str(node), str(script), f"sqlite://{tmp_path / 'r.db'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"ran": [7070]}
    spans = of_service(
        receiver.wait_for(lambda s: len([x for x in of_service(s, service) if x["name"] == "execute_tool refund"]) == 2),
        service,
    )
    check(spans, "node")
