"""The idemgate engine in-process: at-most-once tool calls without a gateway.

This is the Rust engine itself (``idemgate._native``), not a port: the same policies, keys,
fingerprints, answers, journal and stores as ``idemgate exec``/``serve``/``mcp``, and the same
stored-outcome format, so a record written here is replayed by every other door and vice versa::

    from idemgate import Engine, NotApplied, idempotent

    engine = Engine.open()                      # the SQLite file every `idemgate` command uses

    @idempotent(engine, key=lambda order, call_id: call_id)
    def charge(order: dict, call_id: str) -> dict:
        receipt = payments.charge(order)        # runs once per call_id; retries get its result,
        return {"charge_id": receipt.id}        # which must be JSON data

A call reserves its key in the store (with the GIL released), runs the function on the calling
thread while the engine renews the lease on its own runtime, then stores the JSON of the return
value. ``async def`` functions and :meth:`Engine.acall` await the store without blocking the event
loop.

What the function raises says what happened:

- ``NotApplied``: nothing happened; the key is released so a retry runs.
- ``Failed(result)``: a terminal failure; ``result`` is stored and a replay raises
  ``Failed(result, replayed=True)``.
- ``MaybeApplied`` -- and any other exception, since the function may have done its work before
  raising -- the record becomes *unknown* and is never run again until an operator resolves it
  (``idemgate keys resolve``); duplicates raise ``OutcomeUnknown``. The first call of an engine
  to find a record unknown watches it for up to 2 s first (the engine's settle window): a holder
  whose "done" write failed may have journaled its outcome, acknowledged to its caller, and its
  flush may still land, which the call then replays. Its calls after that window answer at once.

What it returns is stored as JSON and replayed to duplicates, so it must be made of JSON types:
``dict`` with ``str`` keys, ``list``, ``tuple`` (replayed as a list), ``str``, ``int``, finite
``float``, ``bool``, ``None``. A value JSON cannot hold (an object, ``NaN`` or an infinity, a
cycle, nesting past the interpreter's recursion limit) raises ``TypeError`` and makes the record
unknown at once: the function ran, so it is neither left in flight nor released. A ``Failed``
result JSON cannot hold is stored as its ``repr``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import getpass
import importlib
import inspect
import json
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import (
    Any,
    Concatenate,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypedDict,
    TypeVar,
    Unpack,
    cast,
    overload,
)

from . import _native
from ._literals import Mode, OnUnknown, RecordState, Resolution, ToolKind
from ._native import PASSED_THROUGH as _PASSED_THROUGH
from ._native import Observed, Policy, Ticket
from .errors import (
    Failed,
    NotApplied,
    OutcomeNotRecorded,
    OutcomeUnknown,
)

__all__ = [
    "AsyncIdempotentFunction",
    "Engine",
    "IdempotentDecorator",
    "IdempotentFunction",
    "Policy",
    "PolicyOptions",
    "Result",
    "current_key",
    "idempotent",
]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
_P2 = ParamSpec("_P2")
_R2 = TypeVar("_R2")
_S = TypeVar("_S")


class PolicyOptions(TypedDict, total=False):
    """The fields of a tool's :class:`Policy` that a call, ``@idempotent`` or an integration's
    wrapper overrides as keyword arguments; ``None`` (or leaving one out) keeps the value the
    engine has for the tool (``Engine.open(tools=..., default=...)``). Durations in seconds.

    - ``kind``: ``"write"`` (gated, the default), ``"read"`` or ``"natural_idempotent"`` (run
      without a record);
    - ``ttl``: how long a completed record is kept and replayed (default 24 h);
    - ``tombstone``: how long after a call ran (counted from its completion, as ``ttl``) its
      record is remembered: a retry with its key past the ``ttl`` and within this raises
      ``OutcomeExpired`` (nothing runs; a new key or :meth:`Engine.reopen` runs it again) instead
      of running the action again (default 30 days; ``0``, or anything no longer than ``ttl``:
      none, a retry past the ``ttl`` runs it again). A record the ``fallback_window`` named keeps
      none;
    - ``lease``: how long a running call holds its key before it is taken for dead; the engine
      renews it while the function runs (default 30 s);
    - ``wait``: how long a duplicate waits for the running call's outcome before ``InFlight``
      (default 5 s);
    - ``fallback_window``: an identical call without key (same tool, same arguments, same scope)
      within it is the same action; the integrations' re-emission window (their default 60 s,
      ``0`` turns it off);
    - ``on_unknown``: what a call finding the record unknown does: ``"block"`` (raise
      ``OutcomeUnknown``, the default), ``"retry"`` (run again) or ``"verify"`` (ask the tool's
      verifier, see :meth:`Engine.open`);
    - ``identity``: the arguments that name the tool's action (names, or JSON pointers such as
      ``"/order/id"``), a tuple: the window then compares only these, so a call that rewords the
      rest (a guardrail's retry that rewrites a mail's body) within it is the same action, and
      its notice says an action with the same ones ran. A call lacking one is named by all its
      arguments; a key is never affected;
    - ``mode``: ``"enforce"`` (the default) or ``"observe"``, shadow mode, for adopting idemgate
      on a live agent: every call runs (nothing is replayed, waited for or refused), and what
      enforce mode would have done is recorded in the history of the record a call duplicates
      (``keys list --observed``, the console, ``/metrics``). Fresh calls keep their records as in
      enforce mode, so switching is one word.
    """

    kind: ToolKind | None
    ttl: float | None
    tombstone: float | None
    lease: float | None
    wait: float | None
    fallback_window: float | None
    on_unknown: OnUnknown | None
    identity: Sequence[str] | None
    mode: Mode | None


_POLICY_FIELDS = tuple(PolicyOptions.__annotations__)


def given_policy(options: Mapping[str, Any]) -> dict[str, Any]:
    """The policy fields of ``options`` that are set (not ``None``), checked by name: what a call
    passes on as overrides (no field set: the tool's policy as it is)."""
    unknown = set(options) - set(_POLICY_FIELDS)
    if unknown:
        raise TypeError(f"unknown policy fields {sorted(unknown)}: expected {_POLICY_FIELDS}")
    return {k: v for k, v in options.items() if v is not None}
# How many (tool, overrides) policies an engine keeps built; cleared when full (callers passing
# ever new override values must not grow it without bound).
_OVERRIDDEN_MAX = 1024


# The tool of the observed call whose function runs in this context (observe mode): a call of the
# same tool inside it (an integration's window inside the call id's record) is that same call,
# observed once, by the outer record.
_OBSERVED_TOOL: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "idemgate_observed_tool", default=None
)

