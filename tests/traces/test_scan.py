"""`idemgate scan` on traces a real framework made: Pydantic AI agents (scan_agents.py) driven by
scripted models into each retry source, traced by Pydantic AI's own OpenTelemetry instrumentation,
exported over OTLP/HTTP by the OpenTelemetry SDK to the receiver, which writes them to files as
the collector's file exporter does (JSON lines and protobuf frames). The scan must find every
planted duplicate, and flag no distinct action.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, door_env
from otlp_receiver import OtlpReceiver

SERVICE = "scan-agents"
# conversation -> (tool, source) of the one duplicate planted in it; conv-other plants none.
PLANTED = {
    ("conv-reemit", "charge_card", "model_re_emission", "call_a3"),
    ("conv-callid", "refund", "framework_retry", "call_b1"),
    ("conv-timeout", "send_invoice", "client_timeout", "call_d2"),
    ("conv-replan", "send_email", "re_plan", "call_c2"),
}


@pytest.fixture(scope="module")
def traces(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The agents' traces as the receiver wrote them: (JSON lines, protobuf frames)."""
    python = Path(
        os.environ.get("IDEMGATE_SCAN_AGENTS_PYTHON", ROOT / "target" / "scan-agents-venv" / "bin" / "python")
    )
    if not python.exists():
        pytest.fail(f"no {python}: run scripts/test-traces (it makes the scan-agents venv)")
    out = tmp_path_factory.mktemp("scan")
    jsonl, frames = out / "traces.jsonl", out / "traces.pb"
    receiver.record(SERVICE, jsonl, frames)
    env = door_env(receiver, "http/protobuf", SERVICE)
    # Spans are exported as each ends (a simple processor): when the program exits, the
    # receiver has answered every export, and written it.
    subprocess.run(
        [str(python), str(Path(__file__).with_name("scan_agents.py"))],
        env=env,
        check=True,
        timeout=120,
    )
    return jsonl, frames


def scan(binary: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [str(binary), "--json", "scan", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def found(report: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    return {
        (d["group"]["id"], d["tool"], d["source"], d["duplicate"]["call_id"])
        for d in report["duplicates"]
    }


def test_scan_finds_every_planted_duplicate_and_no_distinct_action(
    binary: Path, traces: tuple[Path, Path]
) -> None:
    jsonl, frames = traces
    code, report = scan(binary, "--read", "get_balance", str(jsonl))
    assert code == 1
    assert found(report) == PLANTED, json.dumps(report["duplicates"], indent=1)
    assert report["caught"] == [] and report["skipped"] == []
    by_source = {d["source"]: d for d in report["duplicates"]}
    # The re-emission followed the first charge in the same run: within the gate's window.
    assert by_source["model_re_emission"]["confidence"] == "high"
    assert by_source["model_re_emission"]["first"]["call_id"] == "call_a1"
    # The first invoice was cancelled by the caller's timeout, after 0.5 s.
    timeout = by_source["client_timeout"]
    assert timeout["first"]["call_id"] == "call_d1" and timeout["first"]["error"]
    assert 400 <= timeout["gap_ms"] < 10_000
    # Without identity fields, a re-plan rests on the free-text heuristic.
    assert by_source["re_plan"]["confidence"] == "low"
    assert "reworded body" in by_source["re_plan"]["why"]
    # The reads, told apart by --read, are listed apart.
    reads = report["repeated_reads"]
    assert [(r["group"]["id"], r["tool"], len(r["calls"])) for r in reads] == [
        ("conv-reemit", "get_balance", 2)
    ]

    # The collector's protobuf frames say the same.
    code, from_frames = scan(binary, "--read", "get_balance", str(frames))
    assert code == 1 and found(from_frames) == PLANTED


def test_reads_by_the_gates_config_identity_fields_and_the_page(
    binary: Path, traces: tuple[Path, Path], tmp_path: Path
) -> None:
    jsonl, _ = traces
    # Without a rule that says so, a repeated read is a repeated write: the gate's default.
    _, report = scan(binary, str(jsonl))
    assert ("conv-reemit", "get_balance", "model_re_emission", "call_a2") in found(report)

    # The proxy's configuration tells reads apart as the proxy would.
    config = tmp_path / "mcp.toml"
    config.write_text('[tools.get_balance]\nkind = "read"\n')
    page = tmp_path / "scan.html"
    _, report = scan(
        binary, "--config", str(config), "--identity", "send_email=to,subject", "--html", str(page), str(jsonl)
    )
    assert found(report) == PLANTED
    replan = next(d for d in report["duplicates"] if d["source"] == "re_plan")
    assert replan["confidence"] == "medium"
    assert replan["why"].startswith("the same to, subject, under call id call_c2 after call_c1")

    html = page.read_text()
    assert html.count('<tr class="dup">') == len(PLANTED)
    assert "<script" not in html

    # A window shorter than the gap between the invoices (the caller waited 0.5 s) leaves the
    # client timeout out; a call id sent twice needs no window.
    _, report = scan(binary, "--read", "get_balance", "--window", "300ms", str(jsonl))
    sources = {f[2] for f in found(report)}
    assert "client_timeout" not in sources and "framework_retry" in sources, sources


def test_the_readable_report(binary: Path, traces: tuple[Path, Path]) -> None:
    jsonl, _ = traces
    done = subprocess.run(
        [str(binary), "scan", "--read", "get_balance", str(jsonl)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("4 likely duplicate side effects in 4 conversations"), lines[0]
    header = lines[2].split()
    assert header[:3] == ["TOOL", "CONVERSATION", "FIRST"]
    assert any("send_invoice" in l and "client timeout" in l and "high" in l for l in lines)
    assert "  get_balance in conversation conv-reemit: 2 calls" in lines
