"""The "same action" suite (``integrations/same_action.py``) stamped for MCP: Pydantic AI's MCP
client (``MCPToolset`` with the package's ``process_tool_call``, which sends each call's id and
conversation in ``_meta``) against a FastMCP server gated by the middleware (in memory), and
against a plain FastMCP server behind ``idemgate mcp`` (a real proxy process over stdio, on an
SQLite file). Pydantic AI shows a model only a result's structured content when it has one, so
every notice must reach the model there too."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable

from integrations import same_action
from integrations.frameworks import require

require("fastmcp")
require("pydantic_ai")

from fastmcp import FastMCP  # noqa: E402
from fastmcp.client.transports import StdioTransport  # noqa: E402
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
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from idemgate import Engine, Policy  # noqa: E402
from idemgate.integrations import KEY_META  # noqa: E402
from idemgate.integrations.fastmcp import IdempotencyMiddleware  # noqa: E402
from idemgate.integrations.pydantic_ai import process_tool_call  # noqa: E402

#: The server behind the proxy: FastMCP, no idemgate in it; each purchase appends a line.
SERVER = '''
import sys
from fastmcp import FastMCP

mcp = FastMCP("billing")
LOG = sys.argv[1]


@mcp.tool
def buy(item: str, quantity: int, note: str | None = None) -> str:
    """Buys an item."""
    with open(LOG, "a") as f:
        f.write(item + "\\n")
    with open(LOG) as f:
        n = sum(1 for _ in f)
    return f"bought {quantity} {item}, order #{n}"


mcp.run(show_banner=False)
'''


def _binary() -> Path:
    binary = Path(
        os.environ.get("IDEMGATE_BIN")
        or Path(__file__).resolve().parents[4] / "target" / "debug" / "idemgate"
    )
    assert binary.exists(), f"no idemgate binary at {binary}: run `cargo build -p idemgate-cli`"
    return binary


class _Client:
    """Pydantic AI's MCP client driving one toolset: a conversation is a run's
    ``conversation_id``, a turn one run of a ``FunctionModel`` emitting the calls; what each call
    answered is what the model was shown (a tool return, or the retry prompt of an error)."""

    executions: list[Any]

    def toolset(self) -> MCPToolset:
        raise NotImplementedError

    def conversation(self) -> str:
        return f"conv-{uuid.uuid4().hex}"

    def turn(self, conversation: str, calls: list[same_action.Call]) -> list[same_action.Answer]:
        seen: list[list[Any]] = []
        parts = [ToolCallPart(same_action.TOOL, c.args, tool_call_id=c.id) for c in calls]

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen.append([p for m in messages if isinstance(m, ModelRequest) for p in m.parts])
            return ModelResponse(parts=parts if len(seen) == 1 else [TextPart("ok")])

        Agent(FunctionModel(model), toolsets=[self.toolset()]).run_sync(
            "buy", conversation_id=conversation
        )
        shown = seen[-1]
        return [
            same_action.Answer(
                next(
                    p.content
                    for p in reversed(shown)
                    if isinstance(p, (ToolReturnPart, RetryPromptPart)) and p.tool_call_id == c.id
                )
            )
            for c in calls
        ]


def _sender(key: Callable[..., str | None] | None) -> Any:
    """``process_tool_call``, and with ``key`` the program's key of the action in ``_meta`` (the
    orchestration layer's key: it names the action in every conversation)."""
    if key is None:
        return process_tool_call

    async def with_key(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
        async def keyed(n: str, a: dict[str, Any], metadata: Any = None) -> Any:
            return await call_tool(n, a, metadata={**(metadata or {}), KEY_META: key(a, ctx)})

        return await process_tool_call(ctx, keyed, name, args)

    return with_key


class ThroughMiddleware(_Client):
    """A FastMCP server gated in-process by the middleware, default options (and the policy
    fields a case sets)."""

    def __init__(self, engine: Engine, key: Any, **policy: Any) -> None:
        self.executions = []
        self.key = key
        self.server = FastMCP("billing")
        self.server.add_middleware(IdempotencyMiddleware(engine, {"buy": Policy(wait=30, **policy)}))

        @self.server.tool
        def buy(item: str, quantity: int, note: str | None = None) -> str:
            """Buys an item."""
            self.executions.append(item)
            return f"bought {quantity} {item}, order #{len(self.executions)}"

    def toolset(self) -> MCPToolset:
        return MCPToolset(self.server, process_tool_call=_sender(self.key))


class ThroughProxy(_Client):
    """A plain FastMCP server behind ``idemgate mcp`` with its default configuration (the tool's
    ``ttl`` in a configuration file when a case sets it): a proxy process per run (as a client
    that starts its servers per run does), one store."""

    def __init__(
        self,
        engine: Engine,
        key: Any,
        ttl: float | None = None,
        identity: tuple[str, ...] | None = None,
    ) -> None:
        self.key = key
        self.dir = Path(tempfile.mkdtemp(prefix="idemgate-same-action-"))
        weakref.finalize(self, shutil.rmtree, self.dir, True)  # the store and logs go with it
        (self.dir / "server.py").write_text(SERVER)
        self.log = self.dir / "bought"
        self.config: list[str] = []
        # A table is the tool's whole policy: a write, the default tombstone, what the case sets.
        table = []
        if ttl is not None:
            table.append(f'ttl = "{round(ttl * 1000)}ms"')
        if identity is not None:
            table.append("identity = [" + ", ".join(f'"{f}"' for f in identity) + "]")
        if table:
            (self.dir / "idemgate.toml").write_text("[tools.buy]\n" + "\n".join(table) + "\n")
            self.config = ["--config", str(self.dir / "idemgate.toml")]

    @property  # type: ignore[override]
    def executions(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def toolset(self) -> MCPToolset:
        transport = StdioTransport(
            command=str(_binary()),
            args=[
                "mcp",
                *self.config,
                "--store",
                f"sqlite://{self.dir / 'idemgate.db'}",
                "--journal",
                str(self.dir / "journal"),
                "--",
                sys.executable,
                str(self.dir / "server.py"),
                str(self.log),
            ],
            env=dict(os.environ, XDG_DATA_HOME=str(self.dir / "data"), IDEMGATE_LOG="warn"),
        )
        return MCPToolset(transport, process_tool_call=_sender(self.key))


test_through_the_middleware = same_action.stamp(
    "Pydantic AI's MCP client, FastMCP middleware", ThroughMiddleware
)
test_through_idemgate_mcp = same_action.stamp("Pydantic AI's MCP client, `idemgate mcp`", ThroughProxy)
