"""Exceptions: one class per problem type of the gateway (RFC 9457 problem+json), plus the
exceptions a tool function raises to tell the decorator what happened."""

from __future__ import annotations

from typing import Any, Mapping

from ._native import PROBLEM_TYPE_BASE

# The problem-type URI base, written once, in the kit (through the native module).
PROBLEM_PREFIX = PROBLEM_TYPE_BASE


class IdemgateError(Exception):
    """An answer of the gateway that is a problem (or no answer at all).

    ``status`` is the HTTP status (0 when the gateway could not be reached), ``type`` the problem
    type URI, ``problem`` the whole problem document and ``headers`` the answer's headers.
    """

    problem_name: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        type: str | None = None,
        title: str | None = None,
        detail: str | None = None,
        problem: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.problem: dict[str, Any] = dict(problem or {})
        self.headers: dict[str, str] = dict(headers or {})

    @property
    def for_model(self) -> str | None:
        """What a model reads about this answer or refusal (the kit's words for a model,
        ``idemgate_kit::Explanation::for_model``): set by the in-process engine, ``None`` for a
        gateway's answer."""
        value = self.problem.get("for_model")
        return value if isinstance(value, str) else None


class GatewayUnreachable(IdemgateError):
    """The request did not get an answer (connection refused or dropped, timeout).

    For ``begin`` and ``call`` the key may or may not have been reserved: retry with the same key.
    """


class Unauthorized(IdemgateError):
    """401: missing or wrong bearer token."""

    problem_name = "unauthorized"


class BadRequest(IdemgateError):
    """400: the request is malformed (bad key, bad body, unknown lease format...)."""

    problem_name = "bad-request"


class KeyRequired(BadRequest):
    """400: a write without an idempotency key (and without a fallback window)."""

    problem_name = "key-required"


class NotFound(IdemgateError):
    """404: no such record (or route)."""

    problem_name = "not-found"


class PayloadTooLarge(IdemgateError):
    """413: the body is larger than the gateway accepts."""

    problem_name = "payload-too-large"


class KeyReused(IdemgateError):
    """422: the key was used before with other arguments; nothing ran."""

    problem_name = "key-reused"


class Conflict(IdemgateError):
    """409: base of the conflict problems."""


class InFlight(Conflict):
    """409: another call with this key is running; retry after ``retry_after`` seconds."""

    problem_name = "in-flight"

    @property
    def retry_after(self) -> float | None:
        return _retry_after(self.headers)


class OutcomeUnknown(Conflict):
    """409: an earlier call with this key may or may not have had its effect.

    ``since`` is when the outcome became unknown and ``fence`` the fence to name when resolving
    the record (``Client.resolve``, ``idemgate keys resolve``).

    The first call of an engine (in-process, or the gateway's) to find a record unknown raises
    this only after watching the record for the engine's settle window (2 s; the gateway's is at
    most a quarter of its ``request_timeout``): a process whose "done" write failed while the
    store was out of reach may hold the outcome in its journal, already acknowledged to its caller,
    and its flush may still land, in which case the call replays it. Calls of the same engine
    after that window answer at once.
    """

    problem_name = "outcome-unknown"

    @property
    def since(self) -> str | None:
        return self.problem.get("since")

    @property
    def fence(self) -> int | None:
        fence = self.problem.get("fence")
        return int(fence) if fence is not None else None


class OutcomeExpired(IdemgateError):
    """410: the action ran before under this key, at ``executed_at``, and its result is no
    longer kept: the record's TTL passed at ``expired_at``, and its tombstone (the tool's
    ``tombstone``, default 30 days after the call ran) remembers the action until
    ``retain_until``, so that a late retry is not run again. Nothing ran now, and the stored
    result cannot be shown.

    To do it again on purpose, call with a new key (a new action), or reopen the record at
    ``fence``: ``engine.reopen(tool, key, fence, reason=...)`` in-process, ``idemgate keys
    reopen`` on the command line. ``key`` and ``rule`` are the record's key and the rule that
    named it (in-process); the times are the problem's strings (RFC 3339)."""

    problem_name = "outcome-expired"

    @property
    def key(self) -> str | None:
        return self.problem.get("key")

    @property
    def rule(self) -> str | None:
        return self.problem.get("rule")

    @property
    def executed_at(self) -> str | None:
        return self.problem.get("executed_at")

    @property
    def expired_at(self) -> str | None:
        return self.problem.get("expired_at")

    @property
    def retain_until(self) -> str | None:
        return self.problem.get("retain_until")

    @property
    def fence(self) -> int | None:
        fence = self.problem.get("fence")
        return int(fence) if fence is not None else None


class LeaseLost(Conflict):
    """409: the lease named is no longer the current one (it ran out and was taken over, or the
    record was resolved); the write changed nothing."""

    problem_name = "lease-lost"


class NotResolvable(Conflict):
    """409: ``resolve`` of a record that is not unknown at that fence (``state``, ``fence``: what
    the record is now)."""

    problem_name = "not-resolvable"

    @property
    def state(self) -> str | None:
        return self.problem.get("state")

    @property
    def fence(self) -> int | None:
        fence = self.problem.get("fence")
        return int(fence) if fence is not None else None


class RateLimited(IdemgateError):
    """429: the tenant's rate limit; retry after ``retry_after`` seconds."""

    problem_name = "rate-limited"

    @property
    def retry_after(self) -> float | None:
        return _retry_after(self.headers)


