"""The OpenAI Agents SDK: a scripted ``Model`` re-sends and re-emits tool calls after the SDK
timed them out, in one conversation and in several; the side effects are counted."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from integrations import same_action
from integrations.frameworks import require

require("agents")

from agents import Agent, ModelResponse, RunConfig, Runner, ToolTimeoutError, Usage  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.testing import assistant_message, function_call  # noqa: E402

from agents import set_tracing_disabled  # noqa: E402

from idemgate import Engine  # noqa: E402
from idemgate.integrations import CALL_ID_META, CONVERSATION_META, KEY_META, scoped_key  # noqa: E402
from idemgate.integrations.openai_agents import (  # noqa: E402
    idempotent_function_tool,
    tool_meta_resolver,
)

set_tracing_disabled(True)  # no trace export (it would want an API key)


class ScriptedModel(Model):
    """Answers each turn from a script; ``on_turn[i]`` runs before turn ``i`` answers."""

    def __init__(self, turns: list[list[Any]], on_turn: dict[int, Any] | None = None) -> None:
        self.turns, self.on_turn, self.inputs = turns, on_turn or {}, []

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **kw: Any) -> Any:
        turn = len(self.inputs)
        self.inputs.append(list(input) if isinstance(input, list) else input)
        if turn in self.on_turn:
            self.on_turn[turn]()
        return ModelResponse(output=self.turns[turn], usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **kw: Any) -> Any:
        raise NotImplementedError


def outputs(items: list[Any], call_id: str) -> list[str]:
    return [
        str(i["output"])
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call_output" and i.get("call_id") == call_id
    ]


def charge_tool(engine: Engine, charges: list[int], confirmed: asyncio.Event | None, **opts: Any) -> Any:
    """A charge tool counting its side effects; while ``confirmed`` is unset the payment
    provider's confirmation hangs, longer than the SDK's timeout (1 s leaves a replay ample time
    on a loaded machine: it has the same timeout)."""

    @idempotent_function_tool(engine, timeout=1.0, **opts)
    async def charge(ctx: ToolContext, order: int, amount: str) -> dict:
        """Charges an order."""
        charges.append(order)  # the side effect
        if confirmed is not None:
            await confirmed.wait()
        return {"charge_id": f"ch_{order}", "amount": amount}

    return charge


ARGS = {"order": 7, "amount": "19.99"}


def conversation(name: str) -> RunConfig:
    """The application's id of a conversation, as the SDK takes it (``RunConfig.group_id``)."""
    return RunConfig(group_id=name)


def test_a_run_retried_in_its_conversation_after_a_tool_timeout_replays_the_call(
    engine: Engine,
) -> None:
    """The SDK times the tool out and the run fails; the application retries the run in the same
    conversation, the model emits the same call again (a cached or deterministic response), and
    the charge is replayed. (Within one run the SDK itself never re-runs an answered call id:
    the retry is the run's.)"""
    charges: list[int] = []

    async def scenario() -> tuple[Any, ScriptedModel, Exception]:
        confirmed = asyncio.Event()  # the payment provider's slow confirmation
        charge = charge_tool(engine, charges, confirmed, timeout_behavior="raise_exception")
        model = ScriptedModel(
            [
                [function_call("charge", ARGS, call_id="call_1")],
                [function_call("charge", ARGS, call_id="call_1")],  # the retried run
                [assistant_message("charged once")],
            ],
            # The provider confirms the first attempt while the run is being retried.
            on_turn={1: confirmed.set},
        )
        agent = Agent(name="billing", model=model, tools=[charge])
        try:
            await Runner.run(agent, "charge order 7", run_config=conversation("conv-1"))
            raise AssertionError("the first run should have timed out")
        except ToolTimeoutError as e:
            failed = e
        result = await Runner.run(agent, "charge order 7", run_config=conversation("conv-1"))
        return result, model, failed

    result, model, failed = asyncio.run(scenario())
    assert "charge" in str(failed)
    assert result.final_output == "charged once"
    assert charges == [7], "the side effect ran once"
    (answer,) = outputs(model.inputs[2], "call_1")
    assert "ch_7" in answer and "19.99" in answer, answer
    assert "not repeated" in answer, "the same call id gets the stored result, told so"
    key = scoped_key("openai-agents/group:conv-1", "call_1")
    record = engine.record("charge", key)
    assert record is not None and record["state"] == "completed"


