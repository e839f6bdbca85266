"""A client of the idemgate HTTP gateway (see docs/HTTP.md), standard library only."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from .errors import (
    PROBLEM_PREFIX,
    GatewayUnreachable,
    IdemgateError,
    NotFound,
    error_from_problem,
)

__all__ = [
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
            raw=dict(doc),
        )


@dataclass
class _Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers.items():
            if k.lower() == name:
                return v
        return None

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def _bool_header(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() == "true"


class Client:
    """A tenant's client of one gateway.

    >>> client = Client("http://127.0.0.1:8080", token="secret")
    >>> b = client.begin("send_invoice", key, {"invoice": 42})     # doctest: +SKIP
    """

    def __init__(self, base_url: str, token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    # ---- plumbing ----------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw_body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> _Answer:
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
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                return _Answer(resp.status, dict(resp.headers.items()), resp.read())
        except urllib.error.HTTPError as e:
            try:
                payload = e.read()
            except (OSError, http.client.HTTPException):
                payload = b""
            return _Answer(e.code, dict(e.headers.items()) if e.headers else {}, payload)
        except (urllib.error.URLError, OSError, http.client.HTTPException, socket.timeout) as e:
            reason = getattr(e, "reason", e)
            raise GatewayUnreachable(f"{method} {path}: no answer from the gateway: {reason}") from e

    @staticmethod
    def _problem(answer: _Answer) -> IdemgateError | None:
        """The exception for a problem answer of the gateway itself, else ``None``."""
        ctype = (answer.header("Content-Type") or "").lower()
        doc: Any = None
        if "json" in ctype:
            try:
                doc = answer.json()
            except ValueError:
                doc = None
        is_problem = "problem+json" in ctype or (
            isinstance(doc, Mapping)
            and isinstance(doc.get("type"), str)
            and doc["type"].startswith(PROBLEM_PREFIX)
        )
        if not is_problem:
            return None
        return error_from_problem(
            answer.status, doc if isinstance(doc, Mapping) else None, answer.headers
        )

    def _json(self, answer: _Answer, ok: tuple[int, ...] = (200, 201)) -> Any:
        if answer.status in ok:
            return answer.json()
        err = self._problem(answer)
        if err is None:
            err = error_from_problem(
                answer.status,
                {"title": "unexpected answer", "detail": answer.body[:200].decode("utf-8", "replace")},
                answer.headers,
            )
        raise err

    @staticmethod
    def _tool(tool: str) -> str:
        return urllib.parse.quote(tool, safe=":")

    @staticmethod
    def _keyed(key: str | None) -> dict[str, str]:
        return {"Idempotency-Key": key} if key is not None else {}

    # ---- coordination: the caller runs the side effect ---------------------------------------

    def begin(self, tool: str, key: str | None, args: Any = None) -> Begin:
        """Reserves ``key`` for ``tool`` with these arguments, or tells why not to run.

        Raises ``InFlight``, ``OutcomeUnknown``, ``KeyReused``, ``KeyRequired``,
        ``RateLimited``, ``StoreUnavailable``... (see ``idemgate.errors``).
        """
        answer = self._request(
            "POST",
            f"/v1/tools/{self._tool(tool)}/begin",
            args if args is not None else {},
            headers=self._keyed(key),
        )
        doc = self._json(answer)
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

    def heartbeat(self, tool: str, key: str, lease: str) -> datetime | None:
        """Extends the lease; returns the new ``lease_until``. Raises ``LeaseLost``."""
        answer = self._request(
            "POST", f"/v1/tools/{self._tool(tool)}/heartbeat", {"key": key, "lease": lease}
        )
        return parse_time(self._json(answer).get("lease_until"))

    def complete(
        self, tool: str, key: str, lease: str, result: Any, failed: bool = False
    ) -> Completion:
        """Stores the outcome (``failed=True`` for a terminal failure, replayed as such)."""
        outcome = {"kind": "failed" if failed else "success", "result": result}
        answer = self._request(
            "POST",
            f"/v1/tools/{self._tool(tool)}/complete",
            {"key": key, "lease": lease, "outcome": outcome},
        )
        doc = self._json(answer)
        return Completion(
            decision=str(doc.get("decision")),
            recording=doc.get("recording"),
            executed_at=parse_time(doc.get("executed_at")),
            expires_at=parse_time(doc.get("expires_at")),
            raw=doc,
        )

    def release(self, tool: str, key: str, lease: str, reason: str = "") -> str:
        """Nothing happened: frees the key so that a retry runs. Returns ``"not_applied"``."""
        answer = self._request(
            "POST",
            f"/v1/tools/{self._tool(tool)}/release",
            {"key": key, "lease": lease, "reason": reason},
        )
        return str(self._json(answer).get("decision"))

    def ambiguous(self, tool: str, key: str, lease: str, reason: str = "") -> str:
        """It may have happened: the record becomes unknown. Returns ``"unknown"``."""
        answer = self._request(
            "POST",
            f"/v1/tools/{self._tool(tool)}/ambiguous",
            {"key": key, "lease": lease, "reason": reason},
        )
        return str(self._json(answer).get("decision"))

    # ---- forwarding: the gateway calls the upstream -------------------------------------------

    def call(self, tool: str, key: str | None, args: Any = None) -> CallResult:
        """Calls a forwarded tool through the gateway, at most once per key.

        Returns the upstream's answer (executed now or replayed), also when the upstream answered
        with a stored 4xx failure (``CallResult.ok`` is then false). Problems of the gateway
        itself raise (``OutcomeUnknown`` for a 5xx or timeout of the upstream, ``InFlight``,
        ``UpstreamUnreachable``, ...).
        """
        raw = json.dumps(args if args is not None else {}, separators=(",", ":")).encode()
        answer = self._request(
            "POST", f"/v1/tools/{self._tool(tool)}/call", raw_body=raw, headers=self._keyed(key)
        )
        err = self._problem(answer)
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

    # ---- records: the operator view ----------------------------------------------------------

    def record(self, tool: str, key: str) -> Record | None:
        """One record, or ``None`` when there is none."""
        answer = self._request(
            "GET",
            f"/v1/tools/{self._tool(tool)}/records/{urllib.parse.quote(key, safe='')}",
        )
        try:
            return Record.from_json(self._json(answer))
        except NotFound:
            return None

    def records(
        self, state: str | None = None, tool: str | None = None, limit: int | None = None
    ) -> list[Record]:
        """This tenant's records, optionally only those in ``state`` and of ``tool``."""
        query = {
            k: v
            for k, v in (("state", state), ("tool", tool), ("limit", limit))
            if v is not None
        }
        path = "/v1/records" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        return [Record.from_json(doc) for doc in self._json(self._request("GET", path))]

    def resolve(
        self,
        tool: str,
        key: str,
        fence: int,
        resolution: str,
        result: Any = None,
        failed: bool = False,
    ) -> Record | None:
        """Resolves a record whose outcome is unknown: ``resolution="completed"`` (it happened;
        ``result`` is stored and replayed, as a failure with ``failed=True``) or ``"release"`` (it
        did not: the next call runs). Returns the record after (``None`` once released)."""
        if resolution not in ("completed", "release"):
            raise ValueError("resolution must be 'completed' or 'release'")
        body: dict[str, Any] = {"fence": fence, "resolution": resolution}
        if resolution == "completed":
            body["outcome"] = {"kind": "failed" if failed else "success", "result": result}
        answer = self._request(
            "POST",
            f"/v1/tools/{self._tool(tool)}/records/{urllib.parse.quote(key, safe='')}/resolve",
            body,
        )
        doc = self._json(answer)
        return Record.from_json(doc) if isinstance(doc, Mapping) and doc else None

    # ---- operations --------------------------------------------------------------------------

    def healthy(self) -> bool:
        """Whether ``/healthz`` answers 200."""
        try:
            return self._request("GET", "/healthz", timeout=2).status == 200
        except GatewayUnreachable:
            return False

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 (the store answers)."""
        try:
            return self._request("GET", "/readyz", timeout=5).status == 200
        except GatewayUnreachable:
            return False
