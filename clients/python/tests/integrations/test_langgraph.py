"""LangGraph: a ToolNode with a retry policy and a node timeout re-runs a tool call; a fake chat
model emits the calls."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from integrations.frameworks import require

require("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import InjectedToolCallId, tool  # noqa: E402
from langgraph.errors import NodeTimeoutError  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402
from langgraph.types import RetryPolicy  # noqa: E402

from idemgate import Engine  # noqa: E402
from idemgate.integrations.langgraph import idempotent_tool  # noqa: E402

FAST_RETRY = dict(initial_interval=0.01, jitter=False, max_attempts=3)


def graph(tools: ToolNode, calls: list[dict[str, Any]], **node: Any) -> Any:
    model = GenericFakeChatModel(messages=iter([AIMessage("", tool_calls=calls), AIMessage("done")]))
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    g.add_node("tools", tools, **node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def tool_messages(state: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m.tool_call_id, m.content) for m in state["messages"] if isinstance(m, ToolMessage)]


def test_a_node_retried_after_its_timeout_replays_the_tool_call(engine: Engine) -> None:
    charges: list[int] = []
    attempts: list[str] = []

    async def scenario() -> Any:
        confirmed = asyncio.Event()  # the payment provider's slow confirmation

        @idempotent_tool(engine)
        async def charge(
            order: int, amount: str, tool_call_id: Annotated[str, InjectedToolCallId]
        ) -> dict:
            """Charges an order."""
            charges.append(order)  # the side effect
            await confirmed.wait()  # longer than the node's timeout
            return {"charge_id": f"ch_{order}", "amount": amount}

        async def attempt(request: Any, execute: Any) -> Any:
            attempts.append(request.tool_call["id"])
            if len(attempts) == 2:
                confirmed.set()  # the provider confirms the first attempt during the retry
            return await execute(request)

        tools = ToolNode([charge], awrap_tool_call=attempt)
        app = graph(
            tools,
            [{"name": "charge", "args": {"order": 7, "amount": "19.99"}, "id": "call_1"}],
            timeout=1.0,  # the first attempt always times out; ample for the replay
            retry_policy=RetryPolicy(retry_on=NodeTimeoutError, **FAST_RETRY),
        )
        return await app.ainvoke({"messages": [("user", "charge order 7")]})

    state = asyncio.run(scenario())
    assert attempts == ["call_1", "call_1"], "the node timed out once and was retried"
    assert charges == [7], "the side effect ran once"
    (answer,) = tool_messages(state)
    assert answer[0] == "call_1" and "ch_7" in answer[1], answer
    assert state["messages"][-1].content == "done"
    record = engine.record("charge", "call_1")
    assert record is not None and record["state"] == "completed"


def test_a_node_retried_after_a_sibling_tool_failed_replays_the_finished_one(engine: Engine) -> None:
    charges: list[str] = []
    lookups: list[str] = []

    @idempotent_tool(engine)
    def charge(order: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Charges an order (a sync tool)."""
        charges.append(tool_call_id)
        return f"charged {order}"

    @tool
    def lookup(order: int) -> str:
        """Looks an order up; the first attempt fails."""
        lookups.append("x")
        if len(lookups) == 1:
            raise ConnectionError("lookup service reset the connection")
        return f"order {order} is open"

    invoked: list[str] = []

    def attempt(request: Any, execute: Any) -> Any:
        invoked.append(request.tool_call["id"])
        return execute(request)

    app = graph(
        ToolNode([charge, lookup], handle_tool_errors=False, wrap_tool_call=attempt),
        [
            {"name": "charge", "args": {"order": 7}, "id": "call_1"},
            {"name": "lookup", "args": {"order": 7}, "id": "call_2"},
        ],
        retry_policy=RetryPolicy(retry_on=ConnectionError, **FAST_RETRY),
    )
    state = app.invoke({"messages": [("user", "charge order 7")]})
    assert len(lookups) == 2, "the node ran twice"
    assert invoked.count("call_1") == 2, "the charge was called on both attempts"
    assert charges == ["call_1"], "the charge ran once"
    assert sorted(tool_messages(state)) == [("call_1", "charged 7"), ("call_2", "order 7 is open")]


def test_a_tool_without_an_injected_call_id_is_refused(engine: Engine) -> None:
    def f(order: int) -> str:
        return ""

    try:
        idempotent_tool(engine)(f)
    except TypeError as e:
        assert "InjectedToolCallId" in str(e)
    else:
        raise AssertionError("expected TypeError")