def test_a_call_re_emitted_under_a_new_id_after_a_timeout_runs_once_and_the_model_is_told(
    engine: Engine,
) -> None:
    """What real models do: the SDK tells the model the tool timed out, and the model emits the
    identical call again under a new call id, in the same run."""
    charges: list[int] = []

    async def scenario() -> ScriptedModel:
        confirmed = asyncio.Event()
        charge = charge_tool(engine, charges, confirmed)  # default: the timeout is an error result
        model = ScriptedModel(
            [
                [function_call("charge", ARGS, call_id="call_1")],
                [function_call("charge", ARGS, call_id="call_2")],  # re-emitted, a new id
                [assistant_message("done")],
            ],
            on_turn={1: confirmed.set},  # the first attempt completes meanwhile
        )
        await Runner.run(Agent(name="billing", model=model, tools=[charge]), "charge order 7")
        return model

    model = asyncio.run(scenario())
    assert charges == [7], "the side effect ran once"
    (timed_out,) = outputs(model.inputs[1], "call_1")
    assert "timed out" in timed_out, timed_out
    (told,) = outputs(model.inputs[2], "call_2")
    assert "taken for a repeat" in told and "was not run again" in told, told
    assert "ch_7" in told and "idempotency_key" in told, told


def test_the_same_call_in_two_conversations_and_a_call_id_reused_by_another_run_run_twice(
    engine: Engine,
) -> None:
    charges: list[int] = []
    charge = charge_tool(engine, charges, None)

    def run(call_id: str, run_config: RunConfig | None = None) -> str:
        model = ScriptedModel(
            [[function_call("charge", ARGS, call_id=call_id)], [assistant_message("ok")]]
        )
        Runner.run_sync(Agent(name="b", model=model, tools=[charge]), "go", run_config=run_config)
        (answer,) = outputs(model.inputs[1], call_id)
        return answer

    # Two conversations, the same arguments (and ids unique to each).
    answers = [run("call_a", conversation("conv-a")), run("call_b", conversation("conv-b"))]
    assert charges == [7, 7]
    # No conversation set: each run is its own scope, and a model reusing its call id across
    # runs does not make the second run's action a replay of the first's.
    answers += [run("call_1"), run("call_1")]
    assert charges == [7, 7, 7, 7]
    assert not any("idemgate" in a for a in answers), answers


def test_a_deliberate_repeat_with_a_new_idempotency_key_runs_again(engine: Engine) -> None:
    charges: list[int] = []
    charge = charge_tool(engine, charges, None)
    again = dict(ARGS, idempotency_key="second-charge")
    model = ScriptedModel(
        [
            [function_call("charge", ARGS, call_id="call_1")],
            [function_call("charge", ARGS, call_id="call_2")],  # taken for a repeat
            [function_call("charge", again, call_id="call_3")],  # the model means it
            [assistant_message("charged twice")],
        ]
    )
    Runner.run_sync(Agent(name="b", model=model, tools=[charge]), "charge order 7 twice")
    assert charges == [7, 7]
    (told,) = outputs(model.inputs[2], "call_2")
    assert "taken for a repeat" in told, told
    (third,) = outputs(model.inputs[3], "call_3")
    assert "ch_7" in third and "idemgate" not in third, third


def test_a_business_key_names_the_action_across_conversations(engine: Engine) -> None:
    charges: list[int] = []
    charge = charge_tool(engine, charges, None, key=lambda args, ctx: f"charge-{args['order']}")
    answers = []
    for conv, call_id in (("conv-a", "call_1"), ("conv-b", "call_9")):
        model = ScriptedModel(
            [[function_call("charge", ARGS, call_id=call_id)], [assistant_message("ok")]]
        )
        Runner.run_sync(
            Agent(name="b", model=model, tools=[charge]), "go", run_config=conversation(conv)
        )
        answers += outputs(model.inputs[1], call_id)
    assert charges == [7], "one order, one charge, whichever conversation asks"
    assert len(answers) == 2 and all("ch_7" in a for a in answers), answers
    record = engine.record("charge", "charge-7")
    assert record is not None and record["state"] == "completed"


def test_a_sync_tool_replays_its_call_id_and_runs_other_arguments(engine: Engine) -> None:
    runs: list[str] = []

    @idempotent_function_tool(engine)
    def notify(ctx: ToolContext, user: str) -> str:
        """Sends a notification (a sync tool: the SDK runs it in a thread)."""
        runs.append(ctx.tool_call_id)
        return f"sent to {user}"

    answers = []
    # Three runs of one conversation; the second re-emits the first's call.
    for call_id, user in (("c1", "ann"), ("c1", "ann"), ("c2", "bob")):
        model = ScriptedModel(
            [[function_call("notify", {"user": user}, call_id=call_id)], [assistant_message("ok")]]
        )
        Runner.run_sync(
            Agent(name="n", model=model, tools=[notify]), "go", run_config=conversation("conv")
        )
        answers += outputs(model.inputs[1], call_id)
    assert runs == ["c1", "c2"]
    assert answers[0] == "sent to ann" and answers[2] == "sent to bob"
    assert "sent to ann" in answers[1] and "not repeated" in answers[1], answers


