"""Pydantic AI: a ``FunctionModel`` re-emits a tool call after the tool's timeout asked it to retry."""

from __future__ import annotations

import asyncio
from typing import Any

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

from idemgate import Engine  # noqa: E402
from idemgate.integrations import KEY_META  # noqa: E402
from idemgate.integrations.pydantic_ai import idempotent_tool, process_tool_call  # noqa: E402


def parts(messages: list[ModelMessage]) -> list[Any]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts]


def test_a_call_re_emitted_after_the_tool_timeout_is_replayed(engine: Engine) -> None:
    charges: list[int] = []
    seen: list[list[Any]] = []

    async def scenario() -> Any:
        confirmed = asyncio.Event()  # the payment provider's slow confirmation

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen.append(parts(messages))
            call = ToolCallPart("charge", {"order": 7, "amount": "19.99"}, tool_call_id="call_1")
            if len(seen) == 1:
                return ModelResponse(parts=[call])
            if len(seen) == 2:  # told "Timed out, retry": the same call again
                confirmed.set()  # meanwhile the provider confirms the first attempt
                return ModelResponse(parts=[call])
            return ModelResponse(parts=[TextPart("charged once")])

        agent = Agent(FunctionModel(model))

        # The first attempt always times out; 1 s leaves the replay ample time.
        @agent.tool(timeout=1.0)
        @idempotent_tool(engine)
        async def charge(ctx: RunContext[None], order: int, amount: str) -> dict:
            """Charges an order."""
            charges.append(order)  # the side effect
            await confirmed.wait()  # longer than the tool's timeout
            return {"charge_id": f"ch_{order}", "amount": amount}

        return await agent.run("charge order 7")

    result = asyncio.run(scenario())
    assert result.output == "charged once"
    assert charges == [7], "the side effect ran once"
    # What the model was told: the first attempt timed out (retry), then the stored result.
    returned = [(p.tool_call_id, p.content) for p in seen[2] if isinstance(p, ToolReturnPart)]
    assert returned == [
        ("call_1", "Timed out after 1.0 seconds."),
        ("call_1", {"charge_id": "ch_7", "amount": "19.99"}),
    ]
    record = engine.record("charge", "call_1")
    assert record is not None and record["state"] == "completed"


def test_a_sync_tool_replays_a_re_emitted_call_and_runs_a_new_one(engine: Engine) -> None:
    runs: list[str | None] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(isinstance(m, ModelResponse) for m in messages)
        ids = ["c1", "c1", "c2"]
        if n < len(ids):
            return ModelResponse(parts=[ToolCallPart("notify", {"user": "ann"}, tool_call_id=ids[n])])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model))

    @agent.tool
    @idempotent_tool(engine, tool="notify")
    def notify(ctx: RunContext[None], user: str) -> str:
        runs.append(ctx.tool_call_id)
        return f"sent to {user}"

    result = agent.run_sync("go")
    assert result.output == "done"
    assert runs == ["c1", "c2"]


def test_process_tool_call_sends_the_tool_call_id_as_meta() -> None:
    sent: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = []

    async def call_tool(name: str, args: dict[str, Any], *, metadata: Any = None) -> str:
        sent.append((name, args, metadata))
        return "ok"

    ctx = RunContext(deps=None, model=FunctionModel(lambda m, i: None), usage=None, tool_call_id="call_5")  # type: ignore[arg-type]
    assert asyncio.run(process_tool_call(ctx, call_tool, "create", {"a": 1})) == "ok"
    assert sent == [("create", {"a": 1}, {KEY_META: "call_5"})]


def test_an_mcp_toolset_sends_the_call_id_to_a_gated_fastmcp_server(engine: Engine) -> None:
    """End to end over MCP (in memory): Pydantic AI's ``MCPToolset`` with ``process_tool_call``
    puts the tool-call id in ``_meta``; the FastMCP server's middleware keys the charge by it."""
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
    # Two runs, the second re-emitting the first's call (a retried run): one charge.
    answers = []
    for _ in range(2):
        result = agent.run_sync("charge order 7")
        answers += [p.content for p in parts(result.all_messages()) if isinstance(p, ToolReturnPart)]
    assert charges == [7]
    assert answers == ["charged 7, charge #1"] * 2
    record = engine.record("charge", "call_1")
    assert record is not None and record["state"] == "completed"
