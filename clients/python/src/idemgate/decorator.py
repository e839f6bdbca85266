"""``@idempotent``: run a tool function at most once per key, through the gateway: plain functions
with a :class:`Client`, ``async def`` functions with an :class:`AsyncClient`."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

from .client import AsyncClient, Begin, Client
from .errors import (
    Failed,
    GatewayUnreachable,
    InFlight,
    LeaseLost,
    NotApplied,
    OutcomeNotRecorded,
    StoreUnavailable,
)

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["idempotent"]


def _default_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The arguments as JSON (what the gateway fingerprints): positional and keyword arguments,
    with values JSON cannot hold written as their ``repr``."""
    return json.loads(json.dumps({"args": list(args), "kwargs": kwargs}, default=repr))


class _Heartbeat:
    """Renews a lease every ``every`` seconds in a daemon thread until stopped."""

    def __init__(self, client: Client, tool: str, key: str, lease: str, every: float) -> None:
        self.client, self.tool, self.key, self.lease, self.every = client, tool, key, lease, every
        self.stopped = threading.Event()
        self.lost: LeaseLost | None = None
        self.beats = 0
        self.thread = threading.Thread(target=self._run, name=f"idemgate-heartbeat-{key}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                self.client.heartbeat(self.tool, self.key, self.lease)
                self.beats += 1
            except LeaseLost as e:
                self.lost = e
                return
            except Exception:  # noqa: BLE001 - a missed beat is retried at the next tick
                continue


def _heartbeat_interval(begin: Begin, every: float | None) -> float | None:
    if every is not None:
        return every if every > 0 else None
    if begin.lease_until is None:
        return None
    remaining = (begin.lease_until - datetime.now(timezone.utc)).total_seconds()
    # A third of the lease, as the engine does; never busier than 20 times a second.
    return max(remaining / 3.0, 0.05)


def idempotent(
    client: Client | AsyncClient,
    tool: str,
    key: Callable[..., str],
    *,
    args: Callable[..., Any] | None = None,
    heartbeat_every: float | None = None,
    wait_in_flight: float = 30.0,
    record_retries: int = 3,
) -> Callable[[F], F]:
    """Makes a tool function run at most once per idempotency key.

    ``key(*a, **kw)`` names the logical action of a call (use ``derive_key(run_id, step)`` or
    a tool-call id); ``args(*a, **kw)`` gives the JSON arguments that the gateway fingerprints
    (default: all arguments), so the same key with other arguments raises ``KeyReused``.

    For each call: ``begin`` at the gateway, then

    - **execute**: run the function (renewing the lease in a background thread every
      ``heartbeat_every`` seconds, default a third of the lease; ``0`` turns it off) and store its
      JSON-serializable return value. If the function raises ``NotApplied`` (nothing happened),
      the key is released and the exception re-raised, so a retry runs. If it raises
      ``Failed(result)``, the failure is stored (and replayed) and re-raised. Any other exception
      may have left an effect: the record becomes unknown and the exception is re-raised.
    - **replayed**: return the stored result without running the function (a stored failure
      raises ``Failed(result, replayed=True)``).
    - **in flight** elsewhere: try again until ``wait_in_flight`` seconds have passed, then raise
      ``InFlight``.
    - **unknown**: raise ``OutcomeUnknown`` (an operator or verifier resolves it).

    With an :class:`AsyncClient` it wraps ``async def`` functions, with the same semantics (the
    lease renewed by a task, in-flight waits by ``asyncio.sleep``); with a :class:`Client`, plain
    functions.
    """
    if isinstance(client, AsyncClient):
        return _async_idempotent(
            client,
            tool,
            key,
            args=args,
            heartbeat_every=heartbeat_every,
            wait_in_flight=wait_in_flight,
            record_retries=record_retries,
        )

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                "@idempotent with a Client wraps plain functions; use an AsyncClient for async def"
            )

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            k = key(*a, **kw)
            payload = args(*a, **kw) if args is not None else _default_args(a, kw)
            begin = _begin(client, tool, k, payload, wait_in_flight)
            if begin.pass_through:
                return fn(*a, **kw)
            if begin.replayed:
                outcome = begin.outcome
                if outcome is not None and outcome.failed:
                    raise Failed(outcome.result, replayed=True)
                return outcome.result if outcome is not None else None
            if not begin.execute or begin.lease is None:
                raise RuntimeError(f"unexpected begin decision {begin.decision!r}")
            lease = begin.lease
            rkey = begin.key or k
            interval = _heartbeat_interval(begin, heartbeat_every)
            hb = _Heartbeat(client, tool, rkey, lease, interval) if interval else None
            try:
                if hb is not None:
                    hb.start()
                try:
                    value = fn(*a, **kw)
                finally:
                    if hb is not None:
                        hb.stop()
            except NotApplied as e:
                _retrying(record_retries, lambda: client.release(tool, rkey, lease, str(e) or "not applied"))
                raise
            except Failed as e:
                _retrying(record_retries, lambda: client.complete(tool, rkey, lease, e.result, failed=True))
                raise
            except BaseException as e:
                reason = f"{type(e).__name__}: {e}"[:500]
                try:
                    _retrying(record_retries, lambda: client.ambiguous(tool, rkey, lease, reason))
                except Exception:  # noqa: BLE001 - the lease runs out and the record goes unknown anyway
                    pass
                raise
            try:
                _retrying(record_retries, lambda: client.complete(tool, rkey, lease, value))
            except (GatewayUnreachable, StoreUnavailable) as e:
                raise OutcomeNotRecorded(
                    f"{tool}: the function ran but its outcome could not be recorded: {e}", value, e
                ) from e
            return value

        return wrapper  # type: ignore[return-value]

    return decorate


