"""`idemgate exec`: the caller's trace comes in as TRACEPARENT, the command gets idemgate.effect's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import CALLER, PROTOCOLS, assert_call, assert_secret_absent, children, door_env, of_service
from otlp_receiver import OtlpReceiver

KEY = "order-7731-secret"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_exec_runs_once_and_replays_in_the_callers_trace(
    receiver: OtlpReceiver, binary: Path, tmp_path: Path, protocol: str
) -> None:
    service = f"exec-{protocol}"
    env = door_env(receiver, protocol, service, TRACEPARENT=CALLER, TRACESTATE="vendor=1")
    seen = tmp_path / "traceparent"
    argv = [
        str(binary), "--store", f"sqlite://{tmp_path / 'records.db'}", "exec",
        "--tool", "charge", "--key", KEY, "--",
        "sh", "-c", f'echo "$TRACEPARENT $TRACESTATE" >> {seen}; echo charged-4242',
    ]
    for _ in range(2):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "charged-4242" in done.stdout

    def both(spans: list) -> bool:
        names = [s["name"] for s in of_service(spans, service)]
        return names.count("execute_tool charge") == 2

    spans = of_service(receiver.wait_for(both), service)
    assert {s["via"] for s in spans} == {protocol}

    ran = assert_call(spans, "charge", "exec", "executed")
    assert ran["attributes"]["idemgate.rule"] == "explicit"
    assert ran["attributes"]["idemgate.recording"] == "stored"
    phases = children(spans, ran)
    assert phases["idemgate.reserve"]["attributes"]["idemgate.decision"] == "execute"
    assert phases["idemgate.complete"]["attributes"]["idemgate.recording"] == "stored"
    effect = phases["idemgate.effect"]
    assert phases["idemgate.reserve"]["end"] <= effect["start"] <= effect["end"]
    assert effect["end"] <= phases["idemgate.complete"]["start"]
    # The command ran once, inside idemgate.effect: its TRACEPARENT names that span.
    lines = seen.read_text().split("\n")
    assert lines[1:] == [""], lines
    parent, state = lines[0].split(" ")
    assert parent == f"00-{ran['trace_id']}-{effect['span_id']}-01"
    assert state == "vendor=1"

    replay = assert_call(spans, "charge", "exec", "replayed")
    assert replay["attributes"]["idemgate.executed_at"] == ran["attributes"]["idemgate.executed_at"]
    assert replay["attributes"]["idemgate.key_hash"] == ran["attributes"]["idemgate.key_hash"]
    reserve = children(spans, replay)["idemgate.reserve"]
    assert reserve["attributes"]["idemgate.decision"] == "replayed"
    assert "idemgate.replay" in children(spans, reserve)
    assert "idemgate.effect" not in children(spans, replay)

    assert_secret_absent(spans, KEY, "charged-4242")


def test_no_endpoint_means_no_export_and_the_callers_context_passes_through(
    receiver: OtlpReceiver, binary: Path, tmp_path: Path
) -> None:
    env = door_env(receiver, "grpc", "exec-off", TRACEPARENT=CALLER)
    for name in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"]:
        del env[name]
    argv = [
        str(binary), "--store", f"sqlite://{tmp_path / 'records.db'}", "exec",
        "--tool", "charge", "--key", "k-off", "--", "sh", "-c", 'echo "$TRACEPARENT"',
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == CALLER


def test_an_unsupported_protocol_is_refused_by_name(
    receiver: OtlpReceiver, binary: Path, tmp_path: Path
) -> None:
    env = door_env(receiver, "grpc", "exec-json", OTEL_EXPORTER_OTLP_PROTOCOL="http/json")
    argv = [
        str(binary), "--store", f"sqlite://{tmp_path / 'records.db'}", "exec",
        "--tool", "charge", "--key", "k-json", "--", "sh", "-c", f"touch {tmp_path / 'ran'}",
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=http/json" in done.stderr
    assert not (tmp_path / "ran").exists()
