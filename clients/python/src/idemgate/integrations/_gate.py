"""What every integration shares: a tool function gated by the in-process engine, keyed by the
framework's tool-call id, with the framework's own signature kept intact."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from typing import Any, Callable, TypeVar

from ..engine import Engine, Result

F = TypeVar("F", bound=Callable[..., Any])

#: Where MCP requests carry the idempotency key (``params._meta``), as ``idemgate mcp`` reads it.
KEY_META = "dev.idemgate/idempotency-key"

#: Calls still running after their caller was cancelled (a framework's tool timeout): kept
#: referenced until they finish and their outcome is stored.
_SHIELDED: set[asyncio.Task[Any]] = set()


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: pydantic models and dataclasses as their fields, anything else
    JSON cannot hold as its ``repr``. A tool's result goes through it before it is stored, so the
    first answer and every replay are the same data."""
    return json.loads(json.dumps(value, default=_default))


def _default(o: Any) -> Any:
    dump = getattr(o, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if hasattr(o, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(o)
    return repr(o)


def _retrieve(task: asyncio.Task[Any]) -> None:
    _SHIELDED.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: its outcome is in the store, nobody awaits it any more


async def acall(
    engine: Engine,
    tool: str,
    key: str | None,
    args: Any,
    fn: Callable[[], Any],
    overrides: dict[str, Any],
    shield: bool,
) -> Result:
    """``engine.acall(...)`` of ``fn`` (its value made JSON data). With ``shield``, cancelling the
    caller (a framework's tool timeout) does not cancel the call: it finishes in the background
    and its outcome is stored, so the retry with the same key waits for it and gets the replay
    (instead of a record left unknown by a function torn in half)."""

    async def call() -> Result:
        return await engine.acall(tool, key, args, lambda: _awaited(fn), **overrides)

    if not shield:
        return await call()
    task = asyncio.ensure_future(call())
    _SHIELDED.add(task)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


async def run_async(
    engine: Engine,
    tool: str,
    key: str | None,
    args: Any,
    fn: Callable[[], Any],
    overrides: dict[str, Any],
    shield: bool,
) -> Any:
    """The value of :func:`acall`."""
    return (await acall(engine, tool, key, args, fn, overrides, shield)).value


async def _awaited(fn: Callable[[], Any]) -> Any:
    value = fn()
    if inspect.isawaitable(value):
        value = await value
    return jsonable(value)


def gate(
    engine: Engine,
    fn: F,
    *,
    tool: str,
    key_of: Callable[[inspect.BoundArguments], str | None],
    exclude: set[str],
    shield: bool,
    overrides: dict[str, Any],
) -> F:
    """``fn`` run through ``engine`` under ``tool``: the key is ``key_of(bound arguments)``, the
    fingerprinted arguments are the call's minus ``exclude`` (the framework's context objects).
    The wrapper has ``fn``'s signature, name and docstring (``functools.wraps``), so a framework
    derives the same schema from it."""
    sig = inspect.signature(fn)
    given = {k: v for k, v in overrides.items() if v is not None}
    engine.policy(tool, **given)  # refuse bad settings now

    def prepare(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[str | None, Any]:
        bound = sig.bind(*a, **kw)
        bound.apply_defaults()
        payload = {k: v for k, v in bound.arguments.items() if k not in exclude}
        return key_of(bound), jsonable(payload)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*a: Any, **kw: Any) -> Any:
            key, payload = prepare(a, kw)
            return await run_async(engine, tool, key, payload, lambda: fn(*a, **kw), given, shield)

        return awrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        key, payload = prepare(a, kw)
        return engine.call(tool, key, payload, lambda: jsonable(fn(*a, **kw)), **given).value

    return wrapper  # type: ignore[return-value]


def policy_overrides(
    kind: str | None = None,
    ttl: float | None = None,
    lease: float | None = None,
    wait: float | None = None,
    fallback_window: float | None = None,
    on_unknown: str | None = None,
) -> dict[str, Any]:
    return dict(
        kind=kind,
        ttl=ttl,
        lease=lease,
        wait=wait,
        fallback_window=fallback_window,
        on_unknown=on_unknown,
    )


def context_param(fn: Callable[..., Any], what: str) -> str:
    """The name of ``fn``'s first parameter, where the framework passes its context."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(
            f"{getattr(fn, '__name__', fn)!r}: the first parameter must take the {what} "
            "(its tool-call id is the idempotency key)"
        )
    return params[0].name