# The downstream key of the call whose function runs in this context (see `current_key`).
_CURRENT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "idemgate_current_key", default=None
)


def current_key() -> str:
    """The downstream key of the action whose function is running: the 64-hex digest of its
    record (SHA-256 of tenant, tool and key), the same on every attempt of the action and in
    every process, as ``idemgate mcp`` fills a tool's ``idempotency_key`` argument. Pass it on
    to an API that deduplicates by a key of its own (a payment provider's ``Idempotency-Key``),
    so that even a run the record cannot vouch for (``on_unknown="retry"``) is applied once.

    Raises ``LookupError`` outside a function run by :meth:`Engine.call`, :meth:`Engine.acall`,
    ``@idempotent`` or an integration (a read or pass-through call has no record either)."""
    key = _CURRENT_KEY.get()
    if key is None:
        raise LookupError("current_key() is only known inside a function idemgate runs")
    return key


@dataclass(frozen=True)
class Result:
    """The answer to a call that ended with a result.

    ``executed``: this call ran the function; ``replayed``: the stored outcome of an earlier call,
    without running it (``executed_at`` is when that call's outcome was recorded); ``rule`` is
    ``explicit`` (the caller's key) or ``fallback`` (the tool's fallback window); ``verdict`` the
    engine's label (``executed``, ``replayed``, ``pass_through``); ``content`` the stored kind
    (``json`` from Python and the coordination API, ``command`` from ``idemgate exec``...);
    ``observed``, in observe mode (shadow mode) only: this call ran, where enforce mode would
    have given this verdict instead (``replayed``, ``in_flight``, ``key_reused``...).
    """

    value: Any
    executed: bool
    replayed: bool
    executed_at: datetime | None
    expires_at: datetime | None
    rule: str | None
    key: str | None
    verdict: str
    content: str | None = None
    recording: str | None = None
    observed: str | None = None


@functools.lru_cache(maxsize=1024)
def _time_of_ms(ms: int) -> datetime:
    # Cached: a replay answers the same instant every time, and fresh calls land many to a
    # millisecond; a datetime is immutable, so sharing one is safe. (Called by the native module,
    # which builds every `Result`: a replay's in `begin`, an executed call's in `Answer.result`.)
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


_dumps_settings = json.JSONEncoder()  # json.dumps' own
_make_encoder = json.encoder.c_make_encoder  # type: ignore[attr-defined]


def _who(by: str | None) -> str | None:
    """Who resolves or reopens a record, for the audit log: ``by``, else the OS user."""
    if by is not None:
        return by
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        return None


# This thread's encoder (see `_json_text`).
_encoders = threading.local()


def _encoder() -> Callable[[Any, int], Any]:
    """A new encoder with `json.dumps`' settings and ``allow_nan=False``: the C encoder it builds,
    with its own dict of the containers being written (how it finds a cycle)."""
    s = _dumps_settings
    return cast(
        Callable[[Any, int], Any],
        _make_encoder(
            {}, s.default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False,
            False,
        ),
    )


def _json_text(value: Any) -> str:
    """``json.dumps(value, allow_nan=False)``, by the encoder it builds with those settings,
    without its Python-level layers (the same text and the same errors). ``allow_nan=False``:
    ``NaN`` and ``Infinity`` are not JSON, the engine cannot store them, so they fail here, as
    every other value JSON cannot hold does (``ValueError``).

    One encoder per thread, kept between values: building one costs as much as writing a small
    value. Its dict of the containers being written is empty again after a value it wrote, but
    not after one it failed on (a stale entry would be taken for a cycle), nor while it writes
    (two threads, or a call nested in one, writing one list at once would see it twice): so it is
    taken out while it writes and put back only after a success."""
    if _make_encoder is None or isinstance(value, str):
        return json.dumps(value, allow_nan=False)
    held = _encoders.__dict__
    encode = held.pop("encode", None) or _encoder()
    text = "".join(encode(value, 0))
    held["encode"] = encode
    return text