class QuotaExceeded(IdemgateError):
    """429: the tenant holds too many keys in flight."""

    problem_name = "quota-exceeded"


class StoreUnavailable(IdemgateError):
    """503: the store did not answer; nothing ran."""

    problem_name = "store-unavailable"


class StoreMisconfigured(ValueError):
    """``Engine.open``: the store URL or the store is set up wrong, so retrying cannot help: a URL
    of no known scheme (``sqlit:///x.db``), one its store cannot read (``postgres://h:port/db``)
    or with an option it does not know, a SQLite file in a directory that does not exist, a Redis
    without persistence (unless ``allow_volatile=true``), a schema newer than this version. Fix
    the URL or the store. A store that cannot be reached raises ``StoreUnavailable`` instead. A
    ``ValueError``, not an ``IdemgateError``: no call was answered."""


class UpstreamUnreachable(IdemgateError):
    """502: the upstream of a forwarded tool could not be reached; nothing was sent and the key
    was released."""

    problem_name = "upstream-unreachable"


class GatewayTimeout(IdemgateError):
    """503 ``timeout``: the request took longer than the gateway's ``request_timeout``; a forwarded
    call still finishes and records its outcome in the background (retry with the same key)."""

    problem_name = "timeout"


PROBLEM_CLASSES: dict[str, type[IdemgateError]] = {
    cls.problem_name: cls
    for cls in (
        Unauthorized,
        BadRequest,
        KeyRequired,
        NotFound,
        PayloadTooLarge,
        KeyReused,
        InFlight,
        OutcomeUnknown,
        OutcomeExpired,
        LeaseLost,
        NotResolvable,
        RateLimited,
        QuotaExceeded,
        StoreUnavailable,
        UpstreamUnreachable,
        GatewayTimeout,
    )
    if cls.problem_name
}

_BY_STATUS: dict[int, type[IdemgateError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    410: OutcomeExpired,
    413: PayloadTooLarge,
    422: KeyReused,
    429: RateLimited,
    502: UpstreamUnreachable,
    503: StoreUnavailable,
}


def error_from_problem(
    status: int, problem: Mapping[str, Any] | None, headers: Mapping[str, str]
) -> IdemgateError:
    """The exception for a problem answer (by its ``type``, else by status)."""
    problem = dict(problem or {})
    ptype = problem.get("type")
    cls: type[IdemgateError] | None = None
    if isinstance(ptype, str) and ptype.startswith(PROBLEM_PREFIX):
        cls = PROBLEM_CLASSES.get(ptype[len(PROBLEM_PREFIX) :])
    if cls is None:
        cls = _BY_STATUS.get(status, IdemgateError)
    title = problem.get("title")
    detail = problem.get("detail")
    message = f"{status} {title or cls.__name__}" + (f": {detail}" if detail else "")
    return cls(
        message,
        status=status,
        type=ptype,
        title=title,
        detail=detail,
        problem=problem,
        headers=headers,
    )


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                return float(value)
            except ValueError:
                return None
    return None


class NotApplied(Exception):
    """Raised by a tool function to say that nothing happened (no side effect): the decorator
    releases the key so that a retry runs, and re-raises."""


class Failed(Exception):
    """Raised by a tool function for a terminal failure whose ``result`` (JSON) is stored and
    replayed to duplicates: the decorator completes the record as failed and re-raises. A replay
    of a stored failure raises ``Failed`` again with ``replayed=True``."""

    def __init__(self, result: Any = None, *, replayed: bool = False) -> None:
        super().__init__(result)
        self.result = result
        self.replayed = replayed


class MaybeApplied(Exception):
    """Raised by a tool function to say that its side effect may or may not have happened (a
    timeout after the request was sent, a dropped connection): the record becomes *unknown* and is
    never run again until an operator or a verifier resolves it. Any exception other than
    ``NotApplied`` and ``Failed`` is treated the same way; raise this one to say so on purpose."""


class OutcomeNotRecorded(IdemgateError):
    """The tool function ran, but its outcome could not be recorded (the gateway or the store
    stayed unreachable, and for the in-process engine the journal failed too). ``result`` is what
    the function returned; the record will become unknown when its lease runs out."""

    def __init__(
        self,
        message: str,
        result: Any = None,
        cause: BaseException | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.result = result
        if cause is not None:
            self.__cause__ = cause


def engine_error(name: str, message: str, status: int, problem: Mapping[str, Any]) -> Exception:
    """The exception of the in-process engine's answer: ``name`` is the class the native module
    chose from the engine's verdict (one exhaustive match in Rust), ``problem`` the kit's problem
    document: the members a gateway's has (``type``, ``title``, ``status``, ``detail``, and
    ``since``, ``fence``, ``state``, ``first_seen``... where they apply), ``verdict``, ``key``
    and ``rule`` where the answer names a record, and ``for_model``. Used by
    ``idemgate._native``."""
    cls = globals()[name]
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        raise TypeError(f"{name} is not an exception class")
    if not issubclass(cls, IdemgateError):
        return cls(message)
    headers: dict[str, str] = {}
    if problem.get("retry_after") is not None:
        headers["Retry-After"] = str(problem["retry_after"])
    return cls(
        message,
        status=status,
        type=problem.get("type"),
        title=problem.get("title"),
        detail=problem.get("detail"),
        problem=problem,
        headers=headers,
    )
