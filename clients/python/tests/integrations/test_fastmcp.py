"""FastMCP: a server's own write tool gated by the middleware, driven by FastMCP's in-memory client;
the client times out, retries with the same key, and the side effect runs once."""

from __future__ import annotations

import asyncio
from typing import Any

from integrations.frameworks import require

require("fastmcp")

from fastmcp import Client, FastMCP  # noqa: E402

from idemgate import Engine, NotApplied, Policy  # noqa: E402
from idemgate.integrations import KEY_META  # noqa: E402
from idemgate.integrations.fastmcp import IdempotencyMiddleware  # noqa: E402


def server(engine: Engine) -> tuple[FastMCP, dict[str, Any]]:
    state: dict[str, Any] = {"charges": [], "mails": 0, "confirmed": None, "reads": 0}
    mcp = FastMCP("billing")
    mcp.add_middleware(IdempotencyMiddleware(engine, {"charge": Policy(wait=30), "mail": None}))

    @mcp.tool
    async def charge(order: int, amount: str) -> dict:
        """Charges an order."""
        state["charges"].append(order)  # the side effect
        await state["confirmed"].wait()  # the provider's slow confirmation
        return {"charge_id": f"ch_{order}", "amount": amount}

    @mcp.tool
    def mail(to: str) -> str:
        """Sends a mail; the first attempt fails before sending."""
        state["mails"] += 1
        if state["mails"] == 1:
            raise NotApplied("smtp refused the connection")
        return f"mailed {to}"

    @mcp.tool
    def balance() -> int:
        """A read: not gated."""
        state["reads"] += 1
        return 42

    return mcp, state


def test_a_client_retry_after_its_timeout_gets_the_stored_result(engine: Engine) -> None:
    mcp, state = server(engine)
    args = {"order": 7, "amount": "19.99"}
    meta = {KEY_META: "call_1"}

    async def scenario() -> tuple[Exception, Any, Any]:
        state["confirmed"] = asyncio.Event()
        async with Client(mcp) as client:
            try:
                await client.call_tool("charge", args, meta=meta, timeout=0.3)
                raise AssertionError("the first call should have timed out")
            except Exception as e:  # noqa: BLE001 - whatever the client raises on its timeout
                timed_out = e
            state["confirmed"].set()  # the provider confirms the first attempt
            again = await client.call_tool("charge", args, meta=meta)
            other = await client.call_tool("charge", args, meta={KEY_META: "call_2"})
            return timed_out, again, other

    timed_out, again, other = asyncio.run(scenario())
    assert "charge_id" not in str(timed_out)
    assert state["charges"] == [7, 7], "once per key: call_1 once, call_2 once"
    assert again.structured_content == {"charge_id": "ch_7", "amount": "19.99"}
    assert again.meta is not None and again.meta.get("dev.idemgate/replayed") is True
    assert again.meta.get("dev.idemgate/rule") == "explicit"
    assert "dev.idemgate/executed_at" in again.meta
    assert not (other.meta or {}).get("dev.idemgate/replayed")
    record = engine.record("charge", "call_1")
    assert record is not None and record["state"] == "completed"


def test_not_applied_frees_the_key_refusals_are_errors_and_other_tools_pass(engine: Engine) -> None:
    mcp, state = server(engine)

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            out = []
            for _ in range(2):
                out.append(
                    await client.call_tool(
                        "mail", {"to": "ann"}, meta={KEY_META: "m1"}, raise_on_error=False
                    )
                )
            out.append(await client.call_tool("mail", {"to": "bob"}, meta={KEY_META: "m1"}, raise_on_error=False))
            out.append(await client.call_tool("mail", {"to": "ann"}, raise_on_error=False))
            out.append(await client.call_tool("balance", {}))
            out.append(await client.call_tool("balance", {}))
            return out

    failed, sent, reused, keyless, read1, read2 = asyncio.run(scenario())
    assert failed.is_error and "smtp refused" in str(failed.content)
    assert not sent.is_error and sent.data == "mailed ann"
    assert state["mails"] == 2, "the retry ran again: nothing had been sent"
    assert reused.is_error and "idemgate:" in reused.content[0].text
    assert keyless.is_error and "idemgate:" in keyless.content[0].text
    assert read1.data == read2.data == 42 and state["reads"] == 2