def _observed(tool: str, begun: Observed, fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
    """Runs ``fn`` for a call observe mode runs where enforce mode would not have: under its
    record's downstream key (``current_key``), and as the observed call of ``tool``, so that the
    window's call of the same tool inside it is not observed again."""
    observing = _OBSERVED_TOOL.set(tool)
    current = _CURRENT_KEY.set(begun.digest)
    try:
        return fn(*a, **kw)
    finally:
        _CURRENT_KEY.reset(current)
        _OBSERVED_TOOL.reset(observing)


async def _aobserved(
    tool: str, begun: Observed, fn: Callable[..., Any], *a: Any, **kw: Any
) -> Any:
    """As :func:`_observed`, awaiting what ``fn`` gives when it is awaitable."""
    observing = _OBSERVED_TOOL.set(tool)
    current = _CURRENT_KEY.set(begun.digest)
    try:
        value = fn(*a, **kw)
        return await value if inspect.isawaitable(value) else value
    finally:
        _CURRENT_KEY.reset(current)
        _OBSERVED_TOOL.reset(observing)


def _passed_through(value: Any, observed: str | None = None) -> Result:
    return Result(value, True, False, None, None, None, None, "pass_through", observed=observed)


def _default_args(a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    """All arguments of a decorated call, as the HTTP client's decorator takes them (the tuple
    itself: its fingerprint is the list's, and copying it costs a list per call)."""
    return {"args": a, "kwargs": kw}


def _report(e: BaseException) -> tuple[str, str]:
    """What an exception of the function tells the engine."""
    if isinstance(e, NotApplied):
        return "not_applied", str(e) or "not applied"
    if isinstance(e, Failed):
        try:
            return "failed", _json_text(e.result)
        except Exception:  # noqa: BLE001 - not JSON (NaN, an object, too deep): stored as its repr
            return "failed", json.dumps(repr(e.result))
    # MaybeApplied, and every other exception: the function may have done its work first.
    return "ambiguous", f"{type(e).__name__}: {e}"[:500]


def _note(e: BaseException, recorded: BaseException) -> None:
    """Adds what went wrong while recording the function's own exception to it."""
    if isinstance(recorded, (NotApplied, OutcomeUnknown)):
        return  # what was reported: the key was released, or the record is unknown
    e.add_note(f"idemgate: recording this outcome failed too: {type(recorded).__name__}: {recorded}")


def _unrecordable(tool: str, e: Exception) -> TypeError:
    return TypeError(
        f"{tool}: the function ran, but its return value cannot be stored as JSON (dict with str "
        f"keys, list, tuple, str, int, finite float, bool, None), so the record is now unknown "
        f"(resolve it with `idemgate keys resolve`): {type(e).__name__}: {e}"
    )


def _not_json(kind: str, e: Exception) -> str:
    """Why a ticket is finished ``ambiguous`` when its outcome cannot be stored as JSON."""
    what = "return value" if kind == "success" else "failure's result"
    return f"the {what} is not JSON: {type(e).__name__}: {e}"[:500]


def _finish(
    native: _native.Engine, begun: Ticket, kind: str, body: str, quiet: bool = False
) -> _native.Answer | None:
    """``native.finish`` (``quiet``: no answer made, for a caller that discards it); when the
    engine cannot read ``body`` as JSON (a ``ValueError``, raised before the ticket is used), the
    record is made unknown at once, since the function ran, and the error re-raised: never left
    in flight until its lease runs out."""
    try:
        return native.finish(begun, kind, body, quiet=quiet)
    except ValueError as e:
        _finish_unknown(native, begun, _not_json(kind, e))
        raise


def _finish_unknown(native: _native.Engine, begun: Ticket, why: str) -> None:
    """Marks the record of a function that ran unknown (a journaled or failed write ends the same:
    the record is unknown when its lease runs out, the heartbeat stopped)."""
    try:
        native.finish(begun, "ambiguous", why, quiet=True)
    except Exception:  # noqa: BLE001, S110 - unknown either way
        pass


# Native engines still open, closed at exit: at interpreter exit (before it starts shutting down)
# each runtime is stopped while its threads may still take the GIL, so none is inside Python when
# the interpreter finalizes, which aborted async programs at exit (PyGILState_Release, exit 134).
# The native engines, not these wrappers: an answer still on its way holds the native one after
# its wrapper is gone.
_OPEN: weakref.WeakSet[_native.Engine] = weakref.WeakSet()


@atexit.register
def _close_open_engines() -> None:
    for engine in list(_OPEN):
        engine.close()
    if _TRACING:
        _native.Engine.flush_traces()


# Whether idemgate's spans are exported (the OTEL_* variables point at a collector; read when the
# first engine opens). Only then is the caller's current span read for each call.
_TRACING = False
_NO_TRACE: tuple[str | None, str | None] = (None, None)


def _caller_trace() -> tuple[str | None, str | None]:
    """The W3C ``traceparent`` and ``tracestate`` of OpenTelemetry's current span, when the
    ``opentelemetry-api`` package is installed and a valid span is current: idemgate's spans for
    the call are then its children."""
    try:
        trace = importlib.import_module("opentelemetry.trace")
    except ImportError:
        return _NO_TRACE
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return _NO_TRACE
    state = context.trace_state.to_header() if context.trace_state else ""
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    return parent, state or None


def _enter_effect(begun: Ticket) -> Any:
    """Makes the ticket's ``idemgate.effect`` span OpenTelemetry's current span while the
    function runs, so the spans it makes (its HTTP client's, its own, a nested idemgate call's)
    are the effect's children; a token for :func:`_leave_effect`, or ``None``."""
    parent = begun.traceparent
    if parent is None:
        return None
    try:
        trace = importlib.import_module("opentelemetry.trace")
        context = importlib.import_module("opentelemetry.context")
    except ImportError:
        return None
    _, trace_id, span_id, flags = parent.split("-")
    effect = trace.NonRecordingSpan(
        trace.SpanContext(
            int(trace_id, 16),
            int(span_id, 16),
            is_remote=False,
            trace_flags=trace.TraceFlags(int(flags, 16)),
        )
    )
    return context.attach(trace.set_span_in_context(effect))


def _leave_effect(token: Any) -> None:
    if token is not None:
        importlib.import_module("opentelemetry.context").detach(token)


class Engine:
    """The idemgate engine over one store, in this process.

    Open it with :meth:`Engine.open`. ``tools`` maps tool names to their :class:`Policy` (or a
    dict of its fields); other tools get ``default`` (a write with the engine's defaults: TTL 24 h,
    tombstone 30 days, lease 30 s, wait 5 s, no fallback window, ``on_unknown="block"``).
    """

    def __init__(
        self,
        native: _native.Engine,
        tools: Mapping[str, Policy | Mapping[str, Any]] | None = None,
        default: Policy | None = None,
    ) -> None:
        self.native = native
        self.default = default or Policy()
        self.tools: dict[str, Policy] = {
            name: p if isinstance(p, Policy) else Policy(**p) for name, p in (tools or {}).items()
        }
        self._overridden: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[Policy, Policy]] = {}
        _OPEN.add(native)
        global _TRACING
        _TRACING = _native.Engine.tracing()

    def close(self) -> None:
        """Stops the engine's runtime, waiting (up to 5 s) for what its threads are doing;
        later calls raise ``RuntimeError``. Every engine still open is closed when the interpreter
        exits (a runtime thread entering Python while the interpreter shuts down would abort the
        process). Closing twice does nothing."""
        self.native.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        journal: str | None = None,
        tenant: str = "default",
        tools: Mapping[str, Policy | Mapping[str, Any]] | None = None,
        default: Policy | None = None,
        worker_threads: int = 2,
        verifiers: Mapping[str, Callable[[str, str, str], Any]] | None = None,
    ) -> Engine:
        """Opens the store at ``url``: ``sqlite:///path``, ``postgres://…``, ``redis://…`` or
        ``memory:``; default the SQLite file every ``idemgate`` command uses
        (``$XDG_DATA_HOME/idemgate/idemgate.db``). The journal of outcomes the store did not
        confirm is ``journal``, else beside the SQLite file as the command line keeps it.

        Raises ``StoreMisconfigured`` (a ``ValueError``) when the URL or the store is set up
        wrong (a misspelt scheme such as ``sqlit://``, a URL its store cannot read, an unknown
        option, a SQLite file in a missing directory...): retrying cannot help. Raises
        ``StoreUnavailable`` when the store cannot be reached. Messages never show the URL's
        password.

        ``verifiers`` maps tool names to a function ``verify(tool, key, downstream_key)`` asked
        when a call finds the tool's record *unknown* under ``on_unknown="verify"`` (the function
        may or may not have done its work), to look the side effect up downstream, typically by
        ``downstream_key`` (what :func:`current_key` gave the function). It answers as a tool
        function does: it returns the result the side effect had (stored and replayed, marked
        verified), raises ``Failed(result)`` (a terminal failure, stored), ``NotApplied`` (it
        did not happen: the call runs now) or ``MaybeApplied`` (still cannot tell: the record
        stays unknown, as it does when the verifier raises anything else). It runs on a thread
        of the engine's, not the caller's."""
        native = _native.Engine.open(
            url,
            journal=journal,
            tenant=tenant,
            worker_threads=worker_threads,
            verifiers=dict(verifiers or {}),
        )
        return cls(native, tools, default)

    @property
    def url(self) -> str:
        """The store's URL."""
        return self.native.url

    @property
    def tenant(self) -> str:
        """The tenant whose records this engine reads and writes."""
        return self.native.tenant

    def policy(self, tool: str, **overrides: Unpack[PolicyOptions]) -> Policy:
        """The policy of ``tool``, with ``overrides`` (:class:`PolicyOptions`; ``None`` keeps the
        configured value)."""
        return self._policy(tool, overrides)

    def _policy(self, tool: str, overrides: Mapping[str, Any]) -> Policy:
        base = self.tools.get(tool, self.default)
        if not overrides:
            return base
        # Cached per (tool, overrides as given): building a Policy per call costs more than the
        # engine's whole replay. Checked against the base policy itself, so a changed
        # `tools`/`default` is seen.
        given: Any = (tool, tuple(overrides.items()))
        try:
            cached = self._overridden.get(given)
        except TypeError:  # an unhashable value: Policy says what is wrong with it
            cached = given = None
        if cached is not None and cached[0] is base:
            return cached[1]
        fields = given_policy(overrides)
        policy = Policy(**({k: getattr(base, k) for k in _POLICY_FIELDS} | fields)) if fields else base
        if given is not None:
            if len(self._overridden) >= _OVERRIDDEN_MAX:
                self._overridden.clear()
            self._overridden[given] = (base, policy)
        return policy

    def key_for(
        self,
        tool: str,
        key: str | None = None,
        args: Any = None,
        *,
        scope: str | None = None,
        **overrides: Unpack[PolicyOptions],
    ) -> dict[str, Any] | None:
        """The record a call would be judged by, exactly as the Rust ``Engine::key_for`` names it
        (``tenant``, ``tool``, ``key``, ``rule``, ``ttl``, ``digest``); ``None`` for reads and
        naturally idempotent tools. Raises ``KeyRequired`` for a write without key or fallback."""
        return self.native.key_for(tool, key, args, self.policy(tool, **overrides), scope=scope)

    def record(self, tool: str, key: str) -> dict[str, Any] | None:
        """The record of ``(tool, key)`` (``state``, ``fence``, ``outcome``...), or ``None``.
        It tells its story from the store: ``downstream_key`` (what to search for at the
        provider), ``reason`` (why an unknown record is unknown) and ``history`` (its steps, oldest
        first: reserved, completed, why it became unknown, who resolved or reopened it and why)."""
        text = self.native.record(tool, key)
        return None if text is None else json.loads(text)

    def records(
        self,
        state: RecordState | None = None,
        tool: str | None = None,
        limit: int = 0,
        scope: str | None = None,
    ) -> list[dict[str, Any]]:
        """This tenant's records, oldest first, each as :meth:`record` shows it: only those in
        ``state`` (``in_flight``, ``completed``, ``unknown``), only ``tool``'s, only those made
        in ``scope`` (the conversation an integration named, shown as the record's ``scope``),
        at most ``limit`` (0: all). The HTTP client's ``records``, in-process;
        ``records("unknown")`` lists what an operator must resolve."""
        return [json.loads(r) for r in self.native.records(tool, state, limit, scope)]

    def resolve(
        self,
        tool: str,
        key: str,
        fence: int,
        resolution: Resolution,
        result: Any = None,
        failed: bool = False,
        *,
        reason: str | None = None,
        by: str | None = None,
    ) -> dict[str, Any] | None:
        """Resolves an unknown record as an operator decided, if its ``fence`` (from
        :meth:`record` or :meth:`records`) is still the one looked at: ``resolution="completed"``
        with the ``result`` the side effect had (JSON data; ``failed=True``: a terminal failure),
        stored for the tool's TTL and replayed marked as an operator's resolution, or
        ``"release"`` (it did not happen: the next call runs). ``reason`` and ``by`` (default:
        the OS user) go into the audit log. Returns the record after (``None`` once released);
        raises ``NotFound``, ``NotResolvable`` (not unknown, or its fence moved on) or
        ``StoreUnavailable``. The HTTP client's ``resolve`` (the same arguments) and
        ``idemgate keys resolve``, in-process."""
        text = None if resolution == "release" and result is None else _json_text(result)
        after = self.native.resolve(
            tool, key, fence, resolution, text, failed, self.policy(tool).ttl,
            by=_who(by), reason=reason,
        )
        return None if after is None else json.loads(after)

    def reopen(
        self, tool: str, key: str, fence: int, *, reason: str, by: str | None = None
    ) -> Literal["completed", "expired", "unknown"]:
        """Reopens a completed, expired or unknown record, if its ``fence`` (from :meth:`record`,
        :meth:`records` or ``OutcomeExpired.fence``) is still the one looked at, so that the next
        call with this key runs the action again: the one way a stored outcome stops answering
        before it expires, or a tombstone (a retry past the ``ttl`` raising ``OutcomeExpired``)
        before it goes, for an action that must be done again (the payment was refunded, the
        mail bounced). ``reason`` and ``by`` (default: the OS user) go into the audit log.
        Returns the state the record had (``"completed"``, ``"expired"`` or ``"unknown"``);
        raises ``NotFound``, ``NotResolvable`` (in flight, where reopening could run it twice,
        or its fence moved on) or ``StoreUnavailable``. Other processes' engines may replay their copy of a completed
        record for up to 2 s more. ``idemgate keys reopen``, in-process."""
        return self.native.reopen(tool, key, fence, by=_who(by), reason=reason)

    def flush_journal(self) -> tuple[int, int, int]:
        """Replays journaled outcomes into the store now (the engine also does it every few
        seconds): ``(applied, superseded, pending)``."""
        return self.native.flush_journal()

    # ---- sync ----------------------------------------------------------------------------------

    def call(
        self,
        tool: str,
        key: str | None,
        args: Any,
        fn: Callable[[], Any],
        /,
        *,
        scope: str | None = None,
        call_id: str | None = None,
        **overrides: Unpack[PolicyOptions],
    ) -> Result:
        """Runs ``fn()`` at most once for ``(tool, key)`` and says what happened.

        ``scope`` names where the call was made (a conversation, a thread): a call without key
        is joined by the tool's ``fallback_window`` only to identical calls of the same scope,
        never to another conversation's. A key is not scoped: it names the action everywhere.
        ``call_id``: the model's tool call id, for the call's span (``gen_ai.tool.call.id``) when
        traces are exported (docs/OPERATIONS.md).

        ``args`` (JSON) are fingerprinted: the same key with other arguments raises ``KeyReused``.
        A replay returns the stored value without calling ``fn``; a racing call waits up to the
        policy's ``wait`` for it, then raises ``InFlight``; an unknown outcome raises
        ``OutcomeUnknown`` (the first time after up to 2 s, see the module documentation); a
        retry past the policy's ``ttl`` and within its ``tombstone`` raises ``OutcomeExpired``
        (the action ran, its result is no longer kept; nothing runs). See the module documentation for what ``fn`` may raise and return
        (JSON types; anything else raises ``TypeError`` and the record is unknown at once).
        """
        parent, state = _caller_trace() if _TRACING else _NO_TRACE
        begun = self.native.begin(
            tool,
            key,
            args,
            self._policy(tool, overrides),
            scope=scope,
            traceparent=parent,
            tracestate=state,
            call_id=call_id,
            within_observed=_OBSERVED_TOOL.get() == tool,
        )
        if begun is None:
            return _passed_through(fn())
        if isinstance(begun, Result):
            return begun  # a replay
        if isinstance(begun, Observed):
            return _passed_through(_observed(tool, begun, fn), begun.would)
        return cast(Result, self._run(tool, begun, False, fn))

    def _run(
        self, tool: str, begun: Ticket, quiet: bool, fn: Callable[..., Any], /, *a: Any, **kw: Any
    ) -> Any:
        """Runs ``fn(*a, **kw)`` under the ticket ``begun`` and records what it did; returns its
        :class:`Result`, or (``quiet``: a decorated function's call) the value alone, the answer
        not even made. What :meth:`call` and ``@idempotent`` do once a call may run."""
        native = self.native
        current = _CURRENT_KEY.set(begun.digest)
        effect = _enter_effect(begun) if _TRACING else None
        try:
            value = fn(*a, **kw)
        except BaseException as e:
            kind, body = _report(e)
            try:  # the answer is discarded: the function's exception is raised
                _finish(native, begun, kind, body, quiet=True)
            except Exception as recorded:  # noqa: BLE001 - the function's own exception wins
                _note(e, recorded)
            raise
        finally:
            _leave_effect(effect)
            _CURRENT_KEY.reset(current)
        try:
            text = _json_text(value)
        except Exception as e:  # noqa: BLE001 - TypeError; ValueError (NaN, infinities, a cycle); RecursionError
            _finish_unknown(native, begun, _not_json("success", e))
            raise _unrecordable(tool, e) from e
        try:
            answer = _finish(native, begun, "success", text, quiet)
        except OutcomeNotRecorded as e:
            e.result = value
            raise
        except ValueError as e:  # the engine could not read the text: the record is unknown now
            raise _unrecordable(tool, e) from e
        return value if answer is None else answer.result(value)

    # ---- async ---------------------------------------------------------------------------------

    def _future(self, start: Callable[[Callable[[bool, Any], None]], None]) -> asyncio.Future[Any]:
        """Runs a native ``*_async`` call and returns an asyncio future of its answer."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        native = self.native
        loop_thread = threading.get_ident()

        def abandon(value: Any) -> None:
            # The awaiting task went away before the function ran: free the key at once.
            if isinstance(value, Ticket):
                native.finish_async(
                    value, "not_applied", "the caller was cancelled before it ran", _ignore
                )

        def settle(ok: bool, value: Any) -> None:
            if fut.done():
                if ok:
                    abandon(value)
            elif ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

        def done(ok: bool, value: Any) -> None:
            if threading.get_ident() == loop_thread:
                # Answered at once, within `start` (the memory store): no hand-off needed.
                settle(ok, value)
                return
            try:
                loop.call_soon_threadsafe(settle, ok, value)
            except RuntimeError:  # the loop is closed
                if ok:
                    abandon(value)

        start(done)
        return fut

    async def acall(
        self,
        tool: str,
        key: str | None,
        args: Any,
        fn: Callable[[], Awaitable[Any] | Any],
        /,
        *,
        scope: str | None = None,
        call_id: str | None = None,
        **overrides: Unpack[PolicyOptions],
    ) -> Result:
        """As :meth:`call`, for a coroutine function (or any function returning an awaitable):
        the store is awaited on the engine's runtime, never blocking the event loop. Cancelling
        the task while ``fn`` runs counts as an exception (the record becomes unknown);
        cancelling it while the key is being reserved frees the key."""
        native = self.native
        policy = self._policy(tool, overrides)
        parent, state = _caller_trace() if _TRACING else _NO_TRACE
        begun = await self._future(
            lambda done: native.begin_async(
                tool,
                key,
                args,
                policy,
                done,
                scope=scope,
                traceparent=parent,
                tracestate=state,
                call_id=call_id,
                within_observed=_OBSERVED_TOOL.get() == tool,
            )
        )
        if begun is None:
            value = fn()
            return _passed_through(await value if inspect.isawaitable(value) else value)
        if isinstance(begun, Result):
            return begun  # a replay
        if isinstance(begun, Observed):
            return _passed_through(await _aobserved(tool, begun, fn), begun.would)
        return cast(Result, await self._arun(tool, begun, False, fn))

    async def _arun(
        self, tool: str, begun: Ticket, quiet: bool, fn: Callable[..., Any], /, *a: Any, **kw: Any
    ) -> Any:
        """As :meth:`_run`, awaiting ``fn(*a, **kw)`` when it gives an awaitable, and the store
        on the engine's runtime: what :meth:`acall` and ``@idempotent`` on ``async def`` do once
        a call may run."""
        current = _CURRENT_KEY.set(begun.digest)
        effect = _enter_effect(begun) if _TRACING else None
        try:
            value = fn(*a, **kw)
            if inspect.isawaitable(value):
                value = await value
        except BaseException as e:
            kind, body = _report(e)
            try:  # the answer is discarded: the function's exception is raised
                await self._afinish(begun, kind, body, quiet=True)
            except Exception as recorded:  # noqa: BLE001 - the function's own exception wins
                _note(e, recorded)
            raise
        finally:
            _leave_effect(effect)
            _CURRENT_KEY.reset(current)
        try:
            out = _json_text(value)
        except Exception as e:  # noqa: BLE001 - TypeError; ValueError (NaN, infinities, a cycle); RecursionError
            await self._afinish_unknown(begun, _not_json("success", e))
            raise _unrecordable(tool, e) from e
        try:
            answer = await self._afinish(begun, "success", out, quiet=quiet)
        except OutcomeNotRecorded as e:
            e.result = value
            raise
        except ValueError as e:  # the engine could not read the text: the record is unknown now
            raise _unrecordable(tool, e) from e
        return value if answer is None else answer.result(value)

    async def _afinish(
        self, begun: Ticket, kind: str, body: str, quiet: bool = False
    ) -> _native.Answer | None:
        """As :func:`_finish`, on the engine's runtime."""
        native = self.native
        try:
            answer = await self._future(
                lambda done: native.finish_async(begun, kind, body, done, quiet=quiet)
            )
            return cast("_native.Answer | None", answer)
        except ValueError as e:
            await self._afinish_unknown(begun, _not_json(kind, e))
            raise

    async def _afinish_unknown(self, begun: Ticket, why: str) -> None:
        """As :func:`_finish_unknown`, on the engine's runtime: the record is unknown (or its
        write failed) when this returns, before the caller is answered."""
        native = self.native
        try:
            await self._future(
                lambda done: native.finish_async(begun, "ambiguous", why, done, quiet=True)
            )
        except Exception:  # noqa: BLE001, S110 - unknown either way
            pass

    def __repr__(self) -> str:
        return f"Engine({self.url!r}, tenant={self.tenant!r})"


