"""CrewAI: crews of one agent, driven by a fake LLM (a ``BaseLLM`` subclass, CrewAI's way to plug
in a model) that emits scripted tool calls, natively (as function calls) or as text (the ReAct
format of a model without function calling). CrewAI re-sends a call whose tool raised, re-runs an
agent whose step failed, and the model re-emits calls; the side effects are counted."""

from __future__ import annotations

import contextvars
import json
import uuid
from typing import Any

from integrations import same_action
from integrations.frameworks import require

require("crewai")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.execution import set_execution_uuid  # noqa: E402
from crewai.flow.flow import Flow, start  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import BaseTool  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from idemgate import Engine  # noqa: E402
from idemgate.integrations import KEY_ARGUMENT  # noqa: E402
from idemgate.integrations.crewai import idempotent, idempotent_tool  # noqa: E402

ARGS = {"order": 7, "amount": "19.99"}


class FakeLLM(BaseLLM):
    """Answers each model call with the next of ``turns``: a list of tool calls (OpenAI's format),
    a text, or an exception to raise; then "done". ``native=False``: a model without function
    calling (CrewAI then parses ``Action:`` texts). ``seen`` keeps the messages of each call."""

    turns: list[Any] = []
    native: bool = True
    seen: list[Any] = []

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        self.seen.append(messages)
        if not self.turns:
            return "done" if self.native else "Thought: I know it.\nFinal Answer: done"
        turn = self.turns.pop(0)
        if isinstance(turn, BaseException):
            raise turn
        return turn

    def supports_function_calling(self) -> bool:
        return self.native


