"""idemgate: run an AI agent's side-effecting tool calls at most once per idempotency key.

In-process (the Rust engine itself, no gateway)::

    from idemgate import Engine, NotApplied, idempotent

    engine = Engine.open()          # or "sqlite:///path", "postgres://…", "redis://…", "memory:"

    @idempotent(engine, key=lambda order, call_id: call_id)
    def charge(order: dict, call_id: str) -> dict:
        ...                         # runs once per call_id; a retry gets the stored result

    @idempotent(engine, key=lambda order, call_id: call_id)
    async def refund(order: dict, call_id: str) -> dict:
        ...

Through a remote gateway (``idemgate serve``), the same decorator with an HTTP
:class:`~idemgate.remote.Client` (also importable from :mod:`idemgate.remote`)::

    from idemgate import Client, idempotent

    client = Client("http://127.0.0.1:8080", token="...")

    @idempotent(client, "send_invoice", key=lambda run_id, step, invoice: derive_key(run_id, step))
    def send_invoice(run_id, step, invoice): ...

Both doors raise the same exceptions, all ``IdemgateError`` subclasses: ``InFlight``,
``OutcomeUnknown``, ``OutcomeExpired``, ``KeyReused``, ``KeyRequired``, ``StoreUnavailable``...;
a tool function raises ``NotApplied``, ``Failed`` or ``MaybeApplied`` to say what happened.
"""

from collections.abc import Callable, Coroutine
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from . import gateway_decorator as _gateway_decorator
from . import engine as _engine
from . import remote
from ._literals import Mode, OnUnknown, RecordState, Resolution, ToolKind
from .client import (
    AsyncClient,
    Begin,
    CallResult,
    Client,
    Completion,
    Outcome,
    Record,
    parse_time,
)
from .engine import (
    AsyncIdempotentFunction,
    Engine,
    IdempotentDecorator,
    IdempotentFunction,
    Policy,
    PolicyOptions,
    Result,
    current_key,
)
from .errors import (
    BadRequest,
    Conflict,
    Failed,
    GatewayTimeout,
    GatewayUnreachable,
    IdemgateError,
    InFlight,
    KeyRequired,
    KeyReused,
    LeaseLost,
    MaybeApplied,
    NotApplied,
    NotFound,
    NotResolvable,
    OutcomeExpired,
    OutcomeNotRecorded,
    OutcomeUnknown,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    StoreMisconfigured,
    StoreUnavailable,
    Unauthorized,
    UpstreamUnreachable,
)
from .keys import check_key, derive_key, mint_key

try:
    # One source: the version maturin gave the installed package, from crates/idemgate-python's
    # Cargo.toml (the workspace's version).
    __version__ = version("idemgate")
except PackageNotFoundError:  # the sources on sys.path without the package installed
    __version__ = "0+unknown"

_P = ParamSpec("_P")
_R = TypeVar("_R")


@overload
def idempotent(
    target: Engine,
    tool: str | None = None,
    key: Callable[..., str | None] | None = None,
    *,
    args: Callable[..., Any] | None = None,
    **policy: Unpack[PolicyOptions],
) -> IdempotentDecorator: ...
@overload
def idempotent(
    target: AsyncClient,
    tool: str,
    key: Callable[..., str],
    *,
    args: Callable[..., Any] | None = None,
    heartbeat_every: float | None = None,
    wait_in_flight: float = 30.0,
    record_retries: int = 3,
) -> Callable[[Callable[_P, Coroutine[Any, Any, _R]]], Callable[_P, Coroutine[Any, Any, _R]]]: ...
@overload
def idempotent(
    target: Client,
    tool: str,
    key: Callable[..., str],
    *,
    args: Callable[..., Any] | None = None,
    heartbeat_every: float | None = None,
    wait_in_flight: float = 30.0,
    record_retries: int = 3,
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]: ...
def idempotent(target: Engine | Client | AsyncClient, *args: Any, **kwargs: Any) -> Any:
    """Makes a tool function run at most once per idempotency key.

    With an :class:`Engine`, in-process (see :func:`idemgate.engine.idempotent`: ``tool``,
    ``key``, ``args``, ``kind``, ``ttl``, ``tombstone``, ``lease``, ``wait``, ``fallback_window``,
    ``on_unknown``; plain and ``async def`` functions). With a :class:`Client` (plain functions)
    or an :class:`AsyncClient` (``async def``), through the gateway (see
    :func:`idemgate.remote.idempotent`: ``tool``, ``key``, ``args``, ``heartbeat_every``,
    ``wait_in_flight``, ``record_retries``).
    """
    if isinstance(target, Engine):
        return _engine.idempotent(target, *args, **kwargs)
    return _gateway_decorator.idempotent(target, *args, **kwargs)


__all__ = [
    "AsyncClient",
    "AsyncIdempotentFunction",
    "BadRequest",
    "Begin",
    "CallResult",
    "Client",
    "Completion",
    "Conflict",
    "Engine",
    "Failed",
    "GatewayTimeout",
    "GatewayUnreachable",
    "IdemgateError",
    "IdempotentDecorator",
    "IdempotentFunction",
    "InFlight",
    "KeyRequired",
    "KeyReused",
    "LeaseLost",
    "MaybeApplied",
    "NotApplied",
    "NotFound",
    "NotResolvable",
    "Mode",
    "OnUnknown",
    "Outcome",
    "OutcomeExpired",
    "OutcomeNotRecorded",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "Policy",
    "PolicyOptions",
    "QuotaExceeded",
    "RateLimited",
    "Record",
    "RecordState",
    "Resolution",
    "Result",
    "StoreMisconfigured",
    "StoreUnavailable",
    "ToolKind",
    "Unauthorized",
    "UpstreamUnreachable",
    "check_key",
    "current_key",
    "derive_key",
    "idempotent",
    "mint_key",
    "parse_time",
    "remote",
]
