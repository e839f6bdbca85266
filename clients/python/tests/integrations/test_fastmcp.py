"""FastMCP: a server's own write tools gated by the middleware, driven by FastMCP's in-memory
client: retries after a timeout, calls re-emitted under new keys, other conversations,
deliberate repeats and business keys; the side effects are counted."""

from __future__ import annotations

import asyncio
from typing import Any

from integrations.frameworks import require

require("fastmcp")

from fastmcp import Client, FastMCP  # noqa: E402

from idemgate import Engine, NotApplied, Policy  # noqa: E402
from idemgate.integrations import CONVERSATION_META, KEY_META  # noqa: E402
from idemgate.integrations.fastmcp import IdempotencyMiddleware  # noqa: E402

ARGS = {"order": 7, "amount": "19.99"}


def server(engine: Engine, **options: Any) -> tuple[FastMCP, dict[str, Any]]:
    """A billing server: ``charge`` (its provider's confirmation hangs until ``confirmed`` is
    set), ``mail`` (not listed in ``tools``: a write all the same) and ``balance`` (a read)."""
    state: dict[str, Any] = {"charges": [], "mails": [], "confirmed": asyncio.Event(), "reads": 0}
    state["confirmed"].set()
    mcp = FastMCP("billing")
    mcp.add_middleware(
        IdempotencyMiddleware(
            engine, {"charge": Policy(wait=30), "balance": Policy(kind="read")}, **options
        )
    )

    @mcp.tool
    async def charge(order: int, amount: str) -> dict:
        """Charges an order."""
        state["charges"].append(order)  # the side effect
        await state["confirmed"].wait()  # the provider's confirmation
        return {"charge_id": f"ch_{order}", "amount": amount}

    @mcp.tool
    def mail(to: str) -> str:
        """Sends a mail; the first attempt fails before sending."""
        state["mails"].append(to)
        if len(state["mails"]) == 1:
            raise NotApplied("smtp refused the connection")
        return f"mailed {to}"

    @mcp.tool
    def balance() -> int:
        """A read: not gated."""
        state["reads"] += 1
        return 42

    return mcp, state


def meta(key: str | None, conversation: str | None = "conv-1") -> dict[str, Any]:
    """What a client of an agent sends: its tool call's key and its conversation."""
    m = {KEY_META: key} if key else {}
    return m | ({CONVERSATION_META: conversation} if conversation else {})


