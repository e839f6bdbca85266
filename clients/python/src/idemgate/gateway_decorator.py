"""The HTTP gateway client's ``@idempotent`` (:func:`idemgate.remote.idempotent`, and
:func:`idemgate.idempotent` given a client): run a tool function at most once per key through a
remote gateway (``idemgate serve``), plain functions with a :class:`Client`, ``async def``
functions with an :class:`AsyncClient`. The in-process engine's decorator is
:func:`idemgate.engine.idempotent`."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
import time
from collections.abc import Callable, Coroutine
from datetime import datetime, timezone
from typing import Any, ParamSpec, TypeVar, cast, overload

from .client import AsyncClient, Begin, Client
from .errors import (
    BadRequest,
    Failed,
    GatewayUnreachable,
    InFlight,
    LeaseLost,
    NotApplied,
    OutcomeNotRecorded,
    PayloadTooLarge,
    StoreUnavailable,
)

P = ParamSpec("P")
R = TypeVar("R")

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


def _json_check(value: Any) -> None:
    """Raises what encoding ``value`` as the client sends it raises when JSON cannot hold it:
    ``TypeError`` (an object), ``ValueError`` (NaN or an infinity, which ``json.dumps`` writes but
    the gateway refuses; a cycle; a lone surrogate, which UTF-8 cannot carry), ``RecursionError``
    (nested too deep)."""
    json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")


def _failure_result(result: Any) -> Any:
    """What ``Failed(result)`` stores: ``result``, or its ``repr`` when JSON cannot hold it (as the
    in-process engine does)."""
    try:
        _json_check(result)
    except Exception:  # noqa: BLE001 - not JSON, whatever the encoder raised
        return repr(result)
    return result


def _unstorable(tool: str, e: BaseException, reporting: BaseException | None) -> TypeError:
    """The ``TypeError`` of a return value JSON cannot hold, saying what became of the record."""
    record = (
        "the record is now unknown"
        if reporting is None
        else f"the record turns unknown when its lease ends (reporting it failed: {reporting})"
    )
    return TypeError(
        f"{tool}: the function ran, but its return value cannot be stored as JSON (dict with str "
        f"keys, list, tuple, str, int, finite float, bool, None), so {record}; resolve it with "
        f"`Client.resolve` or `idemgate keys resolve`: {type(e).__name__}: {e}"
    )


def _not_json(e: BaseException) -> str:
    return f"the return value is not JSON: {type(e).__name__}: {e}"[:500]


def _refused(reporting: BaseException | None) -> str:
    """The note on a gateway's refusal of an outcome (400, 413), saying what became of the record."""
    if reporting is None:
        return "idemgate: the function ran and the gateway refused its outcome: the record is now unknown"
    return (
        "idemgate: the function ran and the gateway refused its outcome: the record turns unknown "
        f"when its lease ends (reporting it failed: {type(reporting).__name__}: {reporting})"
    )


def _heartbeat_interval(begin: Begin, every: float | None) -> float | None:
    if every is not None:
        return every if every > 0 else None
    if begin.lease_until is None:
        return None
    remaining = (begin.lease_until - datetime.now(timezone.utc)).total_seconds()
    # A third of the lease, as the engine does; never busier than 20 times a second.
    return max(remaining / 3.0, 0.05)