def test_the_mcp_meta_resolver_sends_the_key_of_the_call_in_its_conversation() -> None:
    from agents.mcp.util import MCPToolMetaContext

    def meta(group: str | None) -> Any:
        ctx = ToolContext(
            context=None,
            tool_name="t",
            tool_call_id="call_9",
            tool_arguments="{}",
            run_config=RunConfig(group_id=group),
        )
        return tool_meta_resolver(
            MCPToolMetaContext(run_context=ctx, server_name="s", tool_name="t", arguments={})
        )

    scope = "openai-agents/group:conv-1"
    # The call id and its conversation, never a key of the orchestration layer: the door names
    # the action within the conversation, with the window.
    assert meta("conv-1") == {CALL_ID_META: "call_9", CONVERSATION_META: scope}
    assert meta("conv-2")[CONVERSATION_META] == "openai-agents/group:conv-2"
    assert KEY_META not in meta("conv-1")


SERVER = '''
import sys
from fastmcp import FastMCP

mcp = FastMCP("billing")

@mcp.tool
def charge(order: int) -> str:
    """Charges an order."""
    with open(sys.argv[1], "a") as f:
        f.write(f"{order}\\n")
    return f"charged {order}"

mcp.run(show_banner=False)
'''


def test_an_mcp_server_behind_idemgate_mcp_gets_the_call_id_from_the_resolver(
    tmp_path: Any,
) -> None:
    """End to end: the SDK's ``MCPServerStdio`` starts ``idemgate mcp -- python server.py`` (a
    FastMCP server counting its charges in a file) with ``tool_meta_resolver``; two runs emit the
    same call id in one conversation, the server charges once and the second run gets the proxy's
    replay. (Without the resolver the proxy refuses the un-keyed write: the key comes from it.)"""
    import os
    import sys
    from pathlib import Path

    from agents.mcp import MCPServerStdio

    binary = Path(
        os.environ.get("IDEMGATE_BIN")
        or Path(__file__).resolve().parents[4] / "target" / "debug" / "idemgate"
    )
    assert binary.exists(), f"no idemgate binary at {binary}: run `cargo build -p idemgate-cli`"
    server, charges = tmp_path / "billing.py", tmp_path / "charges"
    server.write_text(SERVER)

    async def scenario() -> list[str]:
        answers = []
        async with MCPServerStdio(
            params={
                "command": str(binary),
                "args": [
                    "mcp",
                    "--store",
                    f"sqlite://{tmp_path / 'idemgate.db'}",
                    "--journal",
                    str(tmp_path / "journal"),
                    "--",
                    sys.executable,
                    str(server),
                    str(charges),
                ],
                "env": dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data")),
            },
            tool_meta_resolver=tool_meta_resolver,
            client_session_timeout_seconds=60,
        ) as mcp:
            for _ in range(2):  # the second run, in the same conversation, re-emits the call
                model = ScriptedModel(
                    [[function_call("charge", {"order": 7}, call_id="call_1")], [assistant_message("ok")]]
                )
                await Runner.run(
                    Agent(name="b", model=model, mcp_servers=[mcp]),
                    "charge 7",
                    run_config=conversation("conv-1"),
                )
                answers += outputs(model.inputs[1], "call_1")
        return answers

    first, second = asyncio.run(scenario())
    assert charges.read_text().split() == ["7"], "the server charged once"
    assert "charged 7" in first and "charged 7" in second
    assert "already" in second.lower(), second  # the proxy's replay notice


class SameAction:
    """The "same action" suite's driver (``integrations/same_action.py``): a conversation is a
    ``RunConfig.group_id``, a turn one run whose scripted model emits the calls."""

    def __init__(self, engine: Engine, key: Any, **policy: Any) -> None:
        self.executions: list[Any] = []

        @idempotent_function_tool(
            engine, tool=same_action.RECORD, key=key, name_override=same_action.TOOL, **policy
        )
        def purchase(ctx: ToolContext, item: str, quantity: int, note: str | None = None) -> str:
            """Buys an item."""
            self.executions.append(item)
            return f"bought {quantity} {item}, order #{len(self.executions)}"

        self.tool = purchase

    def conversation(self) -> str:
        return f"conv-{uuid.uuid4().hex}"

    def turn(self, conversation: str, calls: list[same_action.Call]) -> list[same_action.Answer]:
        model = ScriptedModel(
            [[function_call(same_action.TOOL, c.args, call_id=c.id) for c in calls], [assistant_message("ok")]]
        )
        Runner.run_sync(
            Agent(name="shop", model=model, tools=[self.tool]), "buy", run_config=conversation_of(conversation)
        )
        return [same_action.Answer(outputs(model.inputs[1], c.id)[-1]) for c in calls]


def conversation_of(name: str) -> RunConfig:
    return RunConfig(group_id=name)


def test_the_model_sees_the_idempotency_key_as_optional_and_nullable(engine: Engine) -> None:
    tool = SameAction(engine, None).tool
    same_action.assert_optional_key(tool.params_json_schema)


test_same_action = same_action.stamp("OpenAI Agents SDK", SameAction)
