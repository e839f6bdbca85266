"""The FastMCP middleware seen from Pydantic AI's MCP client (``MCPToolset``, in memory), which
shows a model only a result's structured content: a ``FunctionModel`` that does what the replay
text tells it reaches the action it meant; the purchases are counted."""

from __future__ import annotations

import asyncio
from typing import Any

from integrations.frameworks import require

require("fastmcp")
require("pydantic_ai")

from fastmcp import Client, FastMCP  # noqa: E402
from pydantic import BaseModel, ConfigDict  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.mcp import MCPToolset  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from idemgate import Engine, Policy  # noqa: E402
from idemgate.integrations import CONVERSATION_META  # noqa: E402
from idemgate.integrations._tool_calls import KEY_DESCRIPTION  # noqa: E402
from idemgate.integrations.fastmcp import IdempotencyMiddleware  # noqa: E402


class Receipt(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an output schema that admits no notice
    receipt: str


def shop(engine: Engine, strict: bool, **policy: Any) -> tuple[FastMCP, list[str]]:
    """A shop whose ``buy`` returns a receipt (a dict, or a strict model)."""
    bought: list[str] = []
    mcp = FastMCP("shop")
    mcp.add_middleware(IdempotencyMiddleware(engine, {"buy": Policy(wait=30, **policy)}))

    if strict:

        @mcp.tool
        def buy(item: str) -> Receipt:
            """Buys an item."""
            bought.append(item)
            return Receipt(receipt=f"r{len(bought)}")

    else:

        @mcp.tool
        def buy(item: str) -> dict:  # type: ignore[misc]
            """Buys an item."""
            bought.append(item)
            return {"receipt": f"r{len(bought)}"}

    return mcp, bought


class Shopper:
    """A model that buys what the user asks for with the identical call each time, and, when a
    tool answer says it was not run again and how to do it on purpose, does exactly that."""

    def __init__(self, first_key: str | None = None) -> None:
        self.first_key = first_key
        self.read: list[str] = []  # every tool answer it was shown, as text
        self.schemas: list[dict[str, Any]] = []
        self.turn = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.schemas = [t.parameters_json_schema for t in info.function_tools]
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        args: dict[str, Any] = {"item": "book"}
        if any(isinstance(p, UserPromptPart) for p in last.parts):
            self.turn += 1
            if self.first_key is not None:
                args["idempotency_key"] = self.first_key
            return ModelResponse(parts=[ToolCallPart("buy", args, tool_call_id=f"t{self.turn}")])
        answer = [p for p in last.parts if isinstance(p, (ToolReturnPart, RetryPromptPart))][-1]
        shown = str(answer.content)
        self.read.append(shown)
        if "not run again" in shown or "not repeated" in shown:
            if "idempotency_key" in shown:  # "call buy again with idempotency_key set to a new value"
                args["idempotency_key"] = f"purchase-{self.turn}-again"
                return ModelResponse(parts=[ToolCallPart("buy", args, tool_call_id="again")])
        return ModelResponse(parts=[TextPart("done")])


async def two_purchases(toolset: MCPToolset, shopper: Shopper, **run: Any) -> None:
    agent = Agent(FunctionModel(shopper), toolsets=[toolset])
    async with agent:
        first = await agent.run("buy a book", **run)
        await agent.run("buy another book", message_history=first.all_messages(), **run)


def test_a_second_purchase_the_model_re_emits_is_done_once_it_sends_a_new_key(
    engine: Engine,
) -> None:
    """The window joins the identical call of the second turn (the same session); the notice,
    in the structured content Pydantic AI shows, leads the model to a new key: two books."""
    mcp, bought = shop(engine, strict=False, fallback_window=60)
    shopper = Shopper()
    asyncio.run(two_purchases(MCPToolset(Client(mcp, mode="legacy")), shopper))
    assert bought == ["book", "book"]
    told = [r for r in shopper.read if "taken for a repeat" in r]
    assert len(told) == 1 and "buy" in told[0] and "idempotency_key" in told[0], shopper.read
    assert "'receipt': 'r1'" in told[0], "the model also sees what it got the first time"


def test_with_a_strict_output_schema_the_window_replay_reaches_the_model_as_an_error(
    engine: Engine,
) -> None:
    """The receipt's schema admits no notice: the window's replay is an error result with the
    notice and the stored receipt in text (Pydantic AI: a retry prompt), and the model acts on
    it. The conversation is named in ``_meta`` (a 2026-07-28 client has no session)."""
    mcp, bought = shop(engine, strict=True, fallback_window=60)
    shopper = Shopper()

    async def in_conversation(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
        return await call_tool(name, args, metadata={CONVERSATION_META: ctx.conversation_id})

    toolset = MCPToolset(mcp, process_tool_call=in_conversation)
    asyncio.run(two_purchases(toolset, shopper, conversation_id="conv-1"))
    assert bought == ["book", "book"]
    told = [r for r in shopper.read if "taken for a repeat" in r]
    assert len(told) == 1 and "r1" in told[0], shopper.read


def test_a_model_reusing_its_own_key_for_a_new_purchase_is_told_and_repeats_on_purpose(
    engine: Engine,
) -> None:
    """The model sends the same ``idempotency_key`` in its second turn, meaning a new purchase:
    the replay says so in words, and its new key buys the second book."""
    mcp, bought = shop(engine, strict=False)
    shopper = Shopper(first_key="buy-book")
    asyncio.run(two_purchases(MCPToolset(Client(mcp, mode="legacy")), shopper))
    assert bought == ["book", "book"]
    told = [r for r in shopper.read if "not repeated" in r]
    assert len(told) == 1 and "same idempotency_key" in told[0], shopper.read


def test_the_model_sees_the_key_argument_it_is_told_to_send(engine: Engine) -> None:
    mcp, _ = shop(engine, strict=True)
    shopper = Shopper()

    async def run() -> None:
        async with Agent(FunctionModel(shopper), toolsets=[MCPToolset(mcp)]) as agent:
            await agent.run("buy a book")

    asyncio.run(run())
    (schema,) = shopper.schemas
    key = schema["properties"]["idempotency_key"]
    assert key["description"] == KEY_DESCRIPTION and {"type": "null"} in key["anyOf"], key
    assert schema["required"] == ["item"]
