"""Pydantic AI: a ``FunctionModel`` re-sends and re-emits tool calls after the tool's timeout
asked it to retry, and ``TestModel`` reuses its call ids across runs; the side effects are
counted."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from integrations import same_action
from integrations.frameworks import require

require("pydantic_ai")

from pydantic_ai import Agent, RunContext  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.models.test import TestModel  # noqa: E402

from idemgate import Engine, IdemgateError  # noqa: E402
from idemgate.integrations import CALL_ID_META, CONVERSATION_META, scoped_key  # noqa: E402
from idemgate.integrations.pydantic_ai import (  # noqa: E402
    conversation_scope,
    idempotent_tool,
    process_tool_call,
)


def parts(messages: list[ModelMessage]) -> list[Any]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts]


ARGS = {"order": 7, "amount": "19.99"}


def charge_tool(engine: Engine, charges: list[int], confirmed: asyncio.Event | None, **opts: Any) -> Any:
    """A charge tool counting its side effects; while ``confirmed`` is unset the provider's
    confirmation hangs, longer than the tool's timeout (1 s leaves a replay ample time)."""

    @idempotent_tool(engine, **opts)
    async def charge(ctx: RunContext[None], order: int, amount: str) -> dict:
        """Charges an order."""
        charges.append(order)  # the side effect
        if confirmed is not None:
            await confirmed.wait()
        return {"charge_id": f"ch_{order}", "amount": amount}

    return charge


