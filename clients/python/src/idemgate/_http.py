"""HTTP/1.1 with keep-alive for the gateway clients, standard library only.

- :class:`SyncTransport`: one persistent ``http.client`` connection per thread.
- :class:`AsyncTransport`: a small pool of asyncio stream connections.

A connection the server has closed while idle (its keep-alive timeout, a restart) is noticed before
a request is written to it (the socket reads as closed) and replaced. A request that fails on a
reused connection after it was written is sent once more on a new connection only when it is
``safe`` to re-send (a read, a heartbeat, a ``begin`` or a forwarded ``call`` with the same key: the
gateway answers a repeat of those with the same decision); anything else raises
``GatewayUnreachable`` and the caller decides. A timeout is never re-sent: the first request may
still be running.
"""

from __future__ import annotations

import asyncio
import http.client
import select
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass

from .errors import GatewayUnreachable

__all__ = ["Answer", "AsyncTransport", "Request", "SyncTransport"]

_MAX_HEADER_BYTES = 64 * 1024


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers.items():
            if k.lower() == name:
                return v
        return None


@dataclass
class Request:
    method: str
    path: str  # with the query, without the base path
    body: bytes | None
    headers: dict[str, str]
    safe: bool  # may be sent again after a failure on a reused connection
    timeout: float


class _Target:
    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"gateway URL must be http(s)://host[:port][/base]: {base_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.base = parts.path.rstrip("/")
        default = 443 if self.tls else 80
        self.host_header = self.host if self.port == default else f"{self.host}:{self.port}"
        if ":" in self.host and not self.host.startswith("["):  # IPv6 literal
            self.host_header = f"[{self.host}]" + ("" if self.port == default else f":{self.port}")


def _closed_by_peer(sock: socket.socket | None) -> bool:
    """Whether an idle keep-alive socket was closed by the server (it reads as ready: EOF, or
    bytes nobody asked for, which make the connection unusable either way)."""
    if sock is None:
        return True
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


def _unreachable(req: Request, e: BaseException) -> GatewayUnreachable:
    reason = getattr(e, "reason", None) or e
    return GatewayUnreachable(f"{req.method} {req.path}: no answer from the gateway: {reason}")


