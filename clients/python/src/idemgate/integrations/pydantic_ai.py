"""Pydantic AI (``pydantic-ai`` / ``pydantic-ai-slim``; tested with 2.68.0).

A tool run at most once per tool call::

    from pydantic_ai import Agent, RunContext
    from idemgate import Engine
    from idemgate.integrations.pydantic_ai import idempotent_tool

    engine = Engine.open("postgres://…")
    agent = Agent("openai:gpt-5")

    @agent.tool(timeout=10)
    @idempotent_tool(engine)
    async def charge(ctx: RunContext[None], order: int, amount: str) -> dict:
        \"\"\"Charges the customer for an order.\"\"\"
        return payments.charge(order, amount)

The key is ``ctx.tool_call_id``; the first parameter must take the ``RunContext`` (it is not
fingerprinted). When the tool's ``timeout`` expires Pydantic AI asks the model to retry; the
model re-emits the call with the same id and gets the stored result, the payment is made once.
``async`` tools are shielded by default: the timed-out call still finishes and stores its
outcome, and the retry waits for it (the policy's ``wait``). Refusals raise idemgate's exceptions
(``OutcomeUnknown``, ``InFlight``, ``KeyReused``...).

MCP servers behind ``idemgate mcp``: ``MCPServerStdio(..., process_tool_call=process_tool_call)``
sends the tool-call id as ``_meta["dev.idemgate/idempotency-key"]``.
"""

from __future__ import annotations

from typing import Any, Callable

from ..engine import Engine
from ._gate import KEY_META, context_param, gate, policy_overrides

__all__ = ["KEY_META", "idempotent_tool", "process_tool_call"]


def idempotent_tool(
    engine: Engine,
    func: Callable[..., Any] | None = None,
    *,
    tool: str | None = None,
    shield: bool = True,
    kind: str | None = None,
    ttl: float | None = None,
    lease: float | None = None,
    wait: float | None = None,
    fallback_window: float | None = None,
    on_unknown: str | None = None,
) -> Any:
    """``func`` (whose first parameter takes the ``RunContext``) gated by ``engine``, keyed by
    ``RunContext.tool_call_id``; register the result with ``@agent.tool``, ``Tool(...)`` or a
    ``FunctionToolset``. ``tool`` is the record's tool name (default: the function's name); the
    policy fields override the engine's. Use bare or with arguments."""
    overrides = policy_overrides(kind, ttl, lease, wait, fallback_window, on_unknown)

    def build(fn: Callable[..., Any]) -> Any:
        ctx = context_param(fn, "RunContext")
        return gate(
            engine,
            fn,
            tool=tool or fn.__name__,
            key_of=lambda b: getattr(b.arguments[ctx], "tool_call_id", None),
            exclude={ctx},
            shield=shield,
            overrides=overrides,
        )

    return build(func) if func is not None else build


async def process_tool_call(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
    """A ``process_tool_call`` for Pydantic AI's MCP servers: the tool-call id as
    ``_meta["dev.idemgate/idempotency-key"]``, which ``idemgate mcp`` takes as the key."""
    call_id = getattr(ctx, "tool_call_id", None)
    if not call_id:
        return await call_tool(name, args)
    return await call_tool(name, args, metadata={KEY_META: call_id})
