"""The HTTP clients' connections: keep-alive reuse, a connection the server closed, and which
requests are sent again when a reused connection fails under them (sync and asyncio)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from idemgate import AsyncClient, Client, GatewayUnreachable, mint_key
from idemgate.client import _Api


# ---- a scripted HTTP/1.1 server ------------------------------------------------------------


@dataclass
class Scripted:
    """Answers each request per ``plan`` (by arrival order): ``"answer"`` (200 JSON, connection
    kept), ``"answer-close"`` (200 then close the connection, no ``Connection: close`` header, as a
    server whose idle timeout fires), ``"drop"`` (read the request, close without answering).
    Requests past the plan are answered. Records every request's method and path."""

    plan: list[str]
    port: int = 0
    seen: list[str] = field(default_factory=list)
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: threading.Event = field(default_factory=threading.Event)  # an "answer-close" closed

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _read_request(f: Any) -> str | None:
    line = f.readline()
    if not line:
        return None
    length = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length:
        f.read(length)
    method, path, _ = line.decode("latin-1").split(" ", 2)
    return f"{method} {path}"


def _serve(s: Scripted, conn: socket.socket) -> None:
    with conn, conn.makefile("rb") as f:
        while True:
            req = _read_request(f)
            if req is None:
                return
            with s.lock:
                n = len(s.seen)
                s.seen.append(req)
            what = s.plan[n] if n < len(s.plan) else "answer"
            if what == "drop":
                return
            body = json.dumps({"decision": "execute", "lease": "l1", "key": "k", "n": n}).encode()
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            if what == "answer-close":
                # shutdown, not close alone: the file made from the socket holds it open until the
                # `with` ends, so a bare close would send the FIN only after `closed` is set, and a
                # client checking its idle connection in between would find it still open.
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
                s.closed.set()
                return


@pytest.fixture
def scripted() -> Iterator[Any]:
    servers: list[socket.socket] = []

    def start(plan: list[str]) -> Scripted:
        s = Scripted(plan)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        servers.append(sock)
        s.port = sock.getsockname()[1]

        def accept() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                with s.lock:
                    s.connections += 1
                threading.Thread(target=_serve, args=(s, conn), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return s

    yield start
    for sock in servers:
        sock.close()


# ---- keep-alive against the real gateway ------------------------------------------------------


def test_one_connection_per_thread_is_reused(gateway: Any) -> None:
    client = gateway.client("acme")
    key = mint_key()
    b = client.begin("mail", key, {"to": "a"})
    client.complete("mail", key, b.lease, {"ok": 1})
    for _ in range(10):
        assert client.begin("mail", key, {"to": "a"}).replayed
    assert client.record("mail", key).state == "completed"
    assert client.transport.opened == 1

    def other() -> None:
        client.records(limit=1)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert client.transport.opened == 2, "another thread has its own connection"
    client.close()
    assert client.healthy()
    assert client.transport.opened == 3


def test_async_client_reuses_its_connections(gateway: Any) -> None:
    async def scenario() -> tuple[int, list[bool]]:
        async with AsyncClient(gateway.url, "acme-token-0123456789") as client:
            key = mint_key()
            b = await client.begin("mail", key, {"to": "a"})
            await client.complete("mail", key, b.lease, {"ok": 1})
            replays = [(await client.begin("mail", key, {"to": "a"})).replayed for _ in range(10)]
            # Concurrent requests take several connections, then reuse them.
            many = await asyncio.gather(*(client.begin("mail", key, {"to": "a"}) for _ in range(4)))
            replays += [m.replayed for m in many]
            assert (await client.record("mail", key)).state == "completed"
            assert await client.healthy()
            return client.transport.opened, replays

    opened, replays = asyncio.run(scenario())
    assert all(replays) and len(replays) == 14
    assert 1 <= opened <= 4


# ---- what is sent again -----------------------------------------------------------------------


def _client(kind: str, url: str) -> Any:
    return Client(url, "t", timeout=10) if kind == "sync" else AsyncClient(url, "t", timeout=10)


def _both(client: Any, calls: list[Any]) -> list[Any]:
    """Runs the calls (``(method, args)``, or a plain function to run in between) in order on one
    client (one event loop for the async one, so its pool survives): each result or exception."""
    if isinstance(client, AsyncClient):

        async def go() -> list[Any]:
            out: list[Any] = []
            for call in calls:
                if callable(call):
                    await asyncio.get_running_loop().run_in_executor(None, call)
                    continue
                method, args = call
                try:
                    out.append(await getattr(client, method)(*args))
                except Exception as e:  # noqa: BLE001
                    out.append(e)
            return out

        return asyncio.run(go())
    out = []
    for call in calls:
        if callable(call):
            call()
            continue
        method, args = call
        try:
            out.append(getattr(client, method)(*args))
        except Exception as e:  # noqa: BLE001
            out.append(e)
    return out


def _closed(s: Scripted) -> Any:
    def wait() -> None:
        assert s.closed.wait(30), "the server did not close the connection"

    return wait


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_connection_the_server_closed_is_replaced_before_writing(kind: str, scripted: Any) -> None:
    s = scripted(["answer-close"])
    client = _client(kind, s.url)
    first, second = _both(
        client,
        [
            ("begin", ("mail", "k", {})),
            _closed(s),  # the server closed the idle connection before the next request
            ("complete", ("mail", "k", "l1", {"ok": 1})),
        ],
    )
    assert not isinstance(first, Exception) and not isinstance(second, Exception), (first, second)
    # The complete was written once, on a new connection: never on the closed one.
    assert s.seen == ["POST /v1/tools/mail/begin", "POST /v1/tools/mail/complete"]
    assert s.connections == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_keyed_begin_is_sent_again_when_a_reused_connection_fails(kind: str, scripted: Any) -> None:
    s = scripted(["answer", "drop"])
    client = _client(kind, s.url)
    first, second = _both(client, [("begin", ("mail", "k1", {})), ("begin", ("mail", "k2", {}))])
    assert not isinstance(second, Exception), second
    assert s.seen == ["POST /v1/tools/mail/begin"] * 3, "the second begin went out twice"
    assert s.connections == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_complete_is_not_sent_again(kind: str, scripted: Any) -> None:
    s = scripted(["answer", "drop"])
    client = _client(kind, s.url)
    _, second = _both(
        client, [("begin", ("mail", "k1", {})), ("complete", ("mail", "k1", "l1", {"ok": 1}))]
    )
    assert isinstance(second, GatewayUnreachable), second
    assert s.seen == ["POST /v1/tools/mail/begin", "POST /v1/tools/mail/complete"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_begin_without_key_is_not_sent_again(kind: str, scripted: Any) -> None:
    s = scripted(["answer", "drop"])
    client = _client(kind, s.url)
    _, second = _both(client, [("begin", ("mail", "k1", {})), ("begin", ("mail", None, {}))])
    assert isinstance(second, GatewayUnreachable), second
    assert len(s.seen) == 2


def test_which_requests_are_safe() -> None:
    api = _Api("http://127.0.0.1:1", "t")
    assert api._begin("t", "k").request.safe
    assert not api._begin("t", None).request.safe
    assert api._call("t", "k").request.safe
    assert not api._call("t", None).request.safe
    assert api._heartbeat("t", "k", "l").request.safe
    assert api._record("t", "k").request.safe
    assert not api._complete("t", "k", "l", 1, False).request.safe
    assert not api._finish("release", "t", "k", "l", "").request.safe
    assert not api._resolve("t", "k", 1, "release", None, False).request.safe
