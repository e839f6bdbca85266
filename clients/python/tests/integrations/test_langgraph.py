"""LangGraph: a ToolNode re-runs tool calls (a retry policy, a node timeout) and a fake chat model
re-emits them, in one thread and in several; the side effects are counted."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any

from integrations import same_action
from integrations.frameworks import require

require("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import InjectedToolCallId, tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.errors import NodeTimeoutError  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402
from langgraph.types import RetryPolicy  # noqa: E402

from idemgate import Engine, IdemgateError  # noqa: E402
from idemgate.integrations import scoped_key  # noqa: E402
from idemgate.integrations.langgraph import idempotent_tool  # noqa: E402

FAST_RETRY = dict(initial_interval=0.01, jitter=False, max_attempts=3)


def graph(tools: ToolNode, turns: list[list[dict[str, Any]]], checkpointer: Any = None, **node: Any) -> Any:
    """The agent loop: a fake chat model emits ``turns`` of tool calls, then "done"."""
    replies = [AIMessage("", tool_calls=calls) for calls in turns] + [AIMessage("done")]
    model = GenericFakeChatModel(messages=iter(replies))
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    g.add_node("tools", tools, **node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


def tool_messages(state: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m.tool_call_id, m.content) for m in state["messages"] if isinstance(m, ToolMessage)]


ARGS = {"order": 7, "amount": "19.99"}


def call(call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": "charge", "args": dict(ARGS, **args), "id": call_id}


def charge_tool(engine: Engine, charges: list[int], confirmed: asyncio.Event | None, **opts: Any) -> Any:
    """A charge tool counting its side effects; while ``confirmed`` is unset the provider's
    confirmation hangs, longer than any timeout of the test."""

    @idempotent_tool(engine, **opts)
    async def charge(
        order: int, amount: str, tool_call_id: Annotated[str, InjectedToolCallId]
    ) -> dict:
        """Charges an order."""
        charges.append(order)  # the side effect
        if confirmed is not None:
            await confirmed.wait()
        return {"charge_id": f"ch_{order}", "amount": amount}

    return charge


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def run(app: Any, config: dict[str, Any] | None = None) -> Any:
    """One graph run, asked to charge (the charge tool is async)."""
    return asyncio.run(app.ainvoke({"messages": [("user", "charge order 7")]}, config))


def test_a_node_retried_after_its_timeout_replays_the_tool_call(engine: Engine) -> None:
    charges: list[int] = []
    attempts: list[str] = []

    async def scenario() -> Any:
        confirmed = asyncio.Event()  # the payment provider's slow confirmation

        async def attempt(request: Any, execute: Any) -> Any:
            attempts.append(request.tool_call["id"])
            if len(attempts) == 2:
                confirmed.set()  # the provider confirms the first attempt during the retry
            return await execute(request)

        tools = ToolNode([charge_tool(engine, charges, confirmed)], awrap_tool_call=attempt)
        app = graph(
            tools,
            [[call("call_1")]],
            checkpointer=InMemorySaver(),
            timeout=1.0,  # the first attempt always times out; ample for the replay
            retry_policy=RetryPolicy(retry_on=NodeTimeoutError, **FAST_RETRY),
        )
        return await app.ainvoke({"messages": [("user", "charge order 7")]}, thread("t-1"))

    state = asyncio.run(scenario())
    assert attempts == ["call_1", "call_1"], "the node timed out once and was retried"
    assert charges == [7], "the side effect ran once"
    (answer,) = tool_messages(state)
    # What the model reads is the replay, and says so (a silent replay was the old expectation).
    assert answer[0] == "call_1" and "ch_7" in answer[1] and "not repeated" in answer[1], answer
    assert state["messages"][-1].content == "done"
    record = engine.record("charge", scoped_key("langgraph/thread:t-1/tools", "call_1"))
    assert record is not None and record["state"] == "completed"


async def timed(request: Any, execute: Any) -> Any:
    """A tool-call middleware giving up on a call after 1 s (ample for a replay on a loaded
    machine), telling the model it timed out (the call itself is shielded: it goes on and
    stores its outcome)."""
    try:
        return await asyncio.wait_for(execute(request), 1.0)
    except TimeoutError:
        return ToolMessage("timed out", tool_call_id=request.tool_call["id"], status="error")


def test_a_call_re_emitted_under_a_new_id_after_a_timeout_runs_once_and_the_model_is_told(
    engine: Engine,
) -> None:
    charges: list[int] = []

    async def scenario() -> Any:
        confirmed = asyncio.Event()

        async def attempt(request: Any, execute: Any) -> Any:
            if request.tool_call["id"] == "call_2":
                confirmed.set()  # the first attempt completes while the model re-emits it
            return await timed(request, execute)

        tools = ToolNode([charge_tool(engine, charges, confirmed)], awrap_tool_call=attempt)
        app = graph(tools, [[call("call_1")], [call("call_2")]], checkpointer=InMemorySaver())
        return await app.ainvoke({"messages": [("user", "charge order 7")]}, thread("t-1"))

    state = asyncio.run(scenario())
    assert charges == [7], "the side effect ran once"
    (first, second) = tool_messages(state)
    assert first == ("call_1", "timed out")
    assert second[0] == "call_2"
    told = second[1]
    assert "taken for a repeat" in told and "was not run again" in told, told
    assert "ch_7" in told and "idempotency_key" in told, told


def test_the_same_call_in_two_threads_and_a_call_id_reused_by_another_run_run_twice(
    engine: Engine,
) -> None:
    charges: list[int] = []
    tools = ToolNode([charge_tool(engine, charges, None)])
    answers = []
    for config in (thread("t-a"), thread("t-b")):  # two conversations, the same call
        app = graph(tools, [[call("call_1")]], checkpointer=InMemorySaver())
        answers += tool_messages(run(app, config))
    assert charges == [7, 7]
    for _ in range(2):  # no thread: each run is its own scope
        answers += tool_messages(run(graph(tools, [[call("call_1")]])))
    assert charges == [7, 7, 7, 7]
    assert len(answers) == 4 and not any("idemgate" in a for _, a in answers), answers


def test_a_deliberate_repeat_with_a_new_idempotency_key_runs_again(engine: Engine) -> None:
    charges: list[int] = []
    tools = ToolNode([charge_tool(engine, charges, None)])
    turns = [
        [call("call_1")],
        [call("call_2")],  # taken for a repeat
        [call("call_3", idempotency_key="second-charge")],  # the model means it
    ]
    state = run(graph(tools, turns))
    assert charges == [7, 7]
    answers = dict(tool_messages(state))
    assert "taken for a repeat" in answers["call_2"], answers
    assert "ch_7" in answers["call_3"] and "idemgate" not in answers["call_3"], answers


def test_a_business_key_names_the_action_across_threads(engine: Engine) -> None:
    charges: list[int] = []
    charge = charge_tool(engine, charges, None, key=lambda args, config: f"charge-{args['order']}")
    answers = []
    for name, call_id in (("t-a", "call_1"), ("t-b", "call_9")):
        app = graph(ToolNode([charge]), [[call(call_id)]], checkpointer=InMemorySaver())
        answers += tool_messages(run(app, thread(name)))
    assert charges == [7], "one order, one charge, whichever thread asks"
    assert len(answers) == 2 and all("ch_7" in a for _, a in answers), answers


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
            [
                {"name": "charge", "args": {"order": 7}, "id": "call_1"},
                {"name": "lookup", "args": {"order": 7}, "id": "call_2"},
            ]
        ],
        retry_policy=RetryPolicy(retry_on=ConnectionError, **FAST_RETRY),
    )
    state = app.invoke({"messages": [("user", "charge order 7")]})
    assert len(lookups) == 2, "the node ran twice"
    assert invoked.count("call_1") == 2, "the charge was called on both attempts"
    assert charges == ["call_1"], "the charge ran once"
    (charged, looked_up) = sorted(tool_messages(state))
    assert looked_up == ("call_2", "order 7 is open")
    # The retried node's charge is the replay, and says so.
    assert charged[0] == "call_1" and "charged 7" in charged[1] and "not repeated" in charged[1]


def test_a_tool_without_an_injected_call_id_is_refused(engine: Engine) -> None:
    def f(order: int) -> str:
        return ""

    try:
        idempotent_tool(engine)(f)
    except TypeError as e:
        assert "InjectedToolCallId" in str(e)
    else:
        raise AssertionError("expected TypeError")


class SameAction:
    """The "same action" suite's driver (``integrations/same_action.py``): a conversation is a
    ``thread_id``, a turn one run of the agent graph whose fake chat model emits the calls."""

    def __init__(self, engine: Engine, key: Any, **policy: Any) -> None:
        self.executions: list[Any] = []

        @idempotent_tool(engine, tool=same_action.RECORD, key=key, **policy)
        def buy(
            item: str,
            quantity: int,
            tool_call_id: Annotated[str, InjectedToolCallId],
            note: str | None = None,
        ) -> str:
            """Buys an item."""
            self.executions.append(item)
            return f"bought {quantity} {item}, order #{len(self.executions)}"

        self.tools = ToolNode([buy])

    def conversation(self) -> str:
        return f"thread-{uuid.uuid4().hex}"

    def turn(self, conversation: str, calls: list[same_action.Call]) -> list[same_action.Answer]:
        emitted = [{"name": same_action.TOOL, "args": c.args, "id": c.id} for c in calls]
        try:
            state = graph(self.tools, [emitted]).invoke(
                {"messages": [("user", "buy")]}, thread(conversation)
            )
        except IdemgateError as e:  # ToolNode's default handle_tool_errors re-raises it
            return [same_action.Answer(error=e)]
        answers = dict(tool_messages(state))
        return [same_action.Answer(answers[c.id]) for c in calls]


def test_the_model_sees_the_idempotency_key_as_optional_and_nullable(engine: Engine) -> None:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    (buy,) = SameAction(engine, None).tools.tools_by_name.values()
    for strict in (False, True):
        tool = convert_to_openai_tool(buy, strict=strict)
        same_action.assert_optional_key(tool["function"]["parameters"])


test_same_action = same_action.stamp("LangGraph", SameAction)