@overload
def idempotent(
    client: AsyncClient,
    tool: str,
    key: Callable[..., str],
    *,
    args: Callable[..., Any] | None = None,
    heartbeat_every: float | None = None,
    wait_in_flight: float = 30.0,
    record_retries: int = 3,
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]: ...
@overload
def idempotent(
    client: Client,
    tool: str,
    key: Callable[..., str],
    *,
    args: Callable[..., Any] | None = None,
    heartbeat_every: float | None = None,
    wait_in_flight: float = 30.0,
    record_retries: int = 3,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def idempotent(
    client: Client | AsyncClient,
    tool: str,
    key: Callable[..., str],
    *,
    args: Callable[..., Any] | None = None,
    heartbeat_every: float | None = None,
    wait_in_flight: float = 30.0,
    record_retries: int = 3,
) -> Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Makes a tool function run at most once per idempotency key.

    ``key(*a, **kw)`` names the logical action of a call (use ``derive_key(run_id, step)`` or
    a tool-call id); ``args(*a, **kw)`` gives the JSON arguments that the gateway fingerprints
    (default: all arguments), so the same key with other arguments raises ``KeyReused``.

    For each call: ``begin`` at the gateway, then

    - **execute**: run the function (renewing the lease in a background thread every
      ``heartbeat_every`` seconds, default a third of the lease; ``0`` turns it off) and store its
      return value, which must be made of JSON types (``dict`` with ``str`` keys, ``list``,
      ``tuple``, ``str``, ``int``, finite ``float``, ``bool``, ``None``): one JSON cannot hold
      (an object, ``NaN`` or an infinity, a cycle, a lone surrogate, nesting past the recursion
      limit) raises ``TypeError`` and the record is reported unknown at once (the function ran).
      If the function raises ``NotApplied`` (nothing happened), the key is released and the
      exception re-raised, so a retry runs. If it raises ``Failed(result)``, the failure is
      stored (its ``repr`` when JSON cannot hold it) and replayed, and re-raised. Any other
      exception may have left an effect: the record becomes unknown and the exception is
      re-raised. An outcome the gateway refuses (``PayloadTooLarge``, ``BadRequest``) makes the
      record unknown too, and that exception is raised.
    - **replayed**: return the stored result without running the function (a stored failure
      raises ``Failed(result, replayed=True)``).
    - **in flight** elsewhere: try again until ``wait_in_flight`` seconds have passed, then raise
      ``InFlight``.
    - **unknown**: raise ``OutcomeUnknown`` (an operator or verifier resolves it).
    - **expired** (a retry past the tool's ``ttl``, within its ``tombstone``): raise
      ``OutcomeExpired``; the function does not run (a new key runs it again on purpose).

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

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                "@idempotent with a Client wraps plain functions; use an AsyncClient for async def"
            )

        @functools.wraps(fn)
        def wrapper(*a: P.args, **kw: P.kwargs) -> R:
            k = key(*a, **kw)
            payload = args(*a, **kw) if args is not None else _default_args(a, kw)
            begin = _begin(client, tool, k, payload, wait_in_flight)
            if begin.pass_through:
                return fn(*a, **kw)
            if begin.replayed:
                outcome = begin.outcome
                if outcome is not None and outcome.failed:
                    raise Failed(outcome.result, replayed=True)
                # The stored value, as the function returned it then (JSON data).
                return cast(R, outcome.result if outcome is not None else None)
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
                why = str(e) or "not applied"
                _retrying(record_retries, lambda: client.release(tool, rkey, lease, why))
                raise
            except Failed as e:
                failure = _failure_result(e.result)
                complete(rkey, lease, failure, failed=True)
                raise
            except BaseException as e:
                reason = f"{type(e).__name__}: {e}"[:500]
                unknown(rkey, lease, reason)
                raise
            try:
                _json_check(value)
            except Exception as e:  # noqa: BLE001 - TypeError; ValueError (NaN, inf, a cycle); RecursionError
                raise _unstorable(tool, e, unknown(rkey, lease, _not_json(e))) from e
            try:
                complete(rkey, lease, value, failed=False)
            except (GatewayUnreachable, StoreUnavailable) as e:
                raise OutcomeNotRecorded(
                    f"{tool}: the function ran but its outcome could not be recorded: {e}", value, e
                ) from e
            return value

        def unknown(rkey: str, lease: str, reason: str) -> BaseException | None:
            """Reports that the function ran with an outcome that may have happened (the record
            becomes unknown); what went wrong reporting it, if anything (the record then turns
            unknown when its lease ends)."""
            try:
                _retrying(record_retries, lambda: client.ambiguous(tool, rkey, lease, reason))
            except Exception as e:  # noqa: BLE001 - the lease runs out and the record goes unknown anyway
                return e
            return None

        def complete(rkey: str, lease: str, result: Any, failed: bool) -> None:
            """Stores the outcome; one the gateway refuses (larger than its body limit, JSON it
            does not read) makes the record unknown at once, never in flight for the lease."""
            try:
                _retrying(
                    record_retries, lambda: client.complete(tool, rkey, lease, result, failed=failed)
                )
            except (BadRequest, PayloadTooLarge) as e:
                reason = f"the gateway refused the outcome: {e}"[:500]
                e.add_note(_refused(unknown(rkey, lease, reason)))
                raise

        return wrapper

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
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    def decorate(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(
                "@idempotent with an AsyncClient wraps async def functions; use a Client otherwise"
            )

        @functools.wraps(fn)
        async def wrapper(*a: P.args, **kw: P.kwargs) -> R:
            k = key(*a, **kw)
            payload = args(*a, **kw) if args is not None else _default_args(a, kw)
            begin = await _abegin(client, tool, k, payload, wait_in_flight)
            if begin.pass_through:
                return await fn(*a, **kw)
            if begin.replayed:
                outcome = begin.outcome
                if outcome is not None and outcome.failed:
                    raise Failed(outcome.result, replayed=True)
                return cast(R, outcome.result if outcome is not None else None)
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
                failure = _failure_result(e.result)
                await complete(rkey, lease, failure, failed=True)
                raise
            except BaseException as e:
                # Cancelled too: the function may have done its work before it was stopped.
                reason = f"{type(e).__name__}: {e}"[:500]
                try:
                    await unknown(rkey, lease, reason)
                except BaseException:  # noqa: BLE001, S110 - cancelled meanwhile: the report goes on
                    pass
                raise
            try:
                _json_check(value)
            except Exception as e:  # noqa: BLE001 - TypeError; ValueError (NaN, inf, a cycle); RecursionError
                raise _unstorable(tool, e, await unknown(rkey, lease, _not_json(e))) from e
            try:
                await complete(rkey, lease, value, failed=False)
            except (GatewayUnreachable, StoreUnavailable) as e:
                raise OutcomeNotRecorded(
                    f"{tool}: the function ran but its outcome could not be recorded: {e}", value, e
                ) from e
            return value

        async def unknown(rkey: str, lease: str, reason: str) -> BaseException | None:
            """As the sync decorator's: the record becomes unknown (shielded: the report goes on
            when the caller is cancelled, which raises here); what went wrong reporting it."""
            try:
                await asyncio.shield(
                    _aretrying(record_retries, lambda: client.ambiguous(tool, rkey, lease, reason))
                )
            except Exception as e:  # noqa: BLE001 - the lease runs out, the record goes unknown anyway
                return e
            return None

        async def complete(rkey: str, lease: str, result: Any, failed: bool) -> None:
            """As the sync decorator's."""
            try:
                await _aretrying(
                    record_retries, lambda: client.complete(tool, rkey, lease, result, failed=failed)
                )
            except (BadRequest, PayloadTooLarge) as e:
                reason = f"the gateway refused the outcome: {e}"[:500]
                e.add_note(_refused(await unknown(rkey, lease, reason)))
                raise

        return wrapper

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
