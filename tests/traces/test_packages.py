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
inside = []

def current_span_id():
    return format(trace.get_current_span().get_span_context().span_id, "016x")

@idempotent(engine, "refund", key=lambda amount: {KEY!r})
def refund(amount):
    ran.append(amount)
    inside.append(current_span_id())
    return {{"refunded": amount}}

caller = NonRecordingSpan(SpanContext(
    trace_id=0x{CALLER_TRACE}, span_id=0x{CALLER_SPAN}, is_remote=True, trace_flags=TraceFlags(1)))
with trace.use_span(caller):
    refund(7070)
    refund(7070)
    # Engine.call, in the same current span.
    engine.call("note", "note-1", {{"n": 1}}, lambda: "ok", call_id="call_4711")
print(json.dumps({{"ran": ran, "inside": inside}}))
"""

NODE_DOOR = f"""
const {{ AsyncLocalStorageContextManager }} = require('@opentelemetry/context-async-hooks');
const api = require('@opentelemetry/api');
const {{ Engine, idempotent }} = require({str(ROOT / 'clients' / 'node' / 'index.cjs')!r});

api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
(async () => {{
  const engine = await Engine.open(process.argv[2]);
  const ran = [];
  const inside = [];
  const refund = idempotent(engine, 'refund', async (amount) => {{
    ran.push(amount);
    inside.push(api.trace.getActiveSpan()?.spanContext().spanId);
    return {{ refunded: amount }};
  }}, {{ key: () => {KEY!r} }});
  const caller = api.trace.wrapSpanContext({{
    traceId: '{CALLER_TRACE}', spanId: '{CALLER_SPAN}', traceFlags: 1, isRemote: true }});
  await api.context.with(api.trace.setSpan(api.context.active(), caller), async () => {{
    await refund(7070);
    await refund(7070);
    await engine.call('note', 'note-1', {{ n: 1 }}, async () => 'ok', {{ callId: 'call_4711' }});
  }});
  console.log(JSON.stringify({{ ran, inside }}));
}})().catch((e) => {{ console.error(e); process.exit(1); }});
"""


def calls(spans: list, service: str) -> int:
    return len([s for s in of_service(spans, service) if s["name"].startswith("execute_tool")])


def run_door(receiver: OtlpReceiver, protocol: str, door: str, argv: list[str], **env: str) -> None:
    """Runs a package's door script exporting over `protocol`, then checks what arrived."""
    service = f"{door}-{protocol}"
    done = subprocess.run(
        argv,
        env=door_env(receiver, protocol, service, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    spans = of_service(receiver.wait_for(lambda s: calls(s, service) == 3), service)
    check(spans, door, out)


def check(spans: list, door: str, out: dict) -> None:
    assert out["ran"] == [7070]
    ran = assert_call(spans, "refund", door, "executed")
    phases = children(spans, ran)
    assert set(phases) >= {"idemgate.reserve", "idemgate.effect", "idemgate.complete"}, phases.keys()
    assert phases["idemgate.effect"]["end"] <= phases["idemgate.complete"]["start"]
    # While the function ran, idemgate.effect was the current span: its own spans are children.
    assert out["inside"] == [phases["idemgate.effect"]["span_id"]]
    assert_call(spans, "refund", door, "replayed")
    note = assert_call(spans, "note", door, "executed")
    assert note["attributes"]["gen_ai.tool.call.id"] == "call_4711"
    assert_secret_absent(spans, KEY, "7070")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_python_package(receiver: OtlpReceiver, tmp_path: Path, protocol: str) -> None:
    python = os.environ.get("IDEMGATE_TEST_PYTHON")
    if not python:
        pytest.fail("set IDEMGATE_TEST_PYTHON to a Python with the idemgate package (scripts/test-traces does)")
    argv = [python, "-c", PYTHON_DOOR, f"sqlite://{tmp_path / 'r.db'}"]
    run_door(receiver, protocol, "python", argv)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_node_package(receiver: OtlpReceiver, node: Path, tmp_path: Path, protocol: str) -> None:
    script = tmp_path / "door.cjs"
    script.write_text(NODE_DOOR)
    argv = [str(node), str(script), f"sqlite://{tmp_path / 'r.db'}"]
    run_door(receiver, protocol, "node", argv, NODE_PATH=str(ROOT / "clients" / "node" / "node_modules"))
