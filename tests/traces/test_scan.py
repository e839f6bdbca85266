"""`idemgate scan` on traces real frameworks made: Pydantic AI, OpenAI Agents SDK and LangGraph
agents (scan_agents.py) driven by scripted models into each retry source, traced by their OpenTelemetry
instrumentations, exported over OTLP/HTTP by the OpenTelemetry SDK to the receiver, which writes
them to files as the collector's file exporter does (JSON lines and protobuf frames). The scan must
find every planted duplicate, and flag no distinct action.
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

# (conversation, tool, source, call id) of the one duplicate planted in each conversation of the
# Pydantic AI agents; conv-other plants none.
PLANTED = {
    ("conv-reemit", "charge_card", "model_re_emission", "call_a3"),
    ("conv-callid", "refund", "framework_retry", "call_b1"),
    ("conv-timeout", "send_invoice", "client_timeout", "call_d2"),
    ("conv-replan", "send_email", "re_plan", "call_c2"),
}
# LangGraph's: its retries are resumptions of the thread, which run a call again under its id.
PLANTED_LANGGRAPH = PLANTED - {
    ("conv-timeout", "send_invoice", "client_timeout", "call_d2")
} | {("conv-timeout", "send_invoice", "client_timeout", "call_d1")}


def agent_traces(receiver: OtlpReceiver, out: Path, framework: str) -> tuple[Path, Path]:
    """The traces of scan_agents.py's `framework` agents as the receiver wrote them:
    (JSON lines, protobuf frames)."""
    python = Path(
        os.environ.get("IDEMGATE_SCAN_AGENTS_PYTHON", ROOT / "target" / "scan-agents-venv" / "bin" / "python")
    )
    if not python.exists():
        pytest.fail(f"no {python}: run scripts/test-traces (it makes the scan-agents venv)")
    service = f"scan-{framework}"
    jsonl, frames = out / f"{framework}.jsonl", out / f"{framework}.pb"
    receiver.record(service, jsonl, frames)
    env = door_env(receiver, "http/protobuf", service)
    # Spans are exported as each ends (a simple processor): when the program exits, the
    # receiver has answered every export, and written it.
    subprocess.run(
        [str(python), str(Path(__file__).with_name("scan_agents.py")), framework],
        env=env,
        check=True,
        timeout=120,
    )
    return jsonl, frames


@pytest.fixture(scope="module")
def traces(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The Pydantic AI agents' traces."""
    return agent_traces(receiver, tmp_path_factory.mktemp("scan"), "pydantic-ai")


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
    # ... and names send_email's action by its identity fields, as the gate would.
    config.write_text('[tools.get_balance]\nkind = "read"\n[tools.send_email]\nidentity = ["to", "subject"]\n')
    page = tmp_path / "scan.html"
    _, report = scan(binary, "--config", str(config), "--html", str(page), str(jsonl))
    assert found(report) == PLANTED
    replan = next(d for d in report["duplicates"] if d["source"] == "re_plan")
    assert replan["confidence"] == "medium"
    assert replan["why"].startswith("the same to, subject, under call id call_c2 after call_c1")
    # The command line's identity fields say the same.
    _, report = scan(binary, "--read", "get_balance", "--identity", "send_email=to,/subject", str(jsonl))
    replan = next(d for d in report["duplicates"] if d["source"] == "re_plan")
    assert replan["confidence"] == "medium", replan

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


def test_openai_agents_sdk_traces_without_conversations_or_call_ids(
    receiver: OtlpReceiver, binary: Path, tmp_path: Path
) -> None:
    """The OpenAI Agents SDK's OpenTelemetry instrumentation records no conversation and no
    call id: the calls are compared within their trace (the SDK's `trace()` holds a
    conversation's runs), and the invoice given up on ends without a result rather than with an
    error."""
    jsonl, frames = agent_traces(receiver, tmp_path, "openai-agents")
    for path in (jsonl, frames):
        code, report = scan(binary, "--read", "get_balance", str(path))
        assert code == 1
        got = {(d["tool"], d["source"], d["group"]["kind"]) for d in report["duplicates"]}
        assert got == {
            ("charge_card", "model_re_emission", "trace"),
            ("send_invoice", "client_timeout", "trace"),
            ("send_email", "re_plan", "trace"),
        }, json.dumps(report["duplicates"], indent=1)
        assert len(report["duplicates"]) == 3
        timeout = next(d for d in report["duplicates"] if d["source"] == "client_timeout")
        assert timeout["confidence"] == "medium" and "ended with no result" in timeout["why"]
        assert report["writes_without_arguments"] == 0
        assert [(r["tool"], len(r["calls"])) for r in report["repeated_reads"]] == [("get_balance", 2)]


def test_langgraph_traces_resumed_threads_run_calls_again_under_their_ids(
    receiver: OtlpReceiver, binary: Path, tmp_path: Path
) -> None:
    """LangGraph under OpenLLMetry's LangChain instrumentation: the conversation is the thread,
    the arguments and the call id ride in the callback's envelope, and a resumed thread runs a
    call again under its own id: after a failed node (a framework retry) and after the caller
    cancelled the run (a client timeout)."""
    jsonl, frames = agent_traces(receiver, tmp_path, "langgraph")
    for path in (jsonl, frames):
        code, report = scan(binary, "--read", "get_balance", str(path))
        assert code == 1
        assert found(report) == PLANTED_LANGGRAPH, json.dumps(report["duplicates"], indent=1)
        timeout = next(d for d in report["duplicates"] if d["source"] == "client_timeout")
        assert "the framework ran the call again" in timeout["why"], timeout["why"]
        assert "CancelledError" in timeout["first"]["error"], timeout["first"]
        # The read that failed the node ran again with it: listed apart, as reads are.
        reads = sorted((r["group"]["id"], r["tool"], len(r["calls"])) for r in report["repeated_reads"])
        assert reads == [("conv-callid", "get_balance", 2), ("conv-reemit", "get_balance", 2)], reads