def _ignore(ok: bool, value: Any) -> None:
    pass


class IdempotentFunction(Protocol[P, R_co]):
    """What ``@idempotent(engine, ...)`` makes of a plain function: called with the function's
    own parameters, it returns its value (a replay: the stored one); ``result(...)`` makes the
    same call and returns the whole :class:`Result`."""

    __name__: str
    __qualname__: str
    __doc__: str | None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def result(self, *args: P.args, **kwargs: P.kwargs) -> Result: ...

    # A decorated method, got from an instance: a bound method. Its ``result`` is the function's
    # own, unbound (``type(obj).method.result(obj, ...)``), so the bound type has none.
    @overload
    def __get__(self, instance: None, owner: type[Any], /) -> Self: ...
    @overload
    def __get__(
        self: IdempotentFunction[Concatenate[_S, _P2], _R2],
        instance: _S,
        owner: type[Any] | None = None,
        /,
    ) -> Callable[_P2, _R2]: ...


class AsyncIdempotentFunction(Protocol[P, R_co]):
    """What ``@idempotent(engine, ...)`` makes of an ``async def`` function: awaited, its value
    (a replay: the stored one); ``await f.result(...)``: the same call's whole :class:`Result`."""

    __name__: str
    __qualname__: str
    __doc__: str | None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R_co]: ...

    def result(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, Result]: ...

    @overload
    def __get__(self, instance: None, owner: type[Any], /) -> Self: ...
    @overload
    def __get__(
        self: AsyncIdempotentFunction[Concatenate[_S, _P2], _R2],
        instance: _S,
        owner: type[Any] | None = None,
        /,
    ) -> Callable[_P2, Coroutine[Any, Any, _R2]]: ...


