"""The FastMCP middleware seen from the OpenAI Agents SDK's MCP client (``MCPServerStdio``
starting a gated FastMCP server, a real process), set to show the model only the structured
content (``use_structured_content=True``): a scripted model that does what the replay text tells
it reaches the purchase it meant; the purchases are counted in a file."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from integrations.frameworks import require

require("agents")
require("fastmcp")

from agents import Agent, ModelResponse, Runner, Usage, set_tracing_disabled  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.testing import assistant_message, function_call  # noqa: E402

from idemgate.integrations import CONVERSATION_META  # noqa: E402

set_tracing_disabled(True)  # no trace export (it would want an API key)

SERVER = '''
import sys
from fastmcp import FastMCP
from idemgate import Engine, Policy
from idemgate.integrations.fastmcp import IdempotencyMiddleware

store, journal, bought = sys.argv[1:4]
mcp = FastMCP("shop")
mcp.add_middleware(IdempotencyMiddleware(
    Engine.open(store, journal=journal), {"buy": Policy(wait=30, fallback_window=60)}))

@mcp.tool
def buy(item: str) -> dict:
    """Buys an item."""
    with open(bought, "a") as f:
        f.write(item + "\\n")
    return {"item": item, "receipt": "r" + str(len(open(bought).read().split()))}

mcp.run(show_banner=False)
'''


class Shopper(Model):
    """Buys a book with the identical call on each user turn; when a tool output says the call
    was not run again and how to do it on purpose, does exactly that."""

    def __init__(self) -> None:
        self.read: list[str] = []
        self.turn = 0

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **kw: Any) -> Any:
        last = input[-1] if isinstance(input, list) else {"role": "user"}
        if last.get("role") == "user":
            self.turn += 1
            out = [function_call("buy", {"item": "book"}, call_id=f"t{self.turn}")]
        else:
            shown = str(last.get("output"))
            self.read.append(shown)
            if "not run again" in shown and "idempotency_key" in shown:
                again = {"item": "book", "idempotency_key": "second-book"}
                out = [function_call("buy", again, call_id="again")]
            else:
                out = [assistant_message("done")]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **kw: Any) -> Any:
        raise NotImplementedError


def test_a_second_purchase_reaches_a_structured_only_agents_sdk_client(tmp_path: Path) -> None:
    from agents.mcp import MCPServerStdio

    server, bought = tmp_path / "shop.py", tmp_path / "bought"
    server.write_text(SERVER)
    shopper = Shopper()

    async def scenario() -> None:
        async with MCPServerStdio(
            params={
                "command": sys.executable,
                "args": [
                    str(server),
                    f"sqlite://{tmp_path / 'idemgate.db'}",
                    str(tmp_path / "journal"),
                    str(bought),
                ],
                "env": dict(os.environ),
            },
            use_structured_content=True,
            # The application names the conversation (a 2026-07-28 client has no session).
            tool_meta_resolver=lambda ctx: {CONVERSATION_META: "conv-1"},
            client_session_timeout_seconds=60,
        ) as mcp:
            agent = Agent(name="shop", model=shopper, mcp_servers=[mcp])
            first = await Runner.run(agent, "buy a book")
            again = first.to_input_list() + [{"role": "user", "content": "buy another book"}]
            await Runner.run(agent, again)

    asyncio.run(scenario())
    assert bought.read_text().split() == ["book", "book"]
    told = [json.loads(r) for r in shopper.read if "taken for a repeat" in r]
    assert len(told) == 1 and told[0]["receipt"] == "r1", shopper.read
    assert "call buy again" in told[0]["idemgate_notice"]
