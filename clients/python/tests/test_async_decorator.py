"""@idempotent with an AsyncClient (async def functions) against a real gateway: the decorator's
semantics of the sync one, over asyncio."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from idemgate import (
    AsyncClient,
    Failed,
    KeyReused,
    NotApplied,
    OutcomeUnknown,
    PayloadTooLarge,
    derive_key,
    idempotent,
    mint_key,
)
from idemgate.remote import idempotent as remote_idempotent
from test_decorator import NOT_JSON


def aclient(gateway: Any) -> AsyncClient:
    return AsyncClient(gateway.url, "acme-token-0123456789", timeout=30)


def test_runs_once_across_retries(gateway: Any) -> None:
    runs: list[int] = []

    async def scenario() -> None:
        async with aclient(gateway) as client:

            @idempotent(client, "mail", key=lambda run_id, step, to: derive_key(run_id, step))
            async def send(run_id: str, step: int, to: str) -> dict:
                runs.append(step)
                return {"sent_to": to, "message_id": f"m-{len(runs)}"}

            run = mint_key()
            first = await send(run, 1, "a@example.com")
            assert first == {"sent_to": "a@example.com", "message_id": "m-1"}
            for _ in range(3):
                assert await send(run, 1, "a@example.com") == first
            assert (await send(run, 2, "a@example.com"))["message_id"] == "m-2"
            with pytest.raises(KeyReused):
                await send(run, 1, "b@example.com")

    asyncio.run(scenario())
    assert runs == [1, 2]


def test_racing_tasks_run_once(gateway: Any) -> None:
    runs: list[int] = []

    async def scenario() -> list[Any]:
        async with aclient(gateway) as client:
            key = mint_key()

            @remote_idempotent(client, "mail", key=lambda n: key)
            async def slow(n: int) -> int:
                runs.append(n)
                await asyncio.sleep(0.5)  # makes the race likely; the assertions hold either way
                return n * 2

            return await asyncio.gather(*(slow(21) for _ in range(4)), return_exceptions=True)

    assert asyncio.run(scenario()) == [42, 42, 42, 42]
    assert runs == [21]


def test_not_applied_failed_and_other_exceptions(gateway: Any) -> None:
    attempts: list[str] = []

    async def scenario() -> None:
        async with aclient(gateway) as client:
            free, declined, broken = mint_key(), mint_key(), mint_key()

            @idempotent(client, "mail", key=lambda k: k)
            async def act(k: str) -> str:
                attempts.append(k)
                if k == free and attempts.count(k) == 1:
                    raise NotApplied("SMTP refused; nothing sent")
                if k == declined:
                    raise Failed({"error": "no such mailbox"})
                if k == broken:
                    raise TimeoutError("no answer after sending")
                return "sent"

            with pytest.raises(NotApplied):
                await act(free)
            assert await client.record("mail", free) is None, "the key is free again"
            assert await act(free) == "sent"
            assert await act(free) == "sent"

            with pytest.raises(Failed) as first:
                await act(declined)
            assert first.value.replayed is False
            with pytest.raises(Failed) as again:
                await act(declined)
            assert again.value.replayed is True and again.value.result == {"error": "no such mailbox"}

            with pytest.raises(TimeoutError):
                await act(broken)
            with pytest.raises(OutcomeUnknown):
                await act(broken)
            record = await client.record("mail", broken)
            assert record is not None and record.state == "unknown"

    asyncio.run(scenario())
    # free: twice (not applied, then sent); declined and broken once each: never re-run.
    assert len(attempts) == 4, attempts


def test_a_cancelled_call_leaves_the_outcome_unknown(gateway: Any) -> None:
    async def scenario() -> Any:
        async with aclient(gateway) as client:
            key = mint_key()
            started = asyncio.Event()

            @idempotent(client, "mail", key=lambda: key)
            async def hang() -> None:
                started.set()
                await asyncio.Event().wait()

            task = asyncio.ensure_future(hang())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await client.record("mail", key)

    record = asyncio.run(scenario())
    assert record is not None and record.state == "unknown"


def test_the_heartbeat_keeps_a_long_call_alive(gateway: Any) -> None:
    # short_lease has a 1 s lease: without heartbeats the lease would be lost mid-call and the
    # complete refused.
    runs: list[int] = []

    async def scenario() -> list[str]:
        async with aclient(gateway) as client:
            key = mint_key()

            @idempotent(client, "short_lease", key=lambda: key)
            async def long_call() -> str:
                runs.append(1)
                await asyncio.sleep(2.5)
                return "finished"

            return [await long_call(), await long_call()]

    assert asyncio.run(scenario()) == ["finished", "finished"]
    assert runs == [1]


def test_the_wrong_kind_of_function_is_refused(gateway: Any, acme: Any) -> None:
    with pytest.raises(TypeError):
        idempotent(aclient(gateway), "mail", key=lambda: "k")(lambda: None)

    async def coro() -> None:
        pass

    with pytest.raises(TypeError):
        idempotent(acme, "mail", key=lambda: "k")(coro)


@pytest.mark.parametrize("make", NOT_JSON.values(), ids=NOT_JSON.keys())
def test_a_result_json_cannot_hold_makes_the_record_unknown_at_once(gateway: Any, make: Any) -> None:
    # As with the sync decorator: the record is unknown when the TypeError reaches the caller.
    attempts: list[int] = []

    async def scenario() -> Any:
        async with aclient(gateway) as client:
            key = mint_key()

            @idempotent(client, "mail", key=lambda: key, wait_in_flight=0)
            async def compute() -> Any:
                attempts.append(1)
                return make()

            with pytest.raises(TypeError, match="cannot be stored as JSON.*the record is now unknown"):
                await compute()
            return await client.record("mail", key)

    record = asyncio.run(scenario())
    assert record is not None and record.state == "unknown", record
    assert attempts == [1]


def test_a_failure_whose_result_is_not_json_is_stored_as_its_repr(gateway: Any) -> None:
    async def scenario() -> None:
        async with aclient(gateway) as client:
            key = mint_key()

            @idempotent(client, "mail", key=lambda: key, wait_in_flight=0)
            async def overflow() -> None:
                raise Failed({"ratio": float("nan")})

            with pytest.raises(Failed) as first:
                await overflow()
            assert not first.value.replayed
            with pytest.raises(Failed) as again:
                await overflow()
            assert again.value.replayed and again.value.result == "{'ratio': nan}"

    asyncio.run(scenario())


class RefusingClient(AsyncClient):
    """An async client whose gateway refuses every outcome as too large (a 413 on ``complete``)."""

    async def complete(
        self, tool: str, key: str, lease: str, result: Any, failed: bool = False
    ) -> Any:
        raise PayloadTooLarge("413 Payload too large", status=413)


@pytest.mark.parametrize("outcome", ["result", "failure"])
def test_an_outcome_the_gateway_refuses_makes_the_record_unknown(gateway: Any, outcome: str) -> None:
    async def scenario() -> Any:
        async with RefusingClient(gateway.url, "acme-token-0123456789", timeout=30) as client:
            key = mint_key()

            @idempotent(client, "mail", key=lambda: key, wait_in_flight=0)
            async def send() -> str:
                if outcome == "failure":
                    raise Failed("x" * 100)
                return "x" * 100

            with pytest.raises(PayloadTooLarge) as e:
                await send()
            assert "the record is now unknown" in "".join(getattr(e.value, "__notes__", []))
            return await client.record("mail", key)

    record = asyncio.run(scenario())
    assert record is not None and record.state == "unknown", record
