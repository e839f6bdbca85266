"""FastMCP: a server's own write tools gated by the middleware, driven by FastMCP's in-memory
client: retries after a timeout, calls re-emitted without a key, other conversations and
sessions, deliberate repeats, business keys, what ``tools/list`` shows, what a replay carries and
what the model reads when an outcome is unknown; the side effects are counted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from integrations.frameworks import require

require("fastmcp")

from fastmcp import Client, FastMCP  # noqa: E402
from fastmcp.utilities.types import Image  # noqa: E402
from pydantic import BaseModel, ConfigDict  # noqa: E402

from idemgate import Engine, MaybeApplied, NotApplied, Policy  # noqa: E402
from idemgate.integrations import CONVERSATION_META, KEY_META  # noqa: E402
from idemgate.integrations._tool_calls import CALL_ID_META, KEY_DESCRIPTION  # noqa: E402
from idemgate.integrations.fastmcp import NOTICE_FIELD, IdempotencyMiddleware  # noqa: E402

ARGS = {"order": 7, "amount": "19.99"}
CHARGED = {"charge_id": "ch_7", "amount": "19.99"}
WINDOW = Policy(wait=30, fallback_window=60)


def server(
    engine: Engine, charge: Policy = Policy(wait=30), **options: Any
) -> tuple[FastMCP, dict[str, Any]]:
    """A billing server: ``charge`` (its provider's confirmation hangs until ``confirmed`` is
    set), ``mail`` (not listed in ``tools``: a write all the same) and ``balance`` (a read)."""
    state: dict[str, Any] = {"charges": [], "mails": [], "confirmed": asyncio.Event(), "reads": 0}
    state["confirmed"].set()
    mcp = FastMCP("billing")
    mcp.add_middleware(
        IdempotencyMiddleware(engine, {"charge": charge, "balance": Policy(kind="read")}, **options)
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


def without_notice(result: Any) -> dict[str, Any]:
    return {k: v for k, v in (result.structured_content or {}).items() if k != NOTICE_FIELD}


async def timed_out(client: Client, state: dict[str, Any], key: str | None, **kw: Any) -> None:
    """A first call whose provider hangs until the client's timeout fired (no race: the call
    cannot finish before ``confirmed`` is set, which happens after the timeout)."""
    state["confirmed"].clear()
    try:
        await client.call_tool("charge", ARGS, meta=meta(key, **kw), timeout=0.3)
    except Exception as e:  # noqa: BLE001 - whatever the client raises on its timeout
        assert "charge_id" not in str(e)
    else:
        raise AssertionError("the first call should have timed out")
    state["confirmed"].set()  # the provider confirms the first attempt


def test_a_client_retry_after_its_timeout_gets_the_stored_result(engine: Engine) -> None:
    mcp, state = server(engine)

    async def scenario() -> Any:
        async with Client(mcp) as client:
            await timed_out(client, state, "call_1")
            return await client.call_tool("charge", ARGS, meta=meta("call_1"))

    again = asyncio.run(scenario())
    assert state["charges"] == [7], "the side effect ran once"
    assert without_notice(again) == CHARGED
    assert again.meta is not None and again.meta.get("dev.idemgate/replayed") is True
    assert again.meta.get("dev.idemgate/rule") == "explicit"
    assert "dev.idemgate/executed_at" in again.meta
    assert "already performed" in texts(again) and "not repeated" in texts(again)
    # A client that shows the model only the structured content shows it the notice too.
    told = again.structured_content[NOTICE_FIELD]
    assert "already performed" in told and "charge" in told, told
    record = engine.record("charge", "call_1")
    assert record is not None and record["state"] == "completed"


def test_an_identical_call_re_emitted_without_key_after_a_timeout_runs_once_and_is_told(
    engine: Engine,
) -> None:
    mcp, state = server(engine, WINDOW)

    async def scenario() -> Any:
        async with Client(mcp) as client:
            await timed_out(client, state, None)
            # The model, unsure, emits the identical call again.
            return await client.call_tool("charge", ARGS, meta=meta(None))

    again = asyncio.run(scenario())
    assert state["charges"] == [7], "the side effect ran once"
    assert without_notice(again) == CHARGED
    assert again.meta is not None and again.meta.get("dev.idemgate/rule") == "fallback"
    for told in (texts(again), again.structured_content[NOTICE_FIELD]):
        assert "taken for a repeat" in told and "was not run again" in told, told
        assert "idempotency_key" in told, told


def test_the_meta_key_names_the_action_in_every_session_and_a_new_one_is_a_new_action(
    engine: Engine,
) -> None:
    """``_meta``'s key is the orchestration layer's: the same key in two sessions or
    conversations is one action; a new key is a new action, whatever the arguments."""
    mcp, state = server(engine)

    async def scenario() -> list[Any]:
        out = []
        for conversation in ("conv-a", "conv-b"):
            async with Client(mcp, mode="legacy") as client:
                out.append(await client.call_tool("charge", ARGS, meta=meta("order-7", conversation)))
        async with Client(mcp) as client:  # the same conversation, the same arguments
            out.append(await client.call_tool("charge", ARGS, meta=meta("order-7-again", "conv-a")))
        return out

    first, other_session, new_key = asyncio.run(scenario())
    assert state["charges"] == [7, 7], "order-7 once, order-7-again once"
    assert (other_session.meta or {}).get("dev.idemgate/replayed") is True
    assert not (new_key.meta or {}).get("dev.idemgate/replayed")


def test_a_tool_call_id_names_the_action_within_its_conversation_with_the_window(
    engine: Engine,
) -> None:
    """``_meta["dev.idemgate/tool-call-id"]`` (where the packages' MCP integrations send the
    framework's call id): re-sent, one action; the identical call re-emitted under a new id in
    the conversation, the same action, told; the same id in another conversation, another
    action. With the server's default policy (no ``fallback_window``): a call id is a key."""
    mcp, state = server(engine)

    def with_id(call_id: str, conversation: str) -> dict[str, Any]:
        return {CALL_ID_META: call_id, CONVERSATION_META: conversation}

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            return [
                await client.call_tool("charge", ARGS, meta=with_id("call_1", "conv-a")),
                await client.call_tool("charge", ARGS, meta=with_id("call_1", "conv-a")),
                await client.call_tool("charge", ARGS, meta=with_id("call_2", "conv-a")),
                await client.call_tool("charge", ARGS, meta=with_id("call_1", "conv-b")),
            ]

    first, resent, reemitted, elsewhere = asyncio.run(scenario())
    assert state["charges"] == [7, 7], "conv-a once, conv-b once"
    assert (resent.meta or {}).get("dev.idemgate/replayed") is True
    assert "idemgate:" in texts(reemitted) and "repeat" in texts(reemitted), reemitted
    assert not (elsewhere.meta or {}).get("dev.idemgate/replayed")


def test_the_same_call_in_two_conversations_runs_twice(engine: Engine) -> None:
    mcp, state = server(engine, WINDOW)

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            return [
                await client.call_tool("charge", ARGS, meta=meta(None, "conv-a")),
                await client.call_tool("charge", ARGS, meta=meta(None, "conv-b")),
            ]

    answers = asyncio.run(scenario())
    assert state["charges"] == [7, 7]
    assert not any((a.meta or {}).get("dev.idemgate/replayed") for a in answers)


def test_a_model_key_names_an_action_only_within_its_session_or_conversation(
    engine: Engine,
) -> None:
    """Two users' models each choose ``idempotency_key: "1"`` for their own purchase: two
    charges; the model re-sending its key within its session gets the stored result, told."""
    mcp, state = server(engine)
    keyed = dict(ARGS, idempotency_key="1")

    async def scenario() -> list[Any]:
        out = []
        for _ in range(2):  # two sessions (handshake-era clients), no conversation named
            async with Client(mcp, mode="legacy") as client:
                out.append(await client.call_tool("charge", keyed))
                out.append(await client.call_tool("charge", keyed))  # its retry
        async with Client(mcp) as client:  # two conversations named by sessionless clients
            for conversation in ("conv-a", "conv-b"):
                out.append(await client.call_tool("charge", keyed, meta=meta(None, conversation)))
        return out

    a, a_again, b, b_again, conv_a, conv_b = asyncio.run(scenario())
    assert state["charges"] == [7, 7, 7, 7], "one charge per session and per conversation"
    assert b.structured_content == CHARGED and not (b.meta or {}).get("dev.idemgate/replayed")
    for again in (a_again, b_again):
        assert (again.meta or {}).get("dev.idemgate/replayed") is True
        told = again.structured_content[NOTICE_FIELD]
        assert "already performed" in told and "same idempotency_key" in told, told
    assert not any((c.meta or {}).get("dev.idemgate/replayed") for c in (conv_a, conv_b))


def test_the_window_never_joins_two_clients_and_a_session_is_one_scope(engine: Engine) -> None:
    """Without a key or a named conversation: a handshake-era session is the window's scope; a
    2026-07-28 client (a new session id per request) makes each request its own."""
    mcp, state = server(engine, WINDOW)

    async def scenario() -> list[Any]:
        out = []
        async with Client(mcp, mode="legacy") as client:
            out += [await client.call_tool("charge", ARGS) for _ in range(2)]
        async with Client(mcp, mode="legacy") as client:
            out.append(await client.call_tool("charge", ARGS))
        for _ in range(2):
            async with Client(mcp) as client:
                out.append(await client.call_tool("charge", ARGS))
        return out

    first, repeat, other_session, modern_1, modern_2 = asyncio.run(scenario())
    assert state["charges"] == [7] * 4, "the repeat in one session is the only one joined"
    assert "taken for a repeat" in texts(repeat)
    assert not any(
        (a.meta or {}).get("dev.idemgate/replayed") for a in (other_session, modern_1, modern_2)
    )


def test_params_idempotency_key_names_the_action(engine: Engine) -> None:
    """SEP-3182 puts the key in ``params.idempotencyKey``: an orchestration key, as ``_meta``'s."""
    from mcp_types import CallToolRequest, CallToolRequestParams, CallToolResult

    class KeyedParams(CallToolRequestParams):
        idempotency_key: str | None = None  # on the wire: idempotencyKey

    class KeyedRequest(CallToolRequest):
        params: KeyedParams

    mcp, state = server(engine)

    async def call(client: Client, key: str) -> Any:
        params = KeyedParams(name="charge", arguments=ARGS, idempotency_key=key)
        return await client.session.send_request(KeyedRequest(params=params), CallToolResult)

    async def scenario() -> list[Any]:
        async with Client(mcp, mode="legacy") as a, Client(mcp, mode="legacy") as b:
            return [await call(a, "order-7"), await call(b, "order-7")]

    first, second = asyncio.run(scenario())
    assert not first.is_error, first
    assert state["charges"] == [7], "one action, named by the key, in two sessions"
    assert (second.meta or {}).get("dev.idemgate/replayed") is True


def test_a_deliberate_repeat_with_a_new_idempotency_key_argument_runs_again(engine: Engine) -> None:
    mcp, state = server(engine, WINDOW)

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            again = dict(ARGS, idempotency_key="second-charge")
            return [
                await client.call_tool("charge", ARGS, meta=meta(None)),
                await client.call_tool("charge", ARGS, meta=meta(None)),  # a repeat
                await client.call_tool("charge", again, meta=meta(None)),  # meant
                await client.call_tool("charge", again, meta=meta(None)),  # its retry
            ]

    first, repeat, meant, retried = asyncio.run(scenario())
    assert state["charges"] == [7, 7], "the charge and the one the model meant"
    assert "taken for a repeat" in texts(repeat)
    assert not (meant.meta or {}).get("dev.idemgate/replayed")
    assert meant.structured_content == CHARGED
    assert (retried.meta or {}).get("dev.idemgate/replayed") is True
    assert "already performed" in retried.structured_content[NOTICE_FIELD]


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
    assert without_notice(second) == first.structured_content
    assert "already performed" in second.structured_content[NOTICE_FIELD]


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
    # Said once, with when the key was first used (the exception's own words repeated it).
    told = texts(reused)
    assert told.count("already used") == 1 and told.count("new key for a new action") == 1, told
    assert "(first at " in told, told
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


class Receipt(BaseModel):
    """A strict output: clients validate structured content against it, so no notice fits."""

    model_config = ConfigDict(extra="forbid")
    receipt: str


def test_tools_list_declares_the_model_key_on_write_tools_and_it_can_be_sent(
    engine: Engine,
) -> None:
    mcp, state = server(engine)
    passed: list[dict[str, Any]] = []

    @mcp.tool
    def ship(order: int, idempotency_key: str | None = None) -> str:
        """Declares the key itself: it is passed on, and its schema kept."""
        passed.append({"order": order, "idempotency_key": idempotency_key})
        return "shipped"

    async def scenario() -> tuple[dict[str, Any], Any]:
        async with Client(mcp) as client:
            listed = {t.name: t.input_schema for t in await client.list_tools()}
            answer = await client.call_tool("charge", dict(ARGS, idempotency_key="k1"))
            await client.call_tool("ship", {"order": 1, "idempotency_key": "s1"})
            return listed, answer

    listed, answer = asyncio.run(scenario())
    for name in ("charge", "mail"):
        schema = listed[name]
        assert schema.get("additionalProperties") is False, schema  # FastMCP's strict schema
        key = schema["properties"]["idempotency_key"]
        assert key["description"] == KEY_DESCRIPTION
        assert {"type": "null"} in key["anyOf"] and {"type": "string"} in key["anyOf"], key
        assert "idempotency_key" not in schema.get("required", [])
    assert "idempotency_key" not in listed["balance"].get("properties", {}), "a read"
    assert listed["ship"]["properties"]["idempotency_key"].get("description") != KEY_DESCRIPTION
    assert not answer.is_error and answer.structured_content == CHARGED
    assert state["charges"] == [7], "the argument reached the middleware, not the tool"
    assert passed == [{"order": 1, "idempotency_key": "s1"}]


def test_a_replay_returns_the_original_content_blocks(engine: Engine) -> None:
    mcp = FastMCP("plots")
    mcp.add_middleware(IdempotencyMiddleware(engine))
    drawn: list[int] = []

    @mcp.tool
    def plot(n: int) -> list:
        """Draws a plot: an image and a caption."""
        drawn.append(n)
        return [Image(data=b"\x89PNG\r\n\x1a\n", format="png"), f"plot {n}"]

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            return [await client.call_tool("plot", {"n": 1}, meta=meta("p1")) for _ in range(2)]

    first, again = asyncio.run(scenario())
    assert drawn == [1]
    assert again.content[: len(first.content)] == first.content, again.content
    assert [c.type for c in again.content] == ["image", "text", "text"]
    assert "already performed" in again.content[-1].text


def test_a_window_replay_of_a_strict_structured_result_is_an_error_carrying_it(
    engine: Engine,
) -> None:
    """A structured-only client would show the stored receipt alone, and its schema admits no
    notice: a replay the model may have meant as a new action is an error saying so, with the
    stored result in text. A replay under the program's key keeps its structured content."""
    mcp = FastMCP("shop")
    mcp.add_middleware(IdempotencyMiddleware(engine, {"buy": WINDOW}))
    bought: list[str] = []

    @mcp.tool
    def buy(item: str) -> Receipt:
        """Buys an item."""
        bought.append(item)
        return Receipt(receipt=f"r{len(bought)}")

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            call = [client.call_tool("buy", {"item": "book"}, meta=meta(k), raise_on_error=False)
                    for k in (None, None, "order-1", "order-1")]
            return [await c for c in call]

    first, window, keyed, keyed_again = asyncio.run(scenario())
    assert bought == ["book", "book"]
    assert window.is_error and window.structured_content is None
    told = window.content[0].text
    assert "taken for a repeat" in told and "idempotency_key" in told, told
    assert json.loads(window.content[1].text) == {"receipt": "r1"}
    assert keyed_again.structured_content == {"receipt": "r2"} and not keyed_again.is_error
    assert "already performed" in texts(keyed_again)


def test_the_notice_names_the_tool_as_the_model_calls_it(engine: Engine) -> None:
    billing, state = server(engine)
    shop = FastMCP("shop")
    shop.mount(billing, namespace="billing")

    async def scenario() -> list[Any]:
        async with Client(shop) as client:
            return [
                await client.call_tool("billing_charge", ARGS, meta=meta("k1")),
                await client.call_tool("billing_charge", ARGS, meta=meta("k1")),
                await client.call_tool("billing_mail", {"to": "ann"}, raise_on_error=False),
            ]

    first, again, keyless = asyncio.run(scenario())
    assert state["charges"] == [7]
    for told in (texts(again), again.structured_content[NOTICE_FIELD], texts(keyless)):
        assert "billing_charge" in told or "billing_mail" in told, told
        assert " charge " not in f" {told} " and " mail " not in f" {told} ", told


def test_an_unknown_outcome_tells_the_model_it_cannot_resolve_it_and_names_the_record(
    engine: Engine,
) -> None:
    mcp = FastMCP("billing")
    mcp.add_middleware(IdempotencyMiddleware(engine))
    tries: list[int] = []

    @mcp.tool
    def refund(order: int) -> str:
        """The provider times out after the request was sent."""
        tries.append(order)
        raise MaybeApplied("the provider timed out after the refund was sent")

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            return [
                await client.call_tool("refund", {"order": 7}, meta=meta("refund-7"), raise_on_error=False)
                for _ in range(2)
            ]

    ran, again = asyncio.run(scenario())
    assert tries == [7], "not run again"
    for answer in (ran, again):
        told = texts(answer)
        assert answer.is_error and "unknown" in told, told
        assert "You cannot resolve this yourself" in told and "a person must check" in told, told
        assert "idemgate keys resolve refund-7 --tool refund --tenant default --fence 1" in told, told
        assert "engine.resolve(tool, key" not in told, told
    assert "timed out after the refund was sent" in texts(ran)
    assert "NOT repeated" in texts(again)


def test_a_call_fastmcp_rejects_before_the_tool_runs_frees_its_key(engine: Engine) -> None:
    mcp, state = server(engine)

    async def scenario() -> list[Any]:
        async with Client(mcp) as client:
            bad = dict(ARGS, order="seven")
            return [
                await client.call_tool("charge", bad, meta=meta("k1"), raise_on_error=False),
                await client.call_tool("charge", ARGS, meta=meta("k1"), raise_on_error=False),
            ]

    rejected, fixed = asyncio.run(scenario())
    assert rejected.is_error and "unknown" not in texts(rejected)
    assert not fixed.is_error and fixed.structured_content == CHARGED
    assert state["charges"] == [7]