def texts(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_a_client_retry_after_its_timeout_gets_the_stored_result(engine: Engine) -> None:
    mcp, state = server(engine)

    async def scenario() -> tuple[Exception, Any]:
        state["confirmed"].clear()
        async with Client(mcp) as client:
            try:
                await client.call_tool("charge", ARGS, meta=meta("call_1"), timeout=0.3)
                raise AssertionError("the first call should have timed out")
            except Exception as e:  # noqa: BLE001 - whatever the client raises on its timeout
                timed_out = e
            state["confirmed"].set()  # the provider confirms the first attempt
            return timed_out, await client.call_tool("charge", ARGS, meta=meta("call_1"))

    timed_out, again = asyncio.run(scenario())
    assert "charge_id" not in str(timed_out)
    assert state["charges"] == [7], "the side effect ran once"
    assert again.structured_content == {"charge_id": "ch_7", "amount": "19.99"}
    assert again.meta is not None and again.meta.get("dev.idemgate/replayed") is True
    assert again.meta.get("dev.idemgate/rule") == "explicit"
    assert "dev.idemgate/executed_at" in again.meta
    assert "already performed" in texts(again) and "not repeated" in texts(again)
    record = engine.record("charge", "call_1")
    assert record is not None and record["state"] == "completed"


def test_a_call_re_emitted_under_a_new_key_after_a_timeout_runs_once_and_the_model_is_told(
    engine: Engine,
) -> None:
    mcp, state = server(engine)

    async def scenario() -> Any:
        state["confirmed"].clear()
        async with Client(mcp) as client:
            try:
                await client.call_tool("charge", ARGS, meta=meta("call_1"), timeout=0.3)
                raise AssertionError("the first call should have timed out")
            except AssertionError:
                raise
            except Exception:  # noqa: BLE001, S110 - the client's timeout
                pass
            state["confirmed"].set()
            # The model, unsure, emits the identical call again: its client gives it a new key.
            return await client.call_tool("charge", ARGS, meta=meta("call_2"))

    again = asyncio.run(scenario())
    assert state["charges"] == [7], "the side effect ran once"
    assert again.structured_content == {"charge_id": "ch_7", "amount": "19.99"}
    assert again.meta is not None and again.meta.get("dev.idemgate/rule") == "fallback"
    told = texts(again)
    assert "taken for a repeat" in told and "was not run again" in told, told
    assert "idempotency_key" in told, told


def test_the_same_call_in_two_conversations_runs_twice(engine: Engine) -> None:
    mcp, state = server(engine)

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            return [
                await client.call_tool("charge", ARGS, meta=meta("call_a", "conv-a")),
                await client.call_tool("charge", ARGS, meta=meta("call_b", "conv-b")),
            ]

    answers = asyncio.run(scenario())
    assert state["charges"] == [7, 7]
    assert not any((a.meta or {}).get("dev.idemgate/replayed") for a in answers)


def test_a_deliberate_repeat_with_a_new_idempotency_key_argument_runs_again(engine: Engine) -> None:
    mcp, state = server(engine)

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            again = dict(ARGS, idempotency_key="second-charge")
            return [
                await client.call_tool("charge", ARGS, meta=meta("call_1")),
                await client.call_tool("charge", ARGS, meta=meta("call_2")),  # a repeat
                await client.call_tool("charge", again, meta=meta("call_3")),  # meant
                await client.call_tool("charge", again, meta=meta("call_4")),  # its retry
            ]

    first, repeat, meant, retried = asyncio.run(scenario())
    assert state["charges"] == [7, 7], "the charge and the one the model meant"
    assert "taken for a repeat" in texts(repeat)
    assert not (meant.meta or {}).get("dev.idemgate/replayed")
    assert meant.structured_content == {"charge_id": "ch_7", "amount": "19.99"}
    assert (retried.meta or {}).get("dev.idemgate/replayed") is True
    record = engine.record("charge", "second-charge")
    assert record is not None and record["state"] == "completed"


def test_a_business_key_names_the_action_across_conversations(engine: Engine) -> None:
    mcp, state = server(engine, key=lambda args, context: f"charge-{args.get('order')}")

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            return [
                await client.call_tool("charge", ARGS, meta=meta("call_a", "conv-a")),
                await client.call_tool("charge", ARGS, meta=meta("call_b", "conv-b")),
            ]

    first, second = asyncio.run(scenario())
    assert state["charges"] == [7], "one order, one charge, whichever conversation asks"
    assert (second.meta or {}).get("dev.idemgate/replayed") is True
    assert second.structured_content == first.structured_content


def test_an_unlisted_tool_is_a_write_and_a_call_without_key_is_told_what_to_send(
    engine: Engine,
) -> None:
    mcp, state = server(engine)

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            out = []
            for _ in range(2):
                out.append(
                    await client.call_tool("mail", {"to": "ann"}, meta=meta("m1"), raise_on_error=False)
                )
            out.append(await client.call_tool("mail", {"to": "ann"}, meta=meta("m1")))
            out.append(
                await client.call_tool("mail", {"to": "bob"}, meta=meta("m1"), raise_on_error=False)
            )
            out.append(await client.call_tool("mail", {"to": "ann"}, raise_on_error=False))
            out.append(await client.call_tool("balance", {}))
            out.append(await client.call_tool("balance", {}))
            return out

    failed, sent, again, reused, keyless, read1, read2 = asyncio.run(scenario())
    assert failed.is_error and "smtp refused" in str(failed.content)
    assert not sent.is_error and sent.data == "mailed ann"
    assert (again.meta or {}).get("dev.idemgate/replayed") is True
    assert state["mails"] == ["ann", "ann"], "the retry ran again (nothing had been sent), once"
    assert reused.is_error and "idemgate:" in texts(reused) and "other arguments" in texts(reused)
    told = texts(keyless)
    assert keyless.is_error and told.startswith("idemgate:") and '"idempotency_key"' in told, told
    assert read1.data == read2.data == 42 and state["reads"] == 2


def test_calls_without_key_share_the_window_of_their_conversation_when_the_tool_sets_one(
    engine: Engine,
) -> None:
    mcp = FastMCP("mailer")
    mcp.add_middleware(IdempotencyMiddleware(engine, {"mail": Policy(fallback_window=60)}))
    mails: list[str] = []

    @mcp.tool
    def mail(to: str) -> str:
        """Sends a mail."""
        mails.append(to)
        return f"mailed {to}"

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            return [
                await client.call_tool("mail", {"to": "ann"}, meta=meta(None, "conv-a")),
                await client.call_tool("mail", {"to": "ann"}, meta=meta(None, "conv-a")),
                await client.call_tool("mail", {"to": "ann"}, meta=meta(None, "conv-b")),
            ]

    first, repeat, other = asyncio.run(scenario())
    assert mails == ["ann", "ann"], "once per conversation"
    assert "taken for a repeat" in texts(repeat) and repeat.data == "mailed ann"
    assert not (other.meta or {}).get("dev.idemgate/replayed")