def scripted(calls: list[ToolCallPart], seen: list[list[Any]], on_turn: dict[int, Any] | None = None) -> FunctionModel:
    """A model answering turn ``i`` with ``calls[i]``, then a text; ``on_turn[i]`` runs first."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(parts(messages))
        turn = len(seen) - 1
        if on_turn and turn in on_turn:
            on_turn[turn]()
        if turn < len(calls):
            return ModelResponse(parts=[calls[turn]])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(model)


def returned(seen: list[Any], call_id: str) -> list[Any]:
    return [p.content for p in seen if isinstance(p, ToolReturnPart) and p.tool_call_id == call_id]


def test_a_call_re_sent_with_its_id_after_the_tool_timeout_is_replayed(engine: Engine) -> None:
    charges: list[int] = []
    seen: list[list[Any]] = []
    call = ToolCallPart("charge", ARGS, tool_call_id="call_1")

    async def scenario() -> Any:
        confirmed = asyncio.Event()  # the payment provider's slow confirmation
        # Told "Timed out, retry", the model sends the same call again; meanwhile the provider
        # confirms the first attempt.
        agent = Agent(scripted([call, call], seen, on_turn={1: confirmed.set}))
        agent.tool(timeout=1.0)(charge_tool(engine, charges, confirmed))
        return await agent.run("charge order 7")

    result = asyncio.run(scenario())
    assert result.output == "done"
    assert charges == [7], "the side effect ran once"
    # What the model was told: the first attempt timed out (retry), then the stored result.
    timed_out, again = returned(seen[2], "call_1")
    assert timed_out == "Timed out after 1.0 seconds."
    # The stored result, and that it was not run again (the old expectation: the bare value).
    assert "ch_7" in again and "not repeated" in again, again
    scope = conversation_scope(result)
    record = engine.record("charge", scoped_key(scope, "call_1"))
    assert record is not None and record["state"] == "completed"


def test_a_call_re_emitted_under_a_new_id_after_a_timeout_runs_once_and_the_model_is_told(
    engine: Engine,
) -> None:
    charges: list[int] = []
    seen: list[list[Any]] = []
    calls = [ToolCallPart("charge", ARGS, tool_call_id=i) for i in ("call_1", "call_2")]

    async def scenario() -> Any:
        confirmed = asyncio.Event()
        agent = Agent(scripted(calls, seen, on_turn={1: confirmed.set}))
        agent.tool(timeout=1.0)(charge_tool(engine, charges, confirmed))
        return await agent.run("charge order 7")

    asyncio.run(scenario())
    assert charges == [7], "the side effect ran once"
    assert returned(seen[1], "call_1") == ["Timed out after 1.0 seconds."]
    (told,) = returned(seen[2], "call_2")
    assert "taken for a repeat" in told and "was not run again" in told, told
    assert "ch_7" in told and "idempotency_key" in told, told


def test_two_runs_of_the_test_model_with_its_constant_call_id_run_twice(engine: Engine) -> None:
    """``TestModel`` names every call of a tool ``pyd_ai_tool_call_id__<tool>``: two separate
    runs (two conversations), the same call id and the same arguments, are two actions."""
    mails: list[str] = []
    agent = Agent(TestModel())

    @agent.tool
    @idempotent_tool(engine)
    def send_mail(ctx: RunContext[None], to: str) -> str:
        """Sends a mail."""
        mails.append(ctx.tool_call_id or "")
        return f"mailed {to}"

    outputs = [agent.run_sync("mail ann").output for _ in range(2)]
    assert mails == ["pyd_ai_tool_call_id__send_mail"] * 2, "each run sent its mail"
    assert all("mailed" in o and "idemgate" not in o for o in outputs), outputs


def test_a_deliberate_repeat_with_a_new_idempotency_key_runs_again(engine: Engine) -> None:
    charges: list[int] = []
    seen: list[list[Any]] = []
    again = dict(ARGS, idempotency_key="second-charge")
    calls = [
        ToolCallPart("charge", ARGS, tool_call_id="call_1"),
        ToolCallPart("charge", ARGS, tool_call_id="call_2"),  # taken for a repeat
        ToolCallPart("charge", again, tool_call_id="call_3"),  # the model means it
    ]
    agent = Agent(scripted(calls, seen))
    agent.tool(charge_tool(engine, charges, None))
    agent.run_sync("charge order 7 twice")
    assert charges == [7, 7]
    (told,) = returned(seen[2], "call_2")
    assert "taken for a repeat" in told, told
    assert returned(seen[3], "call_3") == [{"charge_id": "ch_7", "amount": "19.99"}]


def test_a_business_key_names_the_action_across_conversations(engine: Engine) -> None:
    charges: list[int] = []
    answers: list[Any] = []
    tool = charge_tool(engine, charges, None, key=lambda args, ctx: f"charge-{args['order']}")
    for call_id in ("call_1", "call_9"):  # two runs: two conversations
        seen: list[list[Any]] = []
        agent = Agent(scripted([ToolCallPart("charge", ARGS, tool_call_id=call_id)], seen))
        agent.tool(tool)
        agent.run_sync("charge order 7")
        answers += returned(seen[1], call_id)
    assert charges == [7], "one order, one charge, whichever conversation asks"
    assert answers[0] == {"charge_id": "ch_7", "amount": "19.99"}
    assert "ch_7" in answers[1] and "not repeated" in answers[1], answers


def test_a_sync_tool_replays_its_call_id_and_runs_other_arguments(engine: Engine) -> None:
    runs: list[str | None] = []
    seen: list[list[Any]] = []
    calls = [
        ToolCallPart("notify", {"user": "ann"}, tool_call_id="c1"),
        ToolCallPart("notify", {"user": "ann"}, tool_call_id="c1"),
        ToolCallPart("notify", {"user": "bob"}, tool_call_id="c2"),
    ]
    agent = Agent(scripted(calls, seen))

    @agent.tool
    @idempotent_tool(engine, tool="notify")
    def notify(ctx: RunContext[None], user: str) -> str:
        runs.append(ctx.tool_call_id)
        return f"sent to {user}"

    result = agent.run_sync("go")
    assert result.output == "done"
    assert runs == ["c1", "c2"]


def test_process_tool_call_sends_the_key_of_the_call_in_its_conversation() -> None:
    sent: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = []

    async def call_tool(name: str, args: dict[str, Any], *, metadata: Any = None) -> str:
        sent.append((name, args, metadata))
        return "ok"

    def ctx(conversation: str) -> Any:
        return RunContext(
            deps=None,
            model=FunctionModel(lambda m, i: None),  # type: ignore[arg-type, return-value]
            usage=None,  # type: ignore[arg-type]
            tool_call_id="call_5",
            conversation_id=conversation,
        )

    for conversation in ("c-1", "c-2"):
        assert asyncio.run(process_tool_call(ctx(conversation), call_tool, "create", {"a": 1})) == "ok"
    # The call id and its conversation, never a key of the orchestration layer: the door names
    # the action within the conversation, with the window.
    assert sent[0] == ("create", {"a": 1}, {CALL_ID_META: "call_5", CONVERSATION_META: "pydantic-ai/c-1"})
    assert sent[1][2] == {CALL_ID_META: "call_5", CONVERSATION_META: "pydantic-ai/c-2"}


def test_an_mcp_toolset_sends_the_call_id_to_a_gated_fastmcp_server(engine: Engine) -> None:
    """End to end over MCP (in memory): Pydantic AI's ``MCPToolset`` with ``process_tool_call``
    puts the call id and its conversation in ``_meta``; the FastMCP server's middleware names
    the charge by them (the call id within the conversation)."""
    require("fastmcp")
    from fastmcp import FastMCP

    from pydantic_ai.mcp import MCPToolset

    from idemgate.integrations.fastmcp import IdempotencyMiddleware

    charges: list[int] = []
    server = FastMCP("billing")
    server.add_middleware(IdempotencyMiddleware(engine, ["charge"]))

    @server.tool
    def charge(order: int) -> str:
        """Charges an order."""
        charges.append(order)
        return f"charged {order}, charge #{len(charges)}"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for p in parts(messages)):
            return ModelResponse(parts=[TextPart("ok")])
        return ModelResponse(parts=[ToolCallPart("charge", {"order": 7}, tool_call_id="call_1")])

    agent = Agent(
        FunctionModel(model),
        toolsets=[MCPToolset(server, process_tool_call=process_tool_call)],
    )
    def run(**conversation: str) -> Any:
        result = agent.run_sync("charge order 7", **conversation)
        return [p.content for p in parts(result.all_messages()) if isinstance(p, ToolReturnPart)]

    # Two runs of one conversation, the second re-emitting the first's call (a retried run).
    first, again = run(conversation_id="conv-1"), run(conversation_id="conv-1")
    assert charges == [7], "one charge"
    assert first == ["charged 7, charge #1"]
    # The stored result, and that it was not run again, in what Pydantic AI reads (the
    # structured content): the old expectation, the bare result, was a silent replay.
    told = str(again)
    assert "charged 7, charge #1" in told and "idemgate:" in told, again
    assert "not run again" in told or "not repeated" in told, again
    # Named as `idemgate mcp` names it: the call id within the conversation the client names.
    record = engine.record("charge", scoped_key("conversation:pydantic-ai/conv-1", "call_1"))
    assert record is not None and record["state"] == "completed"
    # Two more runs, each its own conversation, with the model's same call id: two charges.
    assert run() + run() == ["charged 7, charge #2", "charged 7, charge #3"]


class SameAction:
    """The "same action" suite's driver (``integrations/same_action.py``): a conversation is the
    run's ``conversation_id``, a turn one run of a ``FunctionModel`` emitting the calls."""

    def __init__(self, engine: Engine, key: Any, **policy: Any) -> None:
        self.executions: list[Any] = []

        # Registered as `buy` (the name the model calls): a notice names that, not the
        # function's name nor the record's.
        @idempotent_tool(engine, tool=same_action.RECORD, key=key, **policy)
        def purchase(
            ctx: RunContext[None], item: str, quantity: int, note: str | None = None
        ) -> str:
            """Buys an item."""
            self.executions.append(item)
            return f"bought {quantity} {item}, order #{len(self.executions)}"

        self.tool = purchase

    def conversation(self) -> str:
        return f"conv-{uuid.uuid4().hex}"

    def turn(self, conversation: str, calls: list[same_action.Call]) -> list[same_action.Answer]:
        seen: list[list[Any]] = []
        parts = [ToolCallPart(same_action.TOOL, c.args, tool_call_id=c.id) for c in calls]

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen.append(parts_of(messages))
            return ModelResponse(parts=parts if len(seen) == 1 else [TextPart("ok")])

        agent = Agent(FunctionModel(model))
        agent.tool(name=same_action.TOOL)(self.tool)
        try:
            agent.run_sync("buy", conversation_id=conversation)
        except IdemgateError as e:  # Pydantic AI raises a tool's exception out of the run
            return [same_action.Answer(error=e)]
        return [same_action.Answer(returned(seen[-1], c.id)[-1]) for c in calls]


def test_the_model_sees_the_idempotency_key_as_optional_and_nullable(engine: Engine) -> None:
    model = TestModel(call_tools=[])
    agent = Agent(model)
    agent.tool(name="buy")(SameAction(engine, None).tool)
    agent.run_sync("buy")
    (tool,) = model.last_model_request_parameters.function_tools  # type: ignore[union-attr]
    assert tool.name == "buy"
    same_action.assert_optional_key(tool.parameters_json_schema)


parts_of = parts
test_same_action = same_action.stamp("Pydantic AI", SameAction)
