"""Agents that repeat actions, for `idemgate scan` to find (tests/traces/test_scan.py).

Agents of a real framework driven by scripted models (no network), traced by the framework's own
OpenTelemetry instrumentation with content included (the tool arguments), exported by the
OpenTelemetry SDK over OTLP as the standard OTEL_* variables say.

`pydantic-ai`: Pydantic AI's instrumentation, which names each run's conversation
(`gen_ai.conversation.id`). Each conversation plants one retry source, or none:

- conv-reemit: the model emits the same charge again under a new call id (model re-emission);
  a second, different charge and two identical balance reads beside it are no duplicates;
- conv-callid: the same call id runs twice (framework retry);
- conv-timeout: the program gives up on a slow invoice after 0.5 s and runs the conversation
  again, whose model asks for the same invoice (client timeout);
- conv-replan: the same mail to the same recipient with the same subject, its body reworded
  (re-plan); a mail with the same words to another recipient is another action;
- conv-other: the charge of conv-reemit, in another conversation: another customer's action.

`openai-agents`: the OpenAI Agents SDK with the OpenTelemetry project's instrumentation of it
(opentelemetry-instrumentation-openai-agents-v2), which records neither conversations nor call
ids: the scan compares calls within a trace, and the SDK's `trace()` makes one trace of the runs
of one conversation. The same plants but the call id's (which nothing records): a charge
re-emitted, beside a different charge; an invoice given up on after 0.5 s and asked for again in
a second run of the same trace (the instrumentation ends the cancelled call quietly, without a
result); a mail re-planned beside one to another recipient; the charge again in another trace.

`langgraph`: a LangGraph graph (a fake chat model's node and a `ToolNode`, checkpointed), traced
by OpenLLMetry's LangChain instrumentation (opentelemetry-instrumentation-langchain), whose
conversation is the graph's thread and whose call ids ride in the arguments' envelope. Its plants
are LangGraph's own retries: the tools node of conv-callid fails (a read beside the refund raises
once) and the program resumes the thread, which runs the refund again under its call id
(framework retry); the invoice of conv-timeout is cancelled by its caller after 0.5 s and the
thread resumed, which runs it again under its call id (client timeout). The re-emission, the
re-plan and the distinct actions are as above.

Usage: python scan_agents.py pydantic-ai|openai-agents|langgraph (with the venv of the
`scan-agents` dependency group, which scripts/test-traces makes).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

# Exported as each span ends: when this process exits, the receiver has every span.
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))

CHARGE = {"card": "4242", "amount_cents": 1999}
OTHER_CHARGE = {"card": "4242", "amount_cents": 500}
INVOICE = {"order": "o-9"}
SUBJECT = "Your refund"
ANN_1 = "Hello Ann, your refund of 20 EUR is on its way to your card."
ANN_2 = "Dear Ann, we have refunded 20 EUR; expect it within five days."
BOB = "Dear Bob, we have refunded 20 EUR; expect it within five days."


def mail(to: str, body: str) -> dict[str, Any]:
    return {"to": to, "subject": SUBJECT, "body": body}


def charge_card(card: str, amount_cents: int) -> str:
    """Charges a card."""
    return f"charged {amount_cents} to {card}"


def refund(order: str) -> str:
    """Refunds an order."""
    return f"refunded {order}"


def send_email(to: str, subject: str, body: str) -> str:
    """Sends a mail."""
    return f"sent to {to}"


def get_balance(account: str) -> str:
    """Reads a balance."""
    return "42.00"


async def send_invoice(order: str) -> str:
    """Sends an invoice, slowly: longer than its caller waits."""
    await asyncio.sleep(2)
    return f"invoiced {order}"


TOOLS = [charge_card, refund, send_email, get_balance, send_invoice]

# One model turn: the tool calls it makes, (tool, arguments, call id) each.
Turn = list[tuple[str, dict[str, Any], str]]


async def gave_up(run: Any) -> None:
    """Runs `run` as a caller that waits 0.5 s for it, then gives up."""
    try:
        await asyncio.wait_for(run, timeout=0.5)
    except TimeoutError:
        return
    raise SystemExit("the slow invoice finished within 0.5 s: the timeout was not planted")


async def pydantic_ai() -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings

    # Every agent is traced, arguments included (Pydantic AI includes content by default; said
    # here because the scan needs it).
    Agent.instrument_all(InstrumentationSettings(tracer_provider=provider, include_content=True))

    def agent(turns: list[Turn]) -> Agent[None, str]:
        """An agent whose model makes the calls of `turns`, one response each, then answers."""

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            n = sum(1 for m in messages if isinstance(m, ModelResponse))
            if n < len(turns):
                return ModelResponse(parts=[ToolCallPart(t, a, tool_call_id=c) for t, a, c in turns[n]])
            return ModelResponse(parts=[TextPart("done")])

        return Agent(FunctionModel(model), tools=TOOLS)

    await agent(
        [
            [("get_balance", {"account": "acc-1"}, "call_a0")],
            [("charge_card", CHARGE, "call_a1")],
            [("get_balance", {"account": "acc-1"}, "call_a2")],
            [("charge_card", CHARGE, "call_a3")],
            [("charge_card", OTHER_CHARGE, "call_a4")],
        ]
    ).run("charge the order", conversation_id="conv-reemit")
    await agent(
        [[("refund", {"order": "o-7"}, "call_b1")], [("refund", {"order": "o-7"}, "call_b1")]]
    ).run("refund o-7", conversation_id="conv-callid")
    await gave_up(
        agent([[("send_invoice", INVOICE, "call_d1")]]).run("invoice o-9", conversation_id="conv-timeout")
    )
    await agent([[("send_invoice", INVOICE, "call_d2")]]).run("invoice o-9", conversation_id="conv-timeout")
    await agent(
        [
            [("send_email", mail("ann@example.com", ANN_1), "call_c1")],
            [("send_email", mail("ann@example.com", ANN_2), "call_c2")],
            [("send_email", mail("bob@example.com", BOB), "call_c3")],
        ]
    ).run("tell the customers", conversation_id="conv-replan")
    await agent([[("charge_card", CHARGE, "call_e1")]]).run("charge the order", conversation_id="conv-other")


async def openai_agents() -> None:
    from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_trace_processors, trace
    from agents.models.interface import Model
    from agents.testing import assistant_message, function_call
    from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    # No trace goes to OpenAI's own backend; the OpenTelemetry instrumentation adds its processor.
    set_trace_processors([])
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider, capture_message_content=True)
    tools = [function_tool(t) for t in TOOLS]

    class Scripted(Model):
        """Makes the calls of `turns`, one response each, then answers."""

        def __init__(self, turns: list[Turn]) -> None:
            self.turns = turns
            self.n = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            n, self.n = self.n, self.n + 1
            output = (
                [function_call(t, a, call_id=c) for t, a, c in self.turns[n]]
                if n < len(self.turns)
                else [assistant_message("done")]
            )
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    def run(turns: list[Turn]) -> Any:
        return Runner.run(Agent(name="agent", model=Scripted(turns), tools=tools), "go")

    with trace("charge", group_id="conv-reemit"):
        await run(
            [
                [("get_balance", {"account": "acc-1"}, "call_a0")],
                [("charge_card", CHARGE, "call_a1")],
                [("get_balance", {"account": "acc-1"}, "call_a2")],
                [("charge_card", CHARGE, "call_a3")],
                [("charge_card", OTHER_CHARGE, "call_a4")],
            ]
        )
    with trace("invoice", group_id="conv-timeout"):
        await gave_up(run([[("send_invoice", INVOICE, "call_d1")]]))
        await run([[("send_invoice", INVOICE, "call_d2")]])
    with trace("mail", group_id="conv-replan"):
        await run(
            [
                [("send_email", mail("ann@example.com", ANN_1), "call_c1")],
                [("send_email", mail("ann@example.com", ANN_2), "call_c2")],
                [("send_email", mail("bob@example.com", BOB), "call_c3")],
            ]
        )
    with trace("charge", group_id="conv-other"):
        await run([[("charge_card", CHARGE, "call_e1")]])


async def langgraph() -> None:
    from typing import Annotated, TypedDict

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, AnyMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.prebuilt import ToolNode, tools_condition
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    LangchainInstrumentor().instrument(tracer_provider=provider)
    failures = {"get_balance": 1}

    def failing_once(name: str, f: Any) -> Any:
        """`f`, raising the first `failures[name]` times it is called."""

        @functools.wraps(f)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if failures.get(name, 0) > 0:
                failures[name] -= 1
                raise RuntimeError(f"{name}: the backend is down")
            return f(*args, **kwargs)

        return wrapped

    tools = [tool(t) for t in TOOLS if t is not get_balance] + [
        tool(failing_once("get_balance", get_balance))
    ]

    # Spelled as a call: this module's annotations are strings (`from __future__ import
    # annotations`), which LangGraph would resolve in the module, where these names are not.
    State = TypedDict("State", {"messages": Annotated[list[AnyMessage], add_messages]})

    def graph(turns: list[Turn]) -> Any:
        """A checkpointed graph whose fake chat model makes the calls of `turns`, then answers."""
        model = GenericFakeChatModel(
            messages=iter(
                [
                    AIMessage(content="", tool_calls=[{"name": t, "args": a, "id": c} for t, a, c in turn])
                    for turn in turns
                ]
                + [AIMessage(content="done")]
            )
        )
        g = StateGraph(State)
        g.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
        # Errors propagate: a failing tool fails the node, as without a handler.
        g.add_node("tools", ToolNode(tools, handle_tool_errors=False))
        g.add_edge(START, "model")
        g.add_conditional_edges("model", tools_condition)
        g.add_edge("tools", "model")
        return g.compile(checkpointer=InMemorySaver())

    def thread(name: str) -> dict[str, Any]:
        return {"configurable": {"thread_id": name}}

    start = {"messages": [("user", "go")]}
    failures["get_balance"] = 0
    await graph(
        [
            [("get_balance", {"account": "acc-1"}, "call_a0")],
            [("charge_card", CHARGE, "call_a1")],
            [("get_balance", {"account": "acc-1"}, "call_a2")],
            [("charge_card", CHARGE, "call_a3")],
            [("charge_card", OTHER_CHARGE, "call_a4")],
        ]
    ).ainvoke(start, thread("conv-reemit"))

    failures["get_balance"] = 1
    app = graph([[("refund", {"order": "o-7"}, "call_b1"), ("get_balance", {"account": "acc-7"}, "call_b2")]])
    try:
        await app.ainvoke(start, thread("conv-callid"))
        raise SystemExit("the tools node did not fail: the framework retry was not planted")
    except RuntimeError:
        pass
    await app.ainvoke(None, thread("conv-callid"))  # resumed from the checkpoint

    app = graph([[("send_invoice", INVOICE, "call_d1")]])
    await gave_up(app.ainvoke(start, thread("conv-timeout")))
    await app.ainvoke(None, thread("conv-timeout"))  # resumed from the checkpoint

    await graph(
        [
            [("send_email", mail("ann@example.com", ANN_1), "call_c1")],
            [("send_email", mail("ann@example.com", ANN_2), "call_c2")],
            [("send_email", mail("bob@example.com", BOB), "call_c3")],
        ]
    ).ainvoke(start, thread("conv-replan"))
    await graph([[("charge_card", CHARGE, "call_e1")]]).ainvoke(start, thread("conv-other"))


if __name__ == "__main__":
    frameworks = {"pydantic-ai": pydantic_ai, "openai-agents": openai_agents, "langgraph": langgraph}
    if len(sys.argv) != 2 or sys.argv[1] not in frameworks:
        raise SystemExit(f"usage: scan_agents.py {'|'.join(frameworks)}")
    asyncio.run(frameworks[sys.argv[1]]())
    provider.shutdown()
