"""Agents that repeat actions, for `idemgate scan` to find (tests/traces/test_scan.py).

Pydantic AI agents driven by scripted models (`FunctionModel`, no network), traced by Pydantic
AI's own OpenTelemetry instrumentation with content included (the tool arguments), exported by
the OpenTelemetry SDK over OTLP as the standard OTEL_* variables say. Each conversation plants
one retry source, or none:

- conv-reemit: the model emits the same charge again under a new call id (model re-emission);
  a second, different charge and two identical balance reads beside it are no duplicates;
- conv-callid: the same call id runs twice (framework retry);
- conv-timeout: the program gives up on a slow invoice after 0.5 s and runs the conversation
  again, whose model asks for the same invoice (client timeout);
- conv-replan: the same mail to the same recipient with the same subject, its body reworded
  (re-plan); a mail with the same words to another recipient is another action;
- conv-other: the charge of conv-reemit, in another conversation: another customer's action.

Run with the venv of the `scan-agents` dependency group (scripts/test-traces makes it).
"""

from __future__ import annotations

import asyncio

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings

# Exported as each span ends: when this process exits, the receiver has every span.
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
# Every agent is traced, arguments included (Pydantic AI leaves content in by default; said here
# because the scan needs it).
Agent.instrument_all(InstrumentationSettings(tracer_provider=provider, include_content=True))

Step = list[tuple[str, dict[str, object], str]]


def scripted(steps: list[Step]) -> FunctionModel:
    """A model that answers with the tool calls of `steps`, one response each, then text."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(1 for m in messages if isinstance(m, ModelResponse))
        if n < len(steps):
            return ModelResponse(
                parts=[ToolCallPart(name, args, tool_call_id=cid) for name, args, cid in steps[n]]
            )
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(model)


def agent(steps: list[Step]) -> Agent[None, str]:
    a: Agent[None, str] = Agent(scripted(steps))

    @a.tool_plain
    def charge_card(card: str, amount_cents: int) -> str:
        return f"charged {amount_cents} to {card}"

    @a.tool_plain
    def refund(order: str) -> str:
        return f"refunded {order}"

    @a.tool_plain
    def send_email(to: str, subject: str, body: str) -> str:
        return f"sent to {to}"

    @a.tool_plain
    def get_balance(account: str) -> str:
        return "42.00"

    @a.tool_plain
    async def send_invoice(order: str) -> str:
        await asyncio.sleep(2)
        return f"invoiced {order}"

    return a


CHARGE = {"card": "4242", "amount_cents": 1999}


async def main() -> None:
    await agent(
        [
            [("get_balance", {"account": "acc-1"}, "call_a0")],
            [("charge_card", CHARGE, "call_a1")],
            [("get_balance", {"account": "acc-1"}, "call_a2")],
            [("charge_card", CHARGE, "call_a3")],
            [("charge_card", {"card": "4242", "amount_cents": 500}, "call_a4")],
        ]
    ).run("charge the order", conversation_id="conv-reemit")

    await agent(
        [
            [("refund", {"order": "o-7"}, "call_b1")],
            [("refund", {"order": "o-7"}, "call_b1")],
        ]
    ).run("refund o-7", conversation_id="conv-callid")

    invoice: list[Step] = [[("send_invoice", {"order": "o-9"}, "call_d1")]]
    try:
        await asyncio.wait_for(
            agent(invoice).run("invoice o-9", conversation_id="conv-timeout"), timeout=0.5
        )
        raise SystemExit("the slow invoice finished within 0.5 s: the timeout was not planted")
    except TimeoutError:
        pass
    retry: list[Step] = [[("send_invoice", {"order": "o-9"}, "call_d2")]]
    await agent(retry).run("invoice o-9", conversation_id="conv-timeout")

    subject = "Your refund"
    await agent(
        [
            [
                (
                    "send_email",
                    {
                        "to": "ann@example.com",
                        "subject": subject,
                        "body": "Hello Ann, your refund of 20 EUR is on its way to your card.",
                    },
                    "call_c1",
                )
            ],
            [
                (
                    "send_email",
                    {
                        "to": "ann@example.com",
                        "subject": subject,
                        "body": "Dear Ann, we have refunded 20 EUR; expect it within five days.",
                    },
                    "call_c2",
                )
            ],
            [
                (
                    "send_email",
                    {
                        "to": "bob@example.com",
                        "subject": subject,
                        "body": "Dear Bob, we have refunded 20 EUR; expect it within five days.",
                    },
                    "call_c3",
                )
            ],
        ]
    ).run("tell the customers", conversation_id="conv-replan")

    await agent([[("charge_card", CHARGE, "call_e1")]]).run(
        "charge the order", conversation_id="conv-other"
    )


if __name__ == "__main__":
    asyncio.run(main())
    provider.shutdown()
