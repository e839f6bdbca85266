"""LangChain tools: an agent loop (a ``Runnable`` calling a fake chat model and invoking its tool
calls, as LangChain's tool-calling guide does) re-sends and re-emits tool calls after a timeout,
in one thread and in several; the side effects are counted."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any, Callable

from integrations import same_action
from integrations.frameworks import require

require("langchain_core")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.runnables import RunnableConfig, RunnableLambda  # noqa: E402
from langchain_core.tools import InjectedToolCallId, StructuredTool  # noqa: E402

from idemgate import Engine, IdemgateError  # noqa: E402
from idemgate.integrations import KEY_ARGUMENT, scoped_key  # noqa: E402
from idemgate.integrations.langchain import idempotent, idempotent_tool  # noqa: E402

ARGS = {"order": 7, "amount": "19.99"}


def call(call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": "charge", "args": dict(ARGS, **args), "id": call_id, "type": "tool_call"}


def agent(
    tools: list[Any],
    turns: list[list[dict[str, Any]]],
    attempt: Callable[[dict[str, Any]], None] | None = None,
    timeout: float = 1.0,
) -> Any:
    """The agent loop: a fake chat model emits ``turns`` of tool calls, then "done"; each call
    is invoked with the loop's config and given up after ``timeout`` (1 s: ample for a replay on
    a loaded machine), the model then reading "timed out" (the call itself is shielded: it goes
    on and stores its outcome). ``attempt`` sees each call first."""
    replies = [AIMessage("", tool_calls=calls) for calls in turns] + [AIMessage("done")]
    model = GenericFakeChatModel(messages=iter(replies))
    by_name = {t.name: t for t in tools}

    async def loop(messages: list[Any], config: RunnableConfig) -> list[Any]:
        while True:
            reply = await model.ainvoke(messages, config)
            messages = [*messages, reply]
            if not reply.tool_calls:
                return messages
            for tc in reply.tool_calls:
                if attempt is not None:
                    attempt(tc)
                try:
                    answer = await asyncio.wait_for(by_name[tc["name"]].ainvoke(tc, config), timeout)
                except TimeoutError:
                    answer = ToolMessage("timed out", tool_call_id=tc["id"], status="error")
                messages.append(answer)

    return RunnableLambda(loop)


def tool_messages(messages: list[Any]) -> list[tuple[str, Any]]:
    return [(m.tool_call_id, m.content) for m in messages if isinstance(m, ToolMessage)]


def charge_tool(engine: Engine, charges: list[int], confirmed: asyncio.Event | None, **opts: Any) -> Any:
    """A charge tool counting its side effects; while ``confirmed`` is unset the provider's
    confirmation hangs, longer than any timeout of the test."""

    @idempotent_tool(engine, **opts)
    async def charge(order: int, amount: str) -> dict:
        """Charges an order."""
        charges.append(order)  # the side effect
        if confirmed is not None:
            await confirmed.wait()
        return {"charge_id": f"ch_{order}", "amount": amount}

    return charge


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def run(app: Any, config: dict[str, Any] | None = None) -> list[Any]:
    return asyncio.run(app.ainvoke([HumanMessage("charge order 7")], config))


def resent_after_timeout(engine: Engine, charges: list[int], second: str) -> list[Any]:
    """The first call times out while the provider's confirmation hangs; the model then sends
    the call ``second`` (the same id re-sent, or a new id), during which the provider confirms."""

    async def scenario() -> list[Any]:
        confirmed = asyncio.Event()
        attempts: list[str] = []

        def attempt(tc: dict[str, Any]) -> None:
            attempts.append(tc["id"])
            if len(attempts) == 2:
                confirmed.set()

        app = agent([charge_tool(engine, charges, confirmed)], [[call("call_1")], [call(second)]], attempt)
        return await app.ainvoke([HumanMessage("charge order 7")], thread("t-1"))

    return asyncio.run(scenario())


def test_a_call_re_sent_with_its_id_after_a_timeout_is_replayed(engine: Engine) -> None:
    charges: list[int] = []
    messages = resent_after_timeout(engine, charges, "call_1")
    assert charges == [7], "the side effect ran once"
    first, again = tool_messages(messages)
    assert first == ("call_1", "timed out")
    # The model is told it was not run again (a silent replay was the old expectation's bug).
    assert again[0] == "call_1" and "ch_7" in again[1] and "not repeated" in again[1], again
    record = engine.record("charge", scoped_key("langgraph/thread:t-1/", "call_1"))
    assert record is not None and record["state"] == "completed"
    assert messages[-1].content == "done"


def test_a_call_re_emitted_under_a_new_id_after_a_timeout_runs_once_and_the_model_is_told(
    engine: Engine,
) -> None:
    charges: list[int] = []
    messages = resent_after_timeout(engine, charges, "call_2")
    assert charges == [7], "the side effect ran once"
    first, second = tool_messages(messages)
    assert first == ("call_1", "timed out")
    told = second[1]
    assert second[0] == "call_2"
    assert "taken for a repeat" in told and "was not run again" in told, told
    assert "ch_7" in told and KEY_ARGUMENT in told, told


def test_the_same_call_in_two_threads_and_a_call_id_reused_by_another_run_run_twice(
    engine: Engine,
) -> None:
    charges: list[int] = []
    charge = charge_tool(engine, charges, None)
    answers = []
    for config in (thread("t-a"), thread("t-b")):  # two conversations, the same call
        answers += tool_messages(run(agent([charge], [[call("call_1")]]), config))
    assert charges == [7, 7]
    for _ in range(2):  # no thread: each run of the agent loop is its own scope
        answers += tool_messages(run(agent([charge], [[call("call_1")]])))
    assert charges == [7, 7, 7, 7]
    assert len(answers) == 4 and not any("idemgate" in str(a) for _, a in answers), answers


def test_a_deliberate_repeat_with_a_new_idempotency_key_runs_again(engine: Engine) -> None:
    charges: list[int] = []
    turns = [
        [call("call_1")],
        [call("call_2")],  # taken for a repeat
        [call("call_3", idempotency_key="second-charge")],  # the model means it
    ]
    messages = run(agent([charge_tool(engine, charges, None)], turns))
    assert charges == [7, 7]
    answers = dict(tool_messages(messages))
    assert "taken for a repeat" in answers["call_2"], answers
    assert "ch_7" in answers["call_3"] and "idemgate" not in answers["call_3"], answers


def test_a_business_key_names_the_action_across_threads(engine: Engine) -> None:
    charges: list[int] = []
    charge = charge_tool(engine, charges, None, key=lambda args, config: f"charge-{args['order']}")
    answers = []
    for name, call_id in (("t-a", "call_1"), ("t-b", "call_9")):
        answers += tool_messages(run(agent([charge], [[call(call_id)]]), thread(name)))
    assert charges == [7], "one order, one charge, whichever thread asks"
    assert len(answers) == 2 and all("ch_7" in a for _, a in answers), answers


def test_the_model_sees_the_tool_schema_with_the_optional_idempotency_key(engine: Engine) -> None:
    charge = charge_tool(engine, [], None)
    schema = charge.tool_call_schema.model_json_schema()
    assert set(schema["properties"]) == {"order", "amount", KEY_ARGUMENT}
    assert schema["required"] == ["order", "amount"]
    assert charge.name == "charge" and charge.description == "Charges an order."


def test_a_structured_tool_with_a_json_schema_as_mcp_adapters_make_it_is_gated(engine: Engine) -> None:
    """``langchain-mcp-adapters`` loads an MCP server's tools as ``StructuredTool``s with the
    server's JSON schema as ``args_schema`` and ``response_format="content_and_artifact"`` (the
    package itself cannot be pinned beside fastmcp 4.2.3: its releases need mcp<2 or import
    mcp 1's ``mcp.server.fastmcp``)."""
    created: list[str] = []

    async def create_issue(**args: Any) -> tuple[list[dict[str, Any]], None]:
        created.append(args["title"])
        return [{"type": "text", "text": f"issue #{len(created)}: {args['title']}"}], None

    mcp_tool = StructuredTool(
        name="create_issue",
        description="Creates an issue.",
        args_schema={
            "type": "object",
            "properties": {"title": {"type": "string"}},
            "required": ["title"],
        },
        coroutine=create_issue,
        response_format="content_and_artifact",
    )
    gated = idempotent(engine, mcp_tool)
    assert set(gated.tool_call_schema["properties"]) == {"title", KEY_ARGUMENT}
    turns = [
        [{"name": "create_issue", "args": {"title": "bug"}, "id": "c1", "type": "tool_call"}],
        [{"name": "create_issue", "args": {"title": "bug"}, "id": "c1", "type": "tool_call"}],
        [{"name": "create_issue", "args": {"title": "other"}, "id": "c2", "type": "tool_call"}],
    ]
    answers = tool_messages(run(agent([gated], turns), thread("t-1")))
    assert created == ["bug", "other"]
    assert answers[0] == ("c1", [{"type": "text", "text": "issue #1: bug"}])
    # The re-sent call keeps the tool's content blocks, the notice after them as a text block.
    assert answers[1][1][0] == {"type": "text", "text": "issue #1: bug"}, answers
    notice = answers[1][1][1]
    assert len(answers[1][1]) == 2 and notice["type"] == "text", answers
    assert "not repeated" in notice["text"] and "create_issue" in notice["text"], notice
    assert answers[2][1] == [{"type": "text", "text": "issue #2: other"}]