def _begin(client: Client, tool: str, key: str, payload: Any, wait_in_flight: float) -> Begin:
    deadline = time.monotonic() + wait_in_flight
    while True:
        try:
            return client.begin(tool, key, payload)
        except InFlight as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(max(e.retry_after or 0.1, 0.05), left, 1.0))


def _retrying(attempts: int, write: Callable[[], Any]) -> Any:
    """Runs a write after the effect, again on transport or store trouble (bounded backoff)."""
    delay = 0.1
    for attempt in range(max(attempts, 1)):
        try:
            return write()
        except (GatewayUnreachable, StoreUnavailable):
            if attempt + 1 >= attempts:
                raise
            time.sleep(delay)
            delay *= 2
    return None


# ---- asyncio ------------------------------------------------------------------------------------


def _async_idempotent(
    client: AsyncClient,
    tool: str,
    key: Callable[..., str],
    *,
    args: Callable[..., Any] | None,
    heartbeat_every: float | None,
    wait_in_flight: float,
    record_retries: int,
) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(
                "@idempotent with an AsyncClient wraps async def functions; use a Client otherwise"
            )

        @functools.wraps(fn)
        async def wrapper(*a: Any, **kw: Any) -> Any:
            k = key(*a, **kw)
            payload = args(*a, **kw) if args is not None else _default_args(a, kw)
            begin = await _abegin(client, tool, k, payload, wait_in_flight)
            if begin.pass_through:
                return await fn(*a, **kw)
            if begin.replayed:
                outcome = begin.outcome
                if outcome is not None and outcome.failed:
                    raise Failed(outcome.result, replayed=True)
                return outcome.result if outcome is not None else None
            if not begin.execute or begin.lease is None:
                raise RuntimeError(f"unexpected begin decision {begin.decision!r}")
            lease = begin.lease
            rkey = begin.key or k
            interval = _heartbeat_interval(begin, heartbeat_every)
            beat = (
                asyncio.ensure_future(_abeat(client, tool, rkey, lease, interval))
                if interval
                else None
            )
            try:
                try:
                    value = await fn(*a, **kw)
                finally:
                    if beat is not None:
                        beat.cancel()
                        await asyncio.gather(beat, return_exceptions=True)
            except NotApplied as e:
                reason = str(e) or "not applied"
                await _aretrying(record_retries, lambda: client.release(tool, rkey, lease, reason))
                raise
            except Failed as e:
                result = e.result
                await _aretrying(
                    record_retries, lambda: client.complete(tool, rkey, lease, result, failed=True)
                )
                raise
            except BaseException as e:
                # Cancelled too: the function may have done its work before it was stopped.
                reason = f"{type(e).__name__}: {e}"[:500]
                try:
                    await asyncio.shield(
                        _aretrying(record_retries, lambda: client.ambiguous(tool, rkey, lease, reason))
                    )
                except BaseException:  # noqa: BLE001, S110 - the lease runs out, the record goes unknown anyway
                    pass
                raise
            try:
                await _aretrying(record_retries, lambda: client.complete(tool, rkey, lease, value))
            except (GatewayUnreachable, StoreUnavailable) as e:
                raise OutcomeNotRecorded(
                    f"{tool}: the function ran but its outcome could not be recorded: {e}", value, e
                ) from e
            return value

        return wrapper  # type: ignore[return-value]

    return decorate


async def _abeat(client: AsyncClient, tool: str, key: str, lease: str, every: float) -> None:
    """Renews a lease every ``every`` seconds until cancelled (or the lease is lost)."""
    while True:
        await asyncio.sleep(every)
        try:
            await client.heartbeat(tool, key, lease)
        except LeaseLost:
            return
        except Exception:  # noqa: BLE001, S112 - a missed beat is retried at the next tick
            continue


async def _abegin(
    client: AsyncClient, tool: str, key: str, payload: Any, wait_in_flight: float
) -> Begin:
    deadline = time.monotonic() + wait_in_flight
    while True:
        try:
            return await client.begin(tool, key, payload)
        except InFlight as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            await asyncio.sleep(min(max(e.retry_after or 0.1, 0.05), left, 1.0))


async def _aretrying(attempts: int, write: Callable[[], Any]) -> Any:
    """As :func:`_retrying`, awaiting ``write()``."""
    delay = 0.1
    for attempt in range(max(attempts, 1)):
        try:
            return await write()
        except (GatewayUnreachable, StoreUnavailable):
            if attempt + 1 >= attempts:
                raise
            await asyncio.sleep(delay)
            delay *= 2
    return None
