"""`idemgate serve` (a `traceparent` header in, to the upstream) and `idemgate mcp` (the request's
`_meta` in, to the MCP server's `_meta`)."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    CALLER,
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

KEY = "invoice-889-secret"
TOKEN = "trace-test-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exported(receiver: OtlpReceiver, service: str, tool: str, calls: int) -> list[dict[str, Any]]:
    """The spans `service` exported, once its `calls` calls of `tool` have arrived."""
    return of_service(
        receiver.wait_for(
            lambda s: [x["name"] for x in of_service(s, service)].count(f"execute_tool {tool}") == calls
        ),
        service,
    )


def start_gateway(
    binary: Path, tmp_path: Path, env: dict[str, str], upstream: str
) -> tuple[subprocess.Popen[bytes], str]:
    """`idemgate serve` with tenant acme (TOKEN) and the forwarded tool `charge`, once it answers
    /healthz, and its base URL."""
    port = free_port()
    config = tmp_path / "idemgate.toml"
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\nstore = "sqlite://{tmp_path / "r.db"}"\n'
        f'journal = "{tmp_path / "journal"}"\n\n'
        f'[[tenants]]\nid = "acme"\ntoken_sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"\n\n'
        f'[tools.charge]\nupstream = "{upstream}"\n'
    )
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [str(binary), "serve", "--config", str(config)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{base}/healthz", timeout=2)
            return proc, base
        except OSError:
            if proc.poll() is not None or time.monotonic() >= deadline:
                proc.kill()
                proc.wait(timeout=30)
                raise AssertionError(
                    f"the gateway never answered /healthz: {(tmp_path / 'serve.log').read_text()}"
                ) from None
            time.sleep(0.05)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_gateway_forwards_its_effect_span_to_the_upstream(
    receiver: OtlpReceiver, binary: Path, tmp_path: Path, protocol: str
) -> None:
    headers_seen: list[dict[str, str]] = []

    class Upstream(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", "0")))
            headers_seen.append({k.lower(): v for k, v in self.headers.items()})
            body = b'{"charged": true}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    up = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    service = f"serve-{protocol}"
    proc, base = start_gateway(
        binary, tmp_path, door_env(receiver, protocol, service), f"http://127.0.0.1:{up.server_address[1]}/charge"
    )
    try:
        for _ in range(2):
            req = urllib.request.Request(
                f"{base}/v1/tools/charge/call",
                data=b'{"amount": 4242}',
                headers={
                    "content-type": "application/json",
                    "authorization": f"Bearer {TOKEN}",
                    "idempotency-key": KEY,
                    "traceparent": CALLER,
                    "tracestate": "vendor=1",
                },
            )
            with urllib.request.urlopen(req, timeout=30) as res:
                assert res.status == 200
        spans = exported(receiver, service, "charge", 2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        up.shutdown()
    ran = assert_call(spans, "charge", "http", "executed")
    effect = children(spans, ran)["idemgate.effect"]
    assert len(headers_seen) == 1, headers_seen
    assert headers_seen[0]["traceparent"] == f"00-{ran['trace_id']}-{effect['span_id']}-01"
    assert headers_seen[0]["tracestate"] == "vendor=1"
    assert_call(spans, "charge", "http", "replayed")
    assert_secret_absent(spans, KEY, "4242")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_gateway_marks_a_write_refused_for_want_of_a_key(
    receiver: OtlpReceiver, binary: Path, tmp_path: Path, protocol: str
) -> None:
    """A write without an Idempotency-Key, forwarded or coordinated, is refused; its span says
    so as the other doors' refusals do: the verdict, `error.type` and an error status."""
    service = f"serve-keyless-{protocol}"
    # Nothing listens there: a refused call never reaches its upstream.
    proc, base = start_gateway(binary, tmp_path, door_env(receiver, protocol, service), "http://127.0.0.1:9/charge")
    try:
        for path in ("call", "begin"):
            req = urllib.request.Request(
                f"{base}/v1/tools/charge/{path}",
                data=b'{"amount": 4242}',
                headers={
                    "content-type": "application/json",
                    "authorization": f"Bearer {TOKEN}",
                    "traceparent": CALLER,
                },
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=30)
            assert refused.value.code == 400, refused.value.read()
            assert json.loads(refused.value.read())["type"].endswith("/key-required")
        spans = exported(receiver, service, "charge", 2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for call in spans:
        if call["name"] != "execute_tool charge":
            continue
        a = call["attributes"]
        assert a["idemgate.door"] == "http"
        assert a["idemgate.verdict"] == "key_required", a
        assert a["error.type"] == "key_required", a
        assert call["status"] == 2, f"STATUS_CODE_ERROR: {call}"
        assert call["trace_id"] == CALLER_TRACE and call["parent_span_id"] == CALLER_SPAN


def fixture_server(
    receiver: OtlpReceiver, protocol: str, service: str, tmp_path: Path
) -> tuple[Path, Path, dict[str, str]]:
    """The fixture MCP server behind the proxy, the file where it writes each call's `_meta`, and
    the proxy's environment (exporting to `receiver` over `protocol`)."""
    meta_log = tmp_path / "meta.jsonl"
    server = ROOT / "crates" / "idemgate-cli" / "tests" / "fixtures" / "mcp_server.py"
    env = door_env(
        receiver, protocol, service, FIXTURE_LOG=str(tmp_path / "fixture.log"), FIXTURE_META=str(meta_log)
    )
    return server, meta_log, env


def mcp_exchange(proc: subprocess.Popen[str], message: dict[str, Any]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(message) + "\n")
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline()
        assert line, "the proxy closed its output"
        frame = json.loads(line)
        if frame.get("id") == message["id"]:
            return frame


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mcp_proxy_takes_and_hands_on_meta_trace_context(
    receiver: OtlpReceiver, binary: Path, tmp_path: Path, protocol: str
) -> None:
    service = f"mcp-{protocol}"
    server, meta_log, env = fixture_server(receiver, protocol, service, tmp_path)
    proc = subprocess.Popen(
        [str(binary), "--store", f"sqlite://{tmp_path / 'r.db'}", "mcp", "--", sys.executable, str(server)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "mcp.log", "wb"),
        text=True,
    )
    try:
        init = mcp_exchange(
            proc,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "trace-test", "version": "1"},
                },
            },
        )
        assert "result" in init, init
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")  # type: ignore[union-attr]
        for n in range(2):
            answer = mcp_exchange(
                proc,
                {
                    "jsonrpc": "2.0",
                    "id": 10 + n,
                    "method": "tools/call",
                    "params": {
                        "name": "count",
                        "arguments": {"label": "a"},
                        "_meta": {
                            "dev.idemgate/idempotency-key": KEY,
                            "traceparent": CALLER,
                            "tracestate": "vendor=1",
                        },
                    },
                },
            )
            assert "result" in answer, answer
        spans = exported(receiver, service, "count", 2)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    ran = assert_call(spans, "count", "mcp", "executed")
    assert ran["attributes"]["mcp.method.name"] == "tools/call"
    effect = children(spans, ran)["idemgate.effect"]
    metas = [json.loads(line) for line in meta_log.read_text().splitlines()]
    assert len(metas) == 1, metas
    assert metas[0]["traceparent"] == f"00-{ran['trace_id']}-{effect['span_id']}-01"
    assert metas[0]["tracestate"] == "vendor=1"
    assert_call(spans, "count", "mcp", "replayed")
    assert_secret_absent(spans, KEY)


