"""The OpenAI Agents SDK (``openai-agents``; tested with 0.24.0).

A function tool run at most once per tool call::

    from agents import Agent, ToolContext
    from idemgate import Engine
    from idemgate.integrations.openai_agents import idempotent_function_tool

    engine = Engine.open("postgres://…")

    @idempotent_function_tool(engine, timeout=10)
    async def charge(ctx: ToolContext, order: int, amount: str) -> dict:
        \"\"\"Charges the customer for an order.\"\"\"
        return payments.charge(order, amount)

    agent = Agent(name="billing", tools=[charge])

The key is ``ctx.tool_call_id``: the model re-emitting the call (after a timeout, an error
message, a resumed run) gets the stored result, and the payment is made once. The first parameter
must take the ``ToolContext`` (it is not fingerprinted). ``async`` tools are shielded by default:
when the SDK's ``timeout`` cancels the call, the function still finishes and its outcome is
stored, so the re-emitted call waits for it (the policy's ``wait``) and replays it. Refusals raise
idemgate's exceptions (``OutcomeUnknown``, ``InFlight``, ``KeyReused``...), which the SDK turns
into a tool error message for the model (its ``failure_error_function``).

MCP servers behind ``idemgate mcp``: ``MCPServerStdio(..., tool_meta_resolver=tool_meta_resolver)``
sends the tool-call id as ``_meta["dev.idemgate/idempotency-key"]``.
"""

from __future__ import annotations

from typing import Any, Callable

from ..engine import Engine
from ._gate import KEY_META, context_param, gate, policy_overrides

__all__ = ["KEY_META", "idempotent_function_tool", "tool_meta_resolver"]


def idempotent_function_tool(
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
    **function_tool_kwargs: Any,
) -> Any:
    """``agents.function_tool`` of ``func`` gated by ``engine``, keyed by ``ToolContext.tool_call_id``.

    ``tool`` is the record's tool name (default: ``name_override`` or the function's name);
    ``kind``, ``ttl``, ``lease``, ``wait``, ``fallback_window``, ``on_unknown`` override the
    engine's policy; the other keyword arguments go to ``function_tool`` (``timeout``,
    ``name_override``, ``failure_error_function``...). Use bare or with arguments.
    """
    from agents import function_tool

    overrides = policy_overrides(kind, ttl, lease, wait, fallback_window, on_unknown)

    def build(fn: Callable[..., Any]) -> Any:
        ctx = context_param(fn, "ToolContext")
        name = tool or function_tool_kwargs.get("name_override") or fn.__name__
        gated = gate(
            engine,
            fn,
            tool=name,
            key_of=lambda b: getattr(b.arguments[ctx], "tool_call_id", None),
            exclude={ctx},
            shield=shield,
            overrides=overrides,
        )
        return function_tool(gated, **function_tool_kwargs)

    return build(func) if func is not None else build


def tool_meta_resolver(context: Any) -> dict[str, Any] | None:
    """A ``tool_meta_resolver`` for the SDK's MCP servers: the tool-call id as
    ``_meta["dev.idemgate/idempotency-key"]``, which ``idemgate mcp`` takes as the key."""
    call_id = getattr(context.run_context, "tool_call_id", None)
    return {KEY_META: call_id} if call_id else None