def call(call_id: str, **args: Any) -> dict[str, Any]:
    """A native tool call of ``charge``."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "charge", "arguments": json.dumps(dict(ARGS, **args))},
    }


def crew(tools: list[Any], turns: list[Any], native: bool = True) -> tuple[Crew, FakeLLM]:
    llm = FakeLLM(model="fake", turns=list(turns), native=native, seen=[])
    agent = Agent(role="billing", goal="charge orders", backstory="a clerk", llm=llm, tools=tools)
    task = Task(description="charge order 7", expected_output="the charge", agent=agent)
    return Crew(agents=[agent], tasks=[task]), llm


def tool_messages(llm: FakeLLM) -> list[tuple[str, str]]:
    """What the model read of each tool call (native calls): (call id, text)."""
    return [(m["tool_call_id"], m["content"]) for m in llm.seen[-1] if m.get("role") == "tool"]


def charge_tool(engine: Engine, charges: list[int], **opts: Any) -> Any:
    @idempotent_tool(engine, **opts)
    def charge(order: int, amount: str) -> dict:
        """Charges an order."""
        charges.append(order)  # the side effect
        return {"charge_id": f"ch_{order}", "amount": amount}

    return charge


def test_a_call_crewai_re_sends_after_the_tool_timed_out_runs_once(engine: Engine) -> None:
    """CrewAI's text loop re-sends a call whose tool raised, at once, up to three times: here the
    provider charged but its confirmation timed out. The first call's outcome is unknown (it may
    have charged): the re-sends are refused, never run again, and the model is told."""
    charges: list[int] = []

    @idempotent_tool(engine)
    def charge(order: int, amount: str) -> dict:
        """Charges an order."""
        charges.append(order)
        raise TimeoutError("the payment provider did not confirm in time")

    action = 'Thought: charge it\nAction: charge\nAction Input: {"order": 7, "amount": "19.99"}'
    team, llm = crew([charge], [action], native=False)
    team.kickoff()
    assert charges == [7], "the side effect ran once, whatever CrewAI re-sent"
    observed = json.dumps(llm.seen[-1])
    assert "is unknown" in observed and "not run again" in observed, observed
    [record] = engine.records("unknown", "charge")
    assert record["state"] == "unknown"


def test_an_agent_re_run_after_its_model_failed_runs_the_call_once_and_says_so(
    engine: Engine,
) -> None:
    """The model's API drops the connection after the tool ran: CrewAI re-runs the agent's task
    (``max_retry_limit``), whose model emits the call again under a new id."""
    charges: list[int] = []
    turns = [[call("call_1")], ConnectionError("the model's API dropped the connection"), [call("call_2")]]
    team, llm = crew([charge_tool(engine, charges)], turns)
    team.kickoff()
    assert charges == [7]
    [(call_id, told)] = tool_messages(llm)  # the re-run's conversation
    assert call_id == "call_2"
    assert "taken for a repeat" in told and "was not run again" in told, told
    assert "ch_7" in told and KEY_ARGUMENT in told, told


def test_a_call_re_emitted_under_a_new_id_runs_once_and_the_model_is_told(engine: Engine) -> None:
    charges: list[int] = []
    team, llm = crew([charge_tool(engine, charges)], [[call("call_1")], [call("call_2")]])
    team.kickoff()
    assert charges == [7], "the side effect ran once"
    first, second = tool_messages(llm)
    assert first[0] == "call_1" and "ch_7" in first[1] and "idemgate" not in first[1], first
    assert second[0] == "call_2"
    assert "taken for a repeat" in second[1] and "was not run again" in second[1], second
    assert "ch_7" in second[1] and KEY_ARGUMENT in second[1], second


def test_the_same_call_in_two_crews_runs_twice(engine: Engine) -> None:
    charges: list[int] = []
    charge = charge_tool(engine, charges)
    answers = []
    for _ in range(2):  # two kickoffs: two executions, the same call id and arguments
        team, llm = crew([charge], [[call("call_1")]])
        team.kickoff()
        answers += tool_messages(llm)
    assert charges == [7, 7]
    assert len(answers) == 2 and not any("idemgate" in a for _, a in answers), answers


def test_a_deliberate_repeat_with_a_new_idempotency_key_runs_again(engine: Engine) -> None:
    charges: list[int] = []
    turns = [
        [call("call_1")],
        [call("call_2")],  # taken for a repeat
        [call("call_3", idempotency_key="second-charge")],  # the model means it
    ]
    team, llm = crew([charge_tool(engine, charges)], turns)
    team.kickoff()
    assert charges == [7, 7]
    answers = dict(tool_messages(llm))
    assert "taken for a repeat" in answers["call_2"], answers
    assert "ch_7" in answers["call_3"] and "idemgate" not in answers["call_3"], answers


def test_a_business_key_names_the_action_across_crews(engine: Engine) -> None:
    charges: list[int] = []
    charge = charge_tool(engine, charges, key=lambda args, ctx: f"charge-{args['order']}")
    answers = []
    for call_id in ("call_1", "call_9"):
        team, llm = crew([charge], [[call(call_id)]])
        team.kickoff()
        answers += tool_messages(llm)
    assert charges == [7], "one order, one charge, whichever crew asks"
    assert len(answers) == 2 and all("ch_7" in a for _, a in answers), answers


def test_in_a_flow_the_scope_is_the_flow(engine: Engine) -> None:
    """A ``Flow`` kicked off again (its state kept) is one scope: the identical call is its
    repeat; another flow is another scope."""
    charges: list[int] = []
    charge = charge_tool(engine, charges)
    answers: list[tuple[str, str]] = []

    class Billing(Flow):  # type: ignore[type-arg]
        @start()
        def bill(self) -> str:
            team, llm = crew([charge], [[call("call_1")]])
            team.kickoff()
            answers.extend(tool_messages(llm))
            return "billed"

    flow = Billing()
    flow.kickoff()
    flow.kickoff()
    assert charges == [7]
    assert "taken for a repeat" in answers[1][1], answers
    Billing().kickoff()
    assert charges == [7, 7]


class Refund(BaseModel):
    order: int
    reason: str


class RefundTool(BaseTool):
    name: str = "refund"
    description: str = "Refunds an order."
    args_schema: type[BaseModel] = Refund
    refunds: list[int] = []

    def _run(self, order: int, reason: str) -> str:
        self.refunds.append(order)
        return f"refunded {order}"


def test_a_base_tool_keeps_its_name_description_and_schema_with_the_optional_key(
    engine: Engine,
) -> None:
    refund = RefundTool(refunds=[])
    gated = idempotent(engine, refund)
    assert gated.name == "refund" and gated.description == "Refunds an order."
    schema = gated.args_schema.model_json_schema()
    assert set(schema["properties"]) == {"order", "reason", KEY_ARGUMENT}
    assert schema["required"] == ["order", "reason"]
    tc = {
        "id": "c1",
        "type": "function",
        "function": {"name": "refund", "arguments": json.dumps({"order": 7, "reason": "late"})},
    }
    team, llm = crew([gated], [[tc], [dict(tc, id="c2")]])
    team.kickoff()
    assert refund.refunds == [7]
    first, second = tool_messages(llm)
    assert first == ("c1", "refunded 7") and "taken for a repeat" in second[1], (first, second)


class SameAction:
    """The "same action" suite's driver (``integrations/same_action.py``): a conversation is the
    execution id a host binds before each kickoff (``set_execution_uuid``), a turn one kickoff of
    a crew whose fake LLM emits the calls natively."""

    def __init__(self, engine: Engine, key: Any, **policy: Any) -> None:
        self.executions: list[Any] = []

        @idempotent_tool(engine, tool=same_action.RECORD, key=key, **policy)
        def buy(item: str, quantity: int, note: str | None = None) -> str:
            """Buys an item."""
            self.executions.append(item)
            return f"bought {quantity} {item}, order #{len(self.executions)}"

        self.tool = buy

    def conversation(self) -> str:
        return f"conv-{uuid.uuid4().hex}"

    def turn(self, conversation: str, calls: list[same_action.Call]) -> list[same_action.Answer]:
        emitted = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": same_action.TOOL, "arguments": json.dumps(c.args)},
            }
            for c in calls
        ]
        team, llm = crew([self.tool], [emitted])

        def kickoff() -> None:
            set_execution_uuid(conversation)  # as a host keeping conversations does
            team.kickoff()

        contextvars.copy_context().run(kickoff)  # the binding ends with the turn
        answers = dict(tool_messages(llm))
        return [same_action.Answer(answers[c.id]) for c in calls]


def test_the_model_sees_the_idempotency_key_as_optional_and_nullable(engine: Engine) -> None:
    """CrewAI renders a tool's arguments for a text (ReAct) model as one JSON schema in the
    prompt, every argument required and null dropped from their types: the added key must read
    as optional and nullable there, and in the native tools' strict schema."""
    from crewai.utilities.agent_utils import convert_tools_to_openai_schema

    tool = SameAction(engine, None).tool
    (native,), _, _ = convert_tools_to_openai_schema([tool])
    same_action.assert_optional_key(native["function"]["parameters"])
    action = 'Thought: buy it\nAction: buy\nAction Input: {"item": "book", "quantity": 1}'
    team, llm = crew([tool], [action], native=False)
    team.kickoff()
    prompt = "\n".join(m["content"] for m in llm.seen[0] if m.get("role") == "system")
    block = prompt[prompt.index("Tool Arguments: ") + len("Tool Arguments: ") :]
    schema, _ = json.JSONDecoder().raw_decode(block)
    same_action.assert_optional_key(schema)


test_same_action = same_action.stamp("CrewAI", SameAction)
