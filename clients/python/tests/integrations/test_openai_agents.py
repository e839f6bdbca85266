"""The OpenAI Agents SDK: a scripted ``Model`` re-emits a tool call after the SDK timed it out."""

from __future__ import annotations

import asyncio
from typing import Any

from integrations.frameworks import require

require("agents")

from agents import Agent, ModelResponse, Runner, ToolTimeoutError, Usage  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.testing import assistant_message, function_call  # noqa: E402

from agents import set_tracing_disabled  # noqa: E402

from idemgate import Engine  # noqa: E402
from idemgate.integrations import KEY_META  # noqa: E402
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


def test_a_run_retried_after_a_tool_timeout_replays_the_call(engine: Engine) -> None:
    """The SDK times the tool out and the run fails; the application retries the run, the model
    emits the same call again (a cached or deterministic response), and the charge is replayed.
    (Within one run the SDK itself never re-runs an answered call id: the retry is the run's.)"""
    charges: list[int] = []

    async def scenario() -> tuple[Any, ScriptedModel, Exception]:
        confirmed = asyncio.Event()  # the payment provider's slow confirmation

        # The first attempt always times out (it waits for the confirmation); 1 s leaves the retried
        # call, a replay, ample time on a loaded machine (it has the same timeout).
        @idempotent_function_tool(engine, timeout=1.0, timeout_behavior="raise_exception")
        async def charge(ctx: ToolContext, order: int, amount: str) -> dict:
            """Charges an order."""
            charges.append(order)  # the side effect
            await confirmed.wait()  # longer than the SDK's timeout
            return {"charge_id": f"ch_{order}", "amount": amount}

        args = {"order": 7, "amount": "19.99"}
        model = ScriptedModel(
            [
                [function_call("charge", args, call_id="call_1")],
                [function_call("charge", args, call_id="call_1")],  # the retried run
                [assistant_message("charged once")],
            ],
            # The provider confirms the first attempt while the run is being retried.
            on_turn={1: confirmed.set},
        )
        agent = Agent(name="billing", model=model, tools=[charge])
        try:
            await Runner.run(agent, "charge order 7")
            raise AssertionError("the first run should have timed out")
        except ToolTimeoutError as e:
            failed = e
        return await Runner.run(agent, "charge order 7"), model, failed

    result, model, failed = asyncio.run(scenario())
    assert "charge" in str(failed)
    assert result.final_output == "charged once"
    assert charges == [7], "the side effect ran once"
    (answer,) = outputs(model.inputs[2], "call_1")
    assert "ch_7" in answer and "19.99" in answer, answer
    record = engine.record("charge", "call_1")
    assert record is not None and record["state"] == "completed"


def test_a_new_tool_call_runs_and_the_context_is_not_fingerprinted(engine: Engine) -> None:
    runs: list[str] = []

    @idempotent_function_tool(engine)
    def notify(ctx: ToolContext, user: str) -> str:
        """Sends a notification (a sync tool: the SDK runs it in a thread)."""
        runs.append(ctx.tool_call_id)
        return f"sent to {user}"

    answers = []
    for call_id in ("c1", "c1", "c2"):  # three runs; the second re-emits the first's call
        model = ScriptedModel(
            [[function_call("notify", {"user": "ann"}, call_id=call_id)], [assistant_message("ok")]]
        )
        Runner.run_sync(Agent(name="n", model=model, tools=[notify]), "go")
        answers += outputs(model.inputs[1], call_id)
    assert runs == ["c1", "c2"]
    assert answers == ["sent to ann"] * 3


def test_the_mcp_meta_resolver_sends_the_tool_call_id() -> None:
    from agents.mcp.util import MCPToolMetaContext

    ctx = ToolContext(context=None, tool_name="t", tool_call_id="call_9", tool_arguments="{}")
    meta = tool_meta_resolver(
        MCPToolMetaContext(run_context=ctx, server_name="s", tool_name="t", arguments={})
    )
    assert meta == {KEY_META: "call_9"}


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
    same call id, the server charges once and the second run gets the proxy's replay. (Without
    the resolver the proxy refuses the un-keyed write: the key comes from it.)"""
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
            for _ in range(2):  # the second run re-emits the first's call
                model = ScriptedModel(
                    [[function_call("charge", {"order": 7}, call_id="call_1")], [assistant_message("ok")]]
                )
                await Runner.run(Agent(name="b", model=model, mcp_servers=[mcp]), "charge 7")
                answers += outputs(model.inputs[1], "call_1")
        return answers

    first, second = asyncio.run(scenario())
    assert charges.read_text().split() == ["7"], "the server charged once"
    assert "charged 7" in first and "charged 7" in second
    assert "already" in second.lower(), second  # the proxy's replay notice
