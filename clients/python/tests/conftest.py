"""Fixtures: a real `idemgate serve` on a temp SQLite store, and a tiny upstream HTTP server.

The binary is ``$IDEMGATE_BIN``, default ``../../target/debug/idemgate`` relative to this package
(build it with ``cargo build -p idemgate-cli``).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

PACKAGE = Path(__file__).resolve().parent.parent

# The installed package (`pip install ./clients/python`, as scripts/test-all does): its native
# module is built by maturin, so the source folder alone does not import.
from idemgate import Client  # noqa: E402

TOKENS = {"acme": "acme-token-0123456789", "globex": "globex-token-9876543210"}


def idemgate_bin() -> Path:
    env = os.environ.get("IDEMGATE_BIN")
    path = Path(env) if env else PACKAGE / ".." / ".." / "target" / "debug" / "idemgate"
    return path.resolve()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the upstream ----------------------------------------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Upstream:
    """Counts the calls it gets, per path and per downstream Idempotency-Key."""

    port: int = 0
    calls: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self, path: str | None = None, key: str | None = None) -> int:
        with self.lock:
            return sum(
                1
                for c in self.calls
                if (path is None or c.path == path)
                and (key is None or c.headers.get("idempotency-key") == key)
            )

    def seen(self, path: str) -> list[Seen]:
        with self.lock:
            return [c for c in self.calls if c.path == path]

    def by_key(self, path: str) -> Counter[str | None]:
        with self.lock:
            return Counter(c.headers.get("idempotency-key") for c in self.calls if c.path == path)


def _handler(upstream: Upstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _answer(self, status: int, doc: Any) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            headers = {k.lower(): v for k, v in self.headers.items()}
            with upstream.lock:
                upstream.calls.append(Seen(self.path, headers, body))
                n = sum(1 for c in upstream.calls if c.path == self.path)
            key = headers.get("idempotency-key")
            if self.path == "/charge":
                self._answer(200, {"charged": body, "n": n, "downstream_key": key})
            elif self.path == "/decline":
                self._answer(422, {"error": "card declined", "n": n})
            elif self.path == "/boom":
                self._answer(500, {"error": "exploded after charging, maybe"})
            elif self.path == "/lookup":
                self._answer(200, {"found": body, "n": n, "downstream_key": key})
            elif self.path == "/slow":
                time.sleep(1.0)
                self._answer(200, {"slow": body, "n": n})
            else:
                self._answer(404, {"error": "no such path"})

    return Handler


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(up))
    server.daemon_threads = True
    up.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield up
    server.shutdown()
    server.server_close()


# ---- the gateway -----------------------------------------------------------------------------


@dataclass
class Gateway:
    url: str
    bin: Path
    store: str
    log: Path
    proc: subprocess.Popen[bytes]

    def client(self, tenant: str = "acme", token: str | None = None, timeout: float = 30) -> Client:
        return Client(self.url, token if token is not None else TOKENS[tenant], timeout=timeout)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


CONFIG = """\
[server]
listen = "127.0.0.1:{port}"
store = "sqlite://{db}"
journal = "{journal}"
request_timeout = "30s"

[[tenants]]
id = "acme"
token_sha256 = "{acme}"

[[tenants]]
id = "globex"
token_sha256 = "{globex}"

[tools.charge]
upstream = "{up}/charge"
lease = "3s"
wait = "2s"

[tools.decline]
upstream = "{up}/decline"
lease = "3s"
wait = "1s"

[tools.boom]
upstream = "{up}/boom"
lease = "3s"
wait = "1s"

[tools.slow_charge]
upstream = "{up}/slow"
lease = "5s"
wait = "3s"

[tools.lookup]
kind = "read"
upstream = "{up}/lookup"

[tools.invoice]
lease = "10s"
wait = "300ms"

[tools.short_lease]
lease = "1s"
wait = "300ms"

[tools.mail]
lease = "10s"
wait = "300ms"

[tools.short_ttl]
ttl = "300ms"
lease = "3s"
wait = "300ms"
"""


def write_config(path: Path, port: int, db: Path, upstream: Upstream) -> None:
    sha = {t: hashlib.sha256(tok.encode()).hexdigest() for t, tok in TOKENS.items()}
    path.write_text(
        CONFIG.format(
            port=port,
            db=db,
            journal=db.with_suffix(".journal"),
            up=upstream.base,
            acme=sha["acme"],
            globex=sha["globex"],
        )
    )


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"idemgate serve exited with {proc.returncode}:\n{log.read_text(errors='replace')}"
            )
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"idemgate serve did not answer /healthz:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[Gateway]:
    binary = idemgate_bin()
    if not binary.exists():
        pytest.fail(f"no idemgate binary at {binary}: run `cargo build -p idemgate-cli` or set IDEMGATE_BIN")
    tmp = tmp_path_factory.mktemp("gateway")
    port = free_port()
    db = tmp / "idem.db"
    config = tmp / "idemgate.toml"
    write_config(config, port, db, upstream)
    log = tmp / "gateway.log"
    env = dict(os.environ, XDG_DATA_HOME=str(tmp / "data"))
    env.setdefault("RUST_LOG", "warn")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(binary), "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield Gateway(url=url, bin=binary, store=f"sqlite://{db}", log=log, proc=proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def acme(gateway: Gateway) -> Client:
    return gateway.client("acme")


@pytest.fixture
def globex(gateway: Gateway) -> Client:
    return gateway.client("globex")