def test_a_sync_tool_with_an_injected_call_id_replays_its_call(engine: Engine) -> None:
    seen: list[str] = []

    @idempotent_tool(engine)
    def notify(user: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Notifies a user."""
        seen.append(tool_call_id)
        return f"sent to {user}"

    config = {"configurable": {"thread_id": "t-1"}}
    tc = {"name": "notify", "args": {"user": "ann"}, "id": "c1", "type": "tool_call"}
    answers = [notify.invoke(tc, config).content for _ in range(2)]
    assert seen == ["c1"], "the wrapped tool got its call id, and ran once"
    assert answers[0] == "sent to ann"
    assert "sent to ann" in answers[1] and "not repeated" in answers[1], answers
    assert set(notify.tool_call_schema.model_json_schema()["properties"]) == {"user", KEY_ARGUMENT}


def test_in_a_langgraph_tool_node_the_scope_is_the_thread_and_the_node(engine: Engine) -> None:
    """A wrapped tool in a LangGraph ``ToolNode`` is scoped as the LangGraph integration's: the
    ``thread_id`` and the checkpoint namespace's node names."""
    require("langgraph")
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    charges: list[int] = []
    g = StateGraph(MessagesState)
    g.add_node("tools", ToolNode([charge_tool(engine, charges, None)]))
    g.add_edge(START, "tools")
    app = g.compile()
    ask = {"messages": [AIMessage("", tool_calls=[call("call_1")])]}
    runs = [asyncio.run(app.ainvoke(ask, thread("t-1"))) for _ in range(2)]
    answers = [tool_messages(state["messages"]) for state in runs]
    assert charges == [7], "the second run of the node replayed the call"
    assert "ch_7" in answers[0][0][1] and "idemgate" not in answers[0][0][1], answers
    assert "ch_7" in answers[1][0][1] and "not repeated" in answers[1][0][1], "a replay says so"
    record = engine.record("charge", scoped_key("langgraph/thread:t-1/tools", "call_1"))
    assert record is not None and record["state"] == "completed"


class SameAction:
    """The "same action" suite's driver (``integrations/same_action.py``): LangChain's documented
    tool-calling loop, a fake chat model's ``AIMessage`` and ``tool.invoke(tool_call, config)``
    for each of its calls; a conversation is a ``thread_id`` in the config."""

    def __init__(self, engine: Engine, key: Any, **policy: Any) -> None:
        self.executions: list[Any] = []

        @idempotent_tool(engine, tool=same_action.RECORD, key=key, **policy)
        def buy(item: str, quantity: int, note: str | None = None) -> str:
            """Buys an item."""
            self.executions.append(item)
            return f"bought {quantity} {item}, order #{len(self.executions)}"

        self.tool = buy

    def conversation(self) -> Any:
        return thread(f"thread-{uuid.uuid4().hex}")

    def turn(self, config: Any, calls: list[same_action.Call]) -> list[same_action.Answer]:
        emitted = [
            {"name": same_action.TOOL, "args": c.args, "id": c.id, "type": "tool_call"} for c in calls
        ]
        model = GenericFakeChatModel(messages=iter([AIMessage("", tool_calls=emitted)]))
        answers = []
        for tc in model.invoke([HumanMessage("buy")]).tool_calls:
            try:
                answer = self.tool.invoke(tc, config) if config else self.tool.invoke(tc)
            except IdemgateError as e:
                answers.append(same_action.Answer(error=e))
                continue
            answers.append(same_action.Answer(answer.content))
        return answers


class BareLoop(SameAction):
    """The same loop as LangChain's guide writes it: ``tool.invoke(tool_call)``, no config, so
    no conversation."""

    def conversation(self) -> Any:
        return None


def test_the_documented_loop_without_a_config_never_answers_from_another_conversation(
    engine: Engine,
) -> None:
    """LangChain's tool-calling guide invokes each call as ``tool.invoke(tool_call)``: no config,
    so no conversation. A model that names its calls ``call_1`` in every conversation (as fake
    and some real models do) must not get conversation 1's result in conversation 2: the call
    id was once the key as it was, across every conversation of the process."""
    charges: list[int] = []
    charge = charge_tool(engine, charges, None)
    answers = []
    for _ in range(2):  # two conversations, each the guide's loop with its own model
        model = GenericFakeChatModel(messages=iter([AIMessage("", tool_calls=[call("call_1")])]))
        for tc in model.invoke([HumanMessage("charge order 7")]).tool_calls:
            answers.append(asyncio.run(charge.ainvoke(tc)).content)
    assert charges == [7, 7], "each conversation's charge ran"
    assert not any("idemgate" in str(a) for a in answers), answers


def test_the_model_sees_the_idempotency_key_as_optional_and_nullable(engine: Engine) -> None:
    """With a pydantic schema and with a JSON schema (an MCP tool's), plain and in OpenAI's
    strict mode (every argument required: the key must be nullable)."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    mcp_tool = StructuredTool(
        name="create_issue",
        description="Creates an issue.",
        args_schema={"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
        func=lambda **args: "ok",
    )
    for tool in (SameAction(engine, None).tool, idempotent(engine, mcp_tool)):
        for strict in (False, True):
            parameters = convert_to_openai_tool(tool, strict=strict)["function"]["parameters"]
            same_action.assert_optional_key(parameters)


test_same_action = same_action.stamp("LangChain tools (`thread_id`)", SameAction)
test_same_action_without_a_config = same_action.stamp("LangChain tools (no config)", BareLoop)