class IdempotentDecorator(Protocol):
    """The decorator ``idempotent(engine, ...)`` returns: ``async def`` functions become an
    :class:`AsyncIdempotentFunction`, plain ones an :class:`IdempotentFunction`, with the
    function's parameters."""

    # An `async def` function matches both overloads (a coroutine is a value too): the first,
    # made for it, wins, which is the overlap the checkers are told to accept.
    @overload
    def __call__(  # type: ignore[overload-overlap]  # pyright: ignore[reportOverlappingOverload]
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> AsyncIdempotentFunction[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> IdempotentFunction[P, R]: ...


def idempotent(
    engine: Engine,
    tool: str | None = None,
    key: Callable[..., str | None] | None = None,
    *,
    args: Callable[..., Any] | None = None,
    **policy: Unpack[PolicyOptions],
) -> IdempotentDecorator:
    """Makes a function run at most once per idempotency key, in-process.

    ``tool`` names it (default: the function's ``__name__``); ``key(*a, **kw)`` names the logical
    action of a call (a tool-call id, ``derive_key(run_id, step)``; ``None`` uses the tool's
    fallback window if it has one, else raises ``KeyRequired``); ``args(*a, **kw)`` gives the JSON
    arguments that are fingerprinted (default: all of them). The keyword arguments of
    :class:`PolicyOptions` (``kind``, ``ttl``, ``tombstone``, ``lease``, ``wait``,
    ``fallback_window``, ``on_unknown``, ``identity``, ``mode``) override the engine's policy for the tool. Plain functions return their value (a replay returns the stored one);
    ``async def`` functions are awaited (see :meth:`Engine.acall`). ``f.result(...)`` (awaited
    for ``async def``) makes the same call and returns the whole :class:`Result`, for a caller
    that must tell a replay from a run (``replayed``, ``executed_at``) without changing what
    ``f(...)`` returns.
    """
    # Only the fields set: a call with none passes no overrides and takes the policy as it is.
    overrides = given_policy(policy)

    @overload
    def decorate(  # type: ignore[overload-overlap]  # pyright: ignore[reportOverlappingOverload]
        fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> AsyncIdempotentFunction[P, R]: ...
    @overload
    def decorate(fn: Callable[P, R], /) -> IdempotentFunction[P, R]: ...
    def decorate(fn: Callable[..., Any], /) -> Any:
        name = tool or fn.__name__
        engine.policy(name, **overrides)  # refuse bad settings at decoration time
        native = engine.native
        # The tool's policy with these overrides, resolved once and kept while the engine's policy
        # for the tool is the same object (a changed `tools`/`default` is seen at the next call).
        held: list[tuple[Policy | None, Policy]] = [(None, engine.default)]

        def policy_now() -> Policy:
            base = engine.tools.get(name, engine.default)
            seen, resolved = held[0]
            if base is not seen:
                resolved = engine._policy(name, overrides)
                held[0] = (base, resolved)
            return resolved

        def prepare(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[str | None, Any]:
            k = key(*a, **kw) if key is not None else None
            payload = args(*a, **kw) if args is not None else _default_args(a, kw)
            return k, payload

        if inspect.iscoroutinefunction(fn):

            async def aresult(*a: Any, **kw: Any) -> Result:
                k, payload = prepare(a, kw)
                return await engine.acall(name, k, payload, lambda: fn(*a, **kw), **overrides)

            @functools.wraps(fn)
            async def awrapper(*a: Any, **kw: Any) -> Any:
                # `(await aresult(...)).value`, through the lean halves, as `wrapper` below.
                k = key(*a, **kw) if key is not None else None
                payload = args(*a, **kw) if args is not None else _default_args(a, kw)
                policy = policy_now()
                parent, state = _caller_trace() if _TRACING else _NO_TRACE
                begun = await engine._future(
                    lambda done: native.begin_async(
                        name,
                        k,
                        payload,
                        policy,
                        done,
                        value=True,
                        traceparent=parent,
                        tracestate=state,
                    )
                )
                if type(begun) is Ticket:
                    return await engine._arun(name, begun, True, fn, *a, **kw)
                if begun is _PASSED_THROUGH:
                    return await fn(*a, **kw)
                if type(begun) is Observed:
                    return await _aobserved(name, begun, fn, *a, **kw)
                return begun  # a replay's stored value

            setattr(awrapper, "result", aresult)  # noqa: B010 - a function's attribute
            return awrapper

        def result(*a: Any, **kw: Any) -> Result:
            k, payload = prepare(a, kw)
            return engine.call(name, k, payload, lambda: fn(*a, **kw), **overrides)

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            # `result(...).value`, without the `Result`: a replay's stored value comes from the
            # native module as it is, and a run's answer is not made (`_run`'s `quiet`).
            k = key(*a, **kw) if key is not None else None
            payload = args(*a, **kw) if args is not None else _default_args(a, kw)
            if _TRACING:
                parent, state = _caller_trace()
                begun = native.begin(
                    name,
                    k,
                    payload,
                    policy_now(),
                    value=True,
                    traceparent=parent,
                    tracestate=state,
                )
            else:
                begun = native.begin(name, k, payload, policy_now(), value=True)
            if type(begun) is Ticket:
                return engine._run(name, begun, True, fn, *a, **kw)
            if begun is _PASSED_THROUGH:
                return fn(*a, **kw)
            if type(begun) is Observed:
                return _observed(name, begun, fn, *a, **kw)
            return begun  # a replay's stored value

        setattr(wrapper, "result", result)  # noqa: B010 - a function's attribute
        return wrapper

    return decorate