class SyncTransport:
    """One persistent connection per thread (``http.client`` is not thread-safe)."""

    def __init__(self, base_url: str) -> None:
        self.target = _Target(base_url)
        self._local = threading.local()
        #: Connections opened (for tests and curiosity: reuse keeps it at one per thread).
        self.opened = 0
        self._count = threading.Lock()

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        t = self.target
        conn: http.client.HTTPConnection
        if t.tls:
            conn = http.client.HTTPSConnection(
                t.host, t.port, timeout=timeout, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(t.host, t.port, timeout=timeout)
        with self._count:
            self.opened += 1
        return conn

    def close(self) -> None:
        """Closes this thread's connection (others close when their thread's state goes)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def send(self, req: Request) -> Answer:
        for attempt in range(2):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            reused = conn is not None and conn.sock is not None
            if reused and _closed_by_peer(conn.sock):  # type: ignore[union-attr]
                conn.close()  # type: ignore[union-attr]
                conn, reused = None, False
            if conn is None or conn.sock is None:
                conn = conn if conn is not None else self._new(req.timeout)
                self._local.conn = conn
            conn.timeout = req.timeout
            if conn.sock is not None:
                conn.sock.settimeout(req.timeout)
            try:
                conn.request(
                    req.method, self.target.base + req.path, body=req.body, headers=req.headers
                )
                resp = conn.getresponse()
                body = resp.read()
                headers = dict(resp.getheaders())
                if resp.will_close:
                    self.close()
                return Answer(resp.status, headers, body)
            except (socket.timeout, TimeoutError) as e:
                self.close()
                raise _unreachable(req, e) from e
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if reused and req.safe and attempt == 0:
                    continue  # the connection went away under us: once more, on a new one
                raise _unreachable(req, e) from e
        raise AssertionError("unreachable")


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def closed_by_peer(self) -> bool:
        if self.writer.is_closing() or self.reader.at_eof():
            return True
        sock = self.writer.get_extra_info("socket")
        # Under TLS the raw socket may hold record bytes; trust the stream's state then.
        if sock is None or self.writer.get_extra_info("sslcontext") is not None:
            return False
        return _closed_by_peer(sock) and not self.reader._buffer  # type: ignore[attr-defined]

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001, S110 - closing a dead connection
            pass


class AsyncTransport:
    """A pool of keep-alive connections (asyncio streams), at most ``max_idle`` kept idle."""

    def __init__(self, base_url: str, max_idle: int = 8) -> None:
        self.target = _Target(base_url)
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        self.opened = 0

    async def _new(self, timeout: float) -> _Conn:
        t = self.target
        ctx = ssl.create_default_context() if t.tls else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(t.host, t.port, ssl=ctx, limit=_MAX_HEADER_BYTES), timeout
        )
        self.opened += 1
        return _Conn(reader, writer)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
            try:
                await c.writer.wait_closed()
            except Exception:  # noqa: BLE001, S110
                pass

    def _take(self) -> _Conn | None:
        while self._idle:
            c = self._idle.pop()
            if not c.closed_by_peer():
                return c
            c.close()
        return None

    def _give_back(self, c: _Conn) -> None:
        if len(self._idle) < self.max_idle:
            self._idle.append(c)
        else:
            c.close()

    async def send(self, req: Request) -> Answer:
        for attempt in range(2):
            conn = self._take()
            reused = conn is not None
            try:
                if conn is None:
                    conn = await self._new(req.timeout)
                answer, keep = await asyncio.wait_for(self._exchange(conn, req), req.timeout)
            except (asyncio.TimeoutError, TimeoutError) as e:
                if conn is not None:
                    conn.close()
                raise _unreachable(req, e) from e
            except asyncio.CancelledError:
                if conn is not None:
                    conn.close()  # half a request or answer: never reuse it
                raise
            except (OSError, EOFError, ValueError, asyncio.IncompleteReadError) as e:
                if conn is not None:
                    conn.close()
                if reused and req.safe and attempt == 0:
                    continue
                raise _unreachable(req, e) from e
            if keep:
                self._give_back(conn)
            else:
                conn.close()
            return answer
        raise AssertionError("unreachable")

    async def _exchange(self, conn: _Conn, req: Request) -> tuple[Answer, bool]:
        t = self.target
        lines = [f"{req.method} {t.base + req.path} HTTP/1.1", f"Host: {t.host_header}"]
        headers = dict(req.headers)
        body = req.body or b""
        if req.body is not None or req.method in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        lines += [f"{k}: {v}" for k, v in headers.items()]
        conn.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await conn.writer.drain()
        r = conn.reader
        while True:  # skip 1xx answers
            status_line = (await r.readuntil(b"\r\n")).decode("latin-1").rstrip("\r\n")
            version, _, rest = status_line.partition(" ")
            if not version.startswith("HTTP/1."):
                raise ValueError(f"not an HTTP/1.x answer: {status_line[:80]!r}")
            status = int(rest.split(" ", 1)[0])
            got: dict[str, str] = {}
            while True:
                line = (await r.readuntil(b"\r\n")).decode("latin-1").rstrip("\r\n")
                if not line:
                    break
                name, _, value = line.partition(":")
                name, value = name.strip(), value.strip()
                prev = next((k for k in got if k.lower() == name.lower()), None)
                if prev is not None:
                    got[prev] = f"{got[prev]}, {value}"
                else:
                    got[name] = value
            if not 100 <= status < 200:
                break
        answer = Answer(status, got, b"")
        te = (answer.header("Transfer-Encoding") or "").lower()
        length = answer.header("Content-Length")
        keep = (answer.header("Connection") or "").lower() != "close" and version == "HTTP/1.1"
        if req.method == "HEAD" or status in (204, 304):
            pass
        elif "chunked" in te:
            chunks = []
            while True:
                size = int((await r.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await r.readuntil(b"\r\n")) != b"\r\n":  # trailers
                        pass
                    break
                chunks.append(await r.readexactly(size))
                await r.readexactly(2)
            answer.body = b"".join(chunks)
        elif length is not None:
            answer.body = await r.readexactly(int(length))
        else:  # delimited by the end of the connection
            answer.body = await r.read()
            keep = False
        return answer, keep
