"""A client of the idemgate HTTP gateway (see docs/HTTP.md), standard library only: :class:`Client`
(threads; one keep-alive connection per thread) and :class:`AsyncClient` (asyncio; a pool of
keep-alive connections), with the same methods and answers."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Generic, Mapping, TypeVar

from ._http import Answer, AsyncTransport, Request, SyncTransport
from ._literals import RecordState, Resolution
from .errors import (
    PROBLEM_PREFIX,
    GatewayUnreachable,
    IdemgateError,
    NotFound,
    error_from_problem,
)

__all__ = [
    "AsyncClient",
    "Begin",
    "CallResult",
    "Client",
    "Completion",
    "Outcome",
    "Record",
    "parse_time",
]


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 time as an aware ``datetime`` (``None`` for ``None`` or text it cannot read)."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    # Python 3.11 reads any number of fractional digits but only up to microseconds reliably.
    if "." in text:
        head, _, rest = text.partition(".")
        digits = ""
        while rest and rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
        text = f"{head}.{(digits + '000000')[:6]}{rest}"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Outcome:
    """A stored outcome: ``kind`` is ``"success"`` or ``"failed"``, ``result`` any JSON."""

    kind: str
    result: Any = None

    @property
    def failed(self) -> bool:
        return self.kind == "failed"

    @classmethod
    def from_json(cls, doc: Any) -> Outcome | None:
        if not isinstance(doc, Mapping):
            return None
        return cls(kind=str(doc.get("kind", "")), result=doc.get("result"))


@dataclass(frozen=True)
class Begin:
    """The answer to ``begin``: what the caller should do.

    - ``execute``: run the side effect now, then ``complete``/``release``/``ambiguous`` with
      ``lease``.
    - ``replayed``: it ran before; ``outcome`` is what it produced, at ``executed_at``.
    - ``pass_through``: a read or a naturally idempotent tool; run it, nothing is recorded.
    """

    decision: str
    key: str | None = None
    rule: str | None = None
    lease: str | None = None
    lease_until: datetime | None = None
    outcome: Outcome | None = None
    executed_at: datetime | None = None
    expires_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def execute(self) -> bool:
        return self.decision == "execute"

    @property
    def replayed(self) -> bool:
        return self.decision == "replayed"

    @property
    def pass_through(self) -> bool:
        return self.decision == "pass_through"

    @property
    def executed(self) -> bool:
        """Alias of ``execute``: this call is the one that runs the side effect."""
        return self.execute


@dataclass(frozen=True)
class Completion:
    """The answer to ``complete``: ``recording`` is ``"stored"`` or ``"journaled"`` (the gateway
    could not reach its store and will store it later)."""

    decision: str
    recording: str | None = None
    executed_at: datetime | None = None
    expires_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class CallResult:
    """The answer to a forwarded call: the upstream's status, content type and body (stored and
    replayed by the gateway), plus what the gateway says about it."""

    status: int
    body: bytes
    content_type: str | None
    replayed: bool | None
    rule: str | None
    executed_at: datetime | None
    expires_at: datetime | None
    headers: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def executed(self) -> bool:
        """This call ran the side effect (as opposed to a replay or a pass-through)."""
        return self.replayed is False

    @property
    def pass_through(self) -> bool:
        """No record was kept (a read or a naturally idempotent tool)."""
        return self.replayed is None

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Record:
    """A record as the operator view shows it. ``state`` is ``in_flight``, ``completed`` or
    ``unknown``."""

    key: str
    tool: str
    tenant: str
    state: str
    fence: int | None = None
    created_at: datetime | None = None
    lease_until: datetime | None = None
    since: datetime | None = None
    outcome: Outcome | None = None
    completed_at: datetime | None = None
    expires_at: datetime | None = None
    #: The key the upstream got in ``Idempotency-Key``: what to search for at the provider.
    downstream_key: str | None = None
    #: Why an unknown record is unknown (only from :meth:`Client.record`).
    reason: str | None = None
    #: Its story, oldest first: each step's ``at``, ``what``, ``text`` and, where given, ``fence``,
    #: ``by`` and ``reason`` (only from :meth:`Client.record`; empty in listings).
    history: list[dict[str, Any]] = field(default_factory=list, repr=False, compare=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Record:
        fence = doc.get("fence")
        return cls(
            key=str(doc.get("key", "")),
            tool=str(doc.get("tool", "")),
            tenant=str(doc.get("tenant", "")),
            state=str(doc.get("state", "")),
            fence=int(fence) if fence is not None else None,
            created_at=parse_time(doc.get("created_at")),
            lease_until=parse_time(doc.get("lease_until")),
            since=parse_time(doc.get("since")),
            outcome=Outcome.from_json(doc.get("outcome")),
            completed_at=parse_time(doc.get("completed_at")),
            expires_at=parse_time(doc.get("expires_at")),
            downstream_key=doc.get("downstream_key"),
            reason=doc.get("reason"),
            history=list(doc.get("history") or []),
            raw=dict(doc),
        )


def _json_of(answer: Answer) -> Any:
    return json.loads(answer.body) if answer.body else None


def _bool_header(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() == "true"


def _problem(answer: Answer) -> IdemgateError | None:
    """The exception for a problem answer of the gateway itself, else ``None``."""
    ctype = (answer.header("Content-Type") or "").lower()
    doc: Any = None
    if "json" in ctype:
        try:
            doc = _json_of(answer)
        except ValueError:
            doc = None
    is_problem = "problem+json" in ctype or (
        isinstance(doc, Mapping)
        and isinstance(doc.get("type"), str)
        and doc["type"].startswith(PROBLEM_PREFIX)
    )
    if not is_problem:
        return None
    return error_from_problem(answer.status, doc if isinstance(doc, Mapping) else None, answer.headers)


def _expect_json(answer: Answer, ok: tuple[int, ...] = (200, 201)) -> Any:
    if answer.status in ok:
        return _json_of(answer)
    err = _problem(answer)
    if err is None:
        err = error_from_problem(
            answer.status,
            {"title": "unexpected answer", "detail": answer.body[:200].decode("utf-8", "replace")},
            answer.headers,
        )
    raise err


def _tool(tool: str) -> str:
    return urllib.parse.quote(tool, safe=":")


def _keyed(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key} if key is not None else {}


# ---- answers ----------------------------------------------------------------------------------


def _begin_of(key: str | None) -> Callable[[Answer], Begin]:
    def parse(answer: Answer) -> Begin:
        doc = _expect_json(answer)
        return Begin(
            decision=str(doc.get("decision")),
            key=doc.get("key", key),
            rule=doc.get("rule") or answer.header("Idempotency-Rule"),
            lease=doc.get("lease"),
            lease_until=parse_time(doc.get("lease_until")),
            outcome=Outcome.from_json(doc.get("outcome")),
            executed_at=parse_time(
                doc.get("executed_at") or answer.header("Idempotency-Executed-At")
            ),
            expires_at=parse_time(doc.get("expires_at") or answer.header("Idempotency-Expires-At")),
            raw=doc,
        )

    return parse


def _lease_until_of(answer: Answer) -> datetime | None:
    return parse_time(_expect_json(answer).get("lease_until"))


def _completion_of(answer: Answer) -> Completion:
    doc = _expect_json(answer)
    return Completion(
        decision=str(doc.get("decision")),
        recording=doc.get("recording"),
        executed_at=parse_time(doc.get("executed_at")),
        expires_at=parse_time(doc.get("expires_at")),
        raw=doc,
    )


def _decision_of(answer: Answer) -> str:
    return str(_expect_json(answer).get("decision"))


def _call_result_of(answer: Answer) -> CallResult:
    err = _problem(answer)
    if err is not None:
        raise err
    return CallResult(
        status=answer.status,
        body=answer.body,
        content_type=answer.header("Content-Type"),
        replayed=_bool_header(answer.header("Idempotent-Replayed")),
        rule=answer.header("Idempotency-Rule"),
        executed_at=parse_time(answer.header("Idempotency-Executed-At")),
        expires_at=parse_time(answer.header("Idempotency-Expires-At")),
        headers=answer.headers,
    )


def _record_of(answer: Answer) -> Record | None:
    try:
        return Record.from_json(_expect_json(answer))
    except NotFound:
        return None


def _records_of(answer: Answer) -> list[Record]:
    # A page: {"records": [...], "next": ..., "count": ...}; a gateway before pages answered the
    # array alone.
    doc = _expect_json(answer)
    page = doc["records"] if isinstance(doc, Mapping) else doc
    return [Record.from_json(r) for r in page]


def _resolved_of(answer: Answer) -> Record | None:
    doc = _expect_json(answer)
    return Record.from_json(doc) if isinstance(doc, Mapping) and doc else None


def _status_ok(answer: Answer) -> bool:
    return answer.status == 200


_T = TypeVar("_T")


@dataclass
class _Call(Generic[_T]):
    """One request of the API and how to read its answer."""

    request: Request
    parse: Callable[[Answer], _T]


class _Api:
    """What a request of each method is (shared by :class:`Client` and :class:`AsyncClient`)."""

    def __init__(self, base_url: str, token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _req(
        self,
        method: str,
        path: str,
        parse: Callable[[Answer], _T],
        body: Any = None,
        *,
        raw_body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        safe: bool = False,
    ) -> _Call[_T]:
        data: bytes | None
        hdrs = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if raw_body is not None:
            data = raw_body
            hdrs["Content-Type"] = "application/json"
        elif body is not None or method == "POST":
            data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            hdrs["Content-Type"] = "application/json"
        else:
            data = None
        hdrs.update(headers or {})
        request = Request(method, path, data, hdrs, safe or method == "GET", timeout or self.timeout)
        return _Call(request, parse)

    def _begin(self, tool: str, key: str | None, args: Any = None) -> _Call[Begin]:
        # Safe to re-send with a key: a repeat is answered as a duplicate of the first.
        return self._req(
            "POST",
            f"/v1/tools/{_tool(tool)}/begin",
            _begin_of(key),
            args if args is not None else {},
            headers=_keyed(key),
            safe=key is not None,
        )

    def _heartbeat(self, tool: str, key: str, lease: str) -> _Call[datetime | None]:
        return self._req(
            "POST",
            f"/v1/tools/{_tool(tool)}/heartbeat",
            _lease_until_of,
            {"key": key, "lease": lease},
            safe=True,
        )

    def _complete(self, tool: str, key: str, lease: str, result: Any, failed: bool) -> _Call[Completion]:
        outcome = {"kind": "failed" if failed else "success", "result": result}
        return self._req(
            "POST",
            f"/v1/tools/{_tool(tool)}/complete",
            _completion_of,
            {"key": key, "lease": lease, "outcome": outcome},
        )

    def _finish(self, verb: str, tool: str, key: str, lease: str, reason: str) -> _Call[str]:
        return self._req(
            "POST",
            f"/v1/tools/{_tool(tool)}/{verb}",
            _decision_of,
            {"key": key, "lease": lease, "reason": reason},
        )

    def _call(self, tool: str, key: str | None, args: Any = None) -> _Call[CallResult]:
        raw = json.dumps(args if args is not None else {}, separators=(",", ":")).encode()
        return self._req(
            "POST",
            f"/v1/tools/{_tool(tool)}/call",
            _call_result_of,
            raw_body=raw,
            headers=_keyed(key),
            safe=key is not None,
        )

    def _record(self, tool: str, key: str) -> _Call[Record | None]:
        path = f"/v1/tools/{_tool(tool)}/records/{urllib.parse.quote(key, safe='')}"
        return self._req("GET", path, _record_of)

    def _records(
        self, state: RecordState | None, tool: str | None, limit: int | None
    ) -> _Call[list[Record]]:
        query = {
            k: v for k, v in (("state", state), ("tool", tool), ("limit", limit)) if v is not None
        }
        path = "/v1/records" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        return self._req("GET", path, _records_of)

    def _resolve(
        self, tool: str, key: str, fence: int, resolution: Resolution, result: Any, failed: bool
    ) -> _Call[Record | None]:
        if resolution not in ("completed", "release"):
            raise ValueError("resolution must be 'completed' or 'release'")
        body: dict[str, Any] = {"fence": fence, "resolution": resolution}
        if resolution == "completed":
            body["outcome"] = {"kind": "failed" if failed else "success", "result": result}
        path = f"/v1/tools/{_tool(tool)}/records/{urllib.parse.quote(key, safe='')}/resolve"
        return self._req("POST", path, _resolved_of, body)


class Client(_Api):
    """A tenant's client of one gateway, for threads: each thread keeps one keep-alive connection
    (``close()`` closes the calling thread's; ``with Client(...) as c:`` too).

    >>> client = Client("http://127.0.0.1:8080", token="secret")
    >>> b = client.begin("send_invoice", key, {"invoice": 42})     # doctest: +SKIP
    """

    def __init__(self, base_url: str, token: str, timeout: float = 30.0) -> None:
        super().__init__(base_url, token, timeout)
        self.transport = SyncTransport(self.base_url)

    def _send(self, call: _Call[_T]) -> _T:
        return call.parse(self.transport.send(call.request))

    def close(self) -> None:
        """Closes the calling thread's connection (a later request opens a new one)."""
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- coordination: the caller runs the side effect ---------------------------------------

    def begin(self, tool: str, key: str | None, args: Any = None) -> Begin:
        """Reserves ``key`` for ``tool`` with these arguments, or tells why not to run.

        Raises ``InFlight``, ``OutcomeUnknown``, ``OutcomeExpired``, ``KeyReused``,
        ``KeyRequired``, ``RateLimited``, ``StoreUnavailable``... (see ``idemgate.errors``).
        """
        return self._send(self._begin(tool, key, args))

    def heartbeat(self, tool: str, key: str, lease: str) -> datetime | None:
        """Extends the lease; returns the new ``lease_until``. Raises ``LeaseLost``."""
        return self._send(self._heartbeat(tool, key, lease))

    def complete(
        self, tool: str, key: str, lease: str, result: Any, failed: bool = False
    ) -> Completion:
        """Stores the outcome (``failed=True`` for a terminal failure, replayed as such)."""
        return self._send(self._complete(tool, key, lease, result, failed))

    def release(self, tool: str, key: str, lease: str, reason: str = "") -> str:
        """Nothing happened: frees the key so that a retry runs. Returns ``"not_applied"``."""
        return self._send(self._finish("release", tool, key, lease, reason))

    def ambiguous(self, tool: str, key: str, lease: str, reason: str = "") -> str:
        """It may have happened: the record becomes unknown. Returns ``"unknown"``."""
        return self._send(self._finish("ambiguous", tool, key, lease, reason))

    # ---- forwarding: the gateway calls the upstream -------------------------------------------

    def call(self, tool: str, key: str | None, args: Any = None) -> CallResult:
        """Calls a forwarded tool through the gateway, at most once per key.

        Returns the upstream's answer (executed now or replayed), also when the upstream answered
        with a stored 4xx failure (``CallResult.ok`` is then false). Problems of the gateway
        itself raise (``OutcomeUnknown`` for a 5xx or timeout of the upstream, ``InFlight``,
        ``UpstreamUnreachable``, ...).
        """
        return self._send(self._call(tool, key, args))

    # ---- records: the operator view ----------------------------------------------------------

    def record(self, tool: str, key: str) -> Record | None:
        """One record, or ``None`` when there is none."""
        return self._send(self._record(tool, key))

    def records(
        self, state: RecordState | None = None, tool: str | None = None, limit: int | None = None
    ) -> list[Record]:
        """This tenant's records, optionally only those in ``state`` and of ``tool``."""
        return self._send(self._records(state, tool, limit))

    def resolve(
        self,
        tool: str,
        key: str,
        fence: int,
        resolution: Resolution,
        result: Any = None,
        failed: bool = False,
    ) -> Record | None:
        """Resolves a record whose outcome is unknown: ``resolution="completed"`` (it happened;
        ``result`` is stored and replayed, as a failure with ``failed=True``) or ``"release"`` (it
        did not: the next call runs). Returns the record after (``None`` once released)."""
        return self._send(self._resolve(tool, key, fence, resolution, result, failed))

    # ---- operations --------------------------------------------------------------------------

    def healthy(self) -> bool:
        """Whether ``/healthz`` answers 200."""
        try:
            return self._send(self._req("GET", "/healthz", _status_ok, timeout=2))
        except GatewayUnreachable:
            return False

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 (the store answers)."""
        try:
            return self._send(self._req("GET", "/readyz", _status_ok, timeout=5))
        except GatewayUnreachable:
            return False


class AsyncClient(_Api):
    """The same client for asyncio: every method is a coroutine, requests go over a pool of
    keep-alive connections (asyncio streams; ``max_idle`` kept open). Close it with
    ``await client.aclose()`` or ``async with AsyncClient(...) as client:``."""

    def __init__(self, base_url: str, token: str, timeout: float = 30.0, max_idle: int = 8) -> None:
        super().__init__(base_url, token, timeout)
        self.transport = AsyncTransport(self.base_url, max_idle=max_idle)

    async def _send(self, call: _Call[_T]) -> _T:
        return call.parse(await self.transport.send(call.request))

    async def aclose(self) -> None:
        """Closes the idle connections."""
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def begin(self, tool: str, key: str | None, args: Any = None) -> Begin:
        """See :meth:`Client.begin`."""
        return await self._send(self._begin(tool, key, args))

    async def heartbeat(self, tool: str, key: str, lease: str) -> datetime | None:
        """See :meth:`Client.heartbeat`."""
        return await self._send(self._heartbeat(tool, key, lease))

    async def complete(
        self, tool: str, key: str, lease: str, result: Any, failed: bool = False
    ) -> Completion:
        """See :meth:`Client.complete`."""
        return await self._send(self._complete(tool, key, lease, result, failed))

    async def release(self, tool: str, key: str, lease: str, reason: str = "") -> str:
        """See :meth:`Client.release`."""
        return await self._send(self._finish("release", tool, key, lease, reason))

    async def ambiguous(self, tool: str, key: str, lease: str, reason: str = "") -> str:
        """See :meth:`Client.ambiguous`."""
        return await self._send(self._finish("ambiguous", tool, key, lease, reason))

    async def call(self, tool: str, key: str | None, args: Any = None) -> CallResult:
        """See :meth:`Client.call`."""
        return await self._send(self._call(tool, key, args))

    async def record(self, tool: str, key: str) -> Record | None:
        """See :meth:`Client.record`."""
        return await self._send(self._record(tool, key))

    async def records(
        self, state: RecordState | None = None, tool: str | None = None, limit: int | None = None
    ) -> list[Record]:
        """See :meth:`Client.records`."""
        return await self._send(self._records(state, tool, limit))

    async def resolve(
        self,
        tool: str,
        key: str,
        fence: int,
        resolution: Resolution,
        result: Any = None,
        failed: bool = False,
    ) -> Record | None:
        """See :meth:`Client.resolve`."""
        return await self._send(self._resolve(tool, key, fence, resolution, result, failed))

    async def healthy(self) -> bool:
        """See :meth:`Client.healthy`."""
        try:
            return await self._send(self._req("GET", "/healthz", _status_ok, timeout=2))
        except GatewayUnreachable:
            return False

    async def ready(self) -> bool:
        """See :meth:`Client.ready`."""
        try:
            return await self._send(self._req("GET", "/readyz", _status_ok, timeout=5))
        except GatewayUnreachable:
            return False