def mcp_post(url: str, message: dict[str, Any], headers: dict[str, str]) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """One Streamable HTTP POST: the JSON-RPC answer (from JSON or an SSE stream) and the headers."""
    req = urllib.request.Request(
        url,
        data=json.dumps(message).encode(),
        headers={
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2025-06-18",
            **headers,
        },
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        got = {k.lower(): v for k, v in res.headers.items()}
        body = res.read().decode()
    if res.status == 202 or not body.strip():
        return None, got
    if got.get("content-type", "").startswith("text/event-stream"):
        for line in body.splitlines():
            if line.startswith("data:"):
                frame = json.loads(line[5:])
                if frame.get("id") == message.get("id"):
                    return frame, got
        raise AssertionError(f"no answer in the stream: {body}")
    return json.loads(body), got


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mcp_http_takes_the_traceparent_header(
    receiver: OtlpReceiver, binary: Path, tmp_path: Path, protocol: str
) -> None:
    service = f"mcp-http-{protocol}"
    server, meta_log, env = fixture_server(receiver, protocol, service, tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [
            str(binary), "--store", f"sqlite://{tmp_path / 'r.db'}", "mcp",
            "--listen", f"127.0.0.1:{port}", "--", sys.executable, str(server),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "mcp.log", "wb"),
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                init, got = mcp_post(
                    url,
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "initialize",
                        "params": {
                            "protocolVersion": "2025-06-18",
                            "capabilities": {},
                            "clientInfo": {"name": "trace-test", "version": "1"},
                        },
                    },
                    {},
                )
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "mcp.log").read_text()
                assert time.monotonic() < deadline, "the proxy never answered"
                time.sleep(0.05)
        session = {"mcp-session-id": got["mcp-session-id"]}
        mcp_post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        answer, _ = mcp_post(
            url,
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "count", "arguments": {"label": "h"}}},
            {**session, "idempotency-key": KEY, "traceparent": CALLER},
        )
        assert answer is not None and "result" in answer, answer
        spans = exported(receiver, service, "count", 1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ran = assert_call(spans, "count", "mcp", "executed")
    effect = children(spans, ran)["idemgate.effect"]
    metas = [json.loads(line) for line in meta_log.read_text().splitlines()]
    assert [m.get("traceparent") for m in metas] == [f"00-{ran['trace_id']}-{effect['span_id']}-01"]
    assert_secret_absent(spans, KEY)
