"""Type stubs of ``idemgate._native``, the Rust engine (crates/idemgate-python). Use it through
:class:`idemgate.Engine`; these are the building blocks."""

from collections.abc import Callable
from os import PathLike
from typing import Any, Literal, Sequence, final, overload

from ._literals import Mode, OnUnknown, RecordState, Resolution, ToolKind
from .engine import Result

PASSED_THROUGH: object
"""What ``Engine.begin(..., value=True)`` returns for a read or naturally idempotent tool: run it, nothing is
recorded."""

PROBLEM_TYPE_BASE: str
"""The base of every problem type URI (``idemgate_kit::PROBLEM_TYPE_BASE``)."""

@final
class Policy:
    """How one tool's calls are treated (``ToolPolicy``); durations in seconds."""

    def __init__(
        self,
        kind: ToolKind = "write",
        ttl: float = 86400.0,
        lease: float = 30.0,
        wait: float = 5.0,
        fallback_window: float | None = None,
        on_unknown: OnUnknown = "block",
        tombstone: float = 2592000.0,
        identity: Sequence[str] | None = None,
        mode: Mode = "enforce",
    ) -> None: ...
    @property
    def kind(self) -> ToolKind: ...
    @property
    def ttl(self) -> float: ...
    @property
    def tombstone(self) -> float:
        """How long after a call ran its record is remembered: a retry past the ttl and within
        this raises ``OutcomeExpired`` instead of running again (0: none)."""
    @property
    def lease(self) -> float: ...
    @property
    def wait(self) -> float: ...
    @property
    def fallback_window(self) -> float | None: ...
    @property
    def on_unknown(self) -> OnUnknown: ...
    @property
    def identity(self) -> list[str]:
        """The arguments that name the tool's action (names or JSON pointers): the window
        compares only these."""
    @property
    def mode(self) -> Mode:
        """``enforce``, or ``observe`` (shadow mode): every call runs, and what enforce mode
        would have done is recorded in the history of the record a call duplicates."""

@final
class Observed:
    """What ``begin`` answers in observe mode for a call enforce mode would have answered
    without running: run it (nothing is recorded of it); ``would`` is that verdict."""

    @property
    def would(self) -> str: ...
    @property
    def digest(self) -> str | None:
        """The downstream key of the record the call was named by (``current_key()``)."""

@final
class Ticket:
    """Permission to run one call's side effect; the engine renews its lease until ``finish``."""

    @property
    def key(self) -> str: ...
    @property
    def rule(self) -> str: ...
    @property
    def fence(self) -> int: ...
    @property
    def digest(self) -> str: ...
    @property
    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` to hand to what the function calls."""

@final
class Answer:
    """An answer that is a result (executed, replayed, passed through, not applied)."""

    verdict: str
    executed: bool
    replayed: bool
    executed_at_ms: int | None
    expires_at_ms: int | None
    rule: str | None
    key: str | None
    failed: bool
    content: str | None
    value_json: str | None
    recording: str | None
    message: str | None

    def stored_result(self) -> Result:
        """The package's ``Result`` with the stored value (a replay); a stored failure raises
        ``Failed(value, replayed=...)``."""
    def result(self, value: Any) -> Result:
        """The package's ``Result`` with ``value``, what the function returned (a stored failure
        raises ``Failed`` all the same)."""

Done = Callable[[bool, Any], None]

@final
class Engine:
    """The engine over one store, with its own tokio runtime and journal flusher."""

    @staticmethod
    def open(
        url: str | None = None,
        *,
        journal: str | PathLike[str] | None = None,
        tenant: str = "default",
        worker_threads: int = 2,
        verifiers: dict[str, Callable[[str, str, str], Any]] | None = None,
    ) -> Engine: ...
    @property
    def url(self) -> str: ...
    @property
    def journal(self) -> str | PathLike[str] | None: ...
    @property
    def tenant(self) -> str: ...
    def close(self) -> None: ...
    @staticmethod
    def tracing() -> bool: ...
    @staticmethod
    def flush_traces() -> None: ...
    @overload
    def begin(
        self,
        tool: str,
        key: str | None,
        args: Any,
        policy: Policy,
        *,
        scope: str | None = None,
        value: Literal[False] = False,
        traceparent: str | None = None,
        tracestate: str | None = None,
        call_id: str | None = None,
        within_observed: bool = False,
    ) -> Ticket | Result | Observed | None: ...
    @overload
    def begin(
        self,
        tool: str,
        key: str | None,
        args: Any,
        policy: Policy,
        *,
        scope: str | None = None,
        value: Literal[True],
        traceparent: str | None = None,
        tracestate: str | None = None,
        call_id: str | None = None,
        within_observed: bool = False,
    ) -> Any:
        """A ``Ticket``, ``PASSED_THROUGH``, an ``Observed`` or a replay's stored value."""
    @overload
    def finish(
        self, ticket: Ticket, effect_kind: str, body: str, *, quiet: Literal[False] = False
    ) -> Answer: ...
    @overload
    def finish(
        self, ticket: Ticket, effect_kind: str, body: str, *, quiet: bool
    ) -> Answer | None: ...
    def begin_async(
        self,
        tool: str,
        key: str | None,
        args: Any,
        policy: Policy,
        done: Done,
        *,
        scope: str | None = None,
        value: bool = False,
        traceparent: str | None = None,
        tracestate: str | None = None,
        call_id: str | None = None,
        within_observed: bool = False,
    ) -> None: ...
    def finish_async(
        self, ticket: Ticket, effect_kind: str, body: str, done: Done, *, quiet: bool = False
    ) -> None: ...
    def key_for(
        self, tool: str, key: str | None, args: Any, policy: Policy, *, scope: str | None = None
    ) -> dict[str, Any] | None: ...
    def record(self, tool: str, key: str) -> str | None: ...
    def records(
        self,
        tool: str | None = None,
        state: RecordState | None = None,
        limit: int = 0,
        scope: str | None = None,
    ) -> list[str]: ...
    def resolve(
        self,
        tool: str,
        key: str,
        fence: int,
        resolution: Resolution,
        result: str | None = None,
        failed: bool = False,
        ttl: float = 86400.0,
        by: str | None = None,
        reason: str | None = None,
    ) -> str | None: ...
    def reopen(
        self,
        tool: str,
        key: str,
        fence: int,
        by: str | None = None,
        reason: str | None = None,
    ) -> Literal["completed", "expired", "unknown"]: ...
    def flush_journal(self) -> tuple[int, int, int]: ...

def run_command(argv: list[str]) -> int: ...
def derive_key(run_id: str, step: str) -> str: ...
def name_action(
    *,
    scope: str | None = None,
    orchestration_key: str | None = None,
    business_key: str | None = None,
    model_key: str | None = None,
    call_id: str | None = None,
) -> tuple[str | None, str | None, str, bool]: ...
def invocation_scope() -> str: ...
def mint_key() -> str: ...
def check_key(key: str) -> str: ...
def fingerprint(args: str) -> str: ...
def fingerprint_args(args: Any) -> str: ...
