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

A call is one action per ``ctx.tool_call_id`` within its **scope**, the conversation:
``RunContext.conversation_id``, which Pydantic AI takes from the run's ``conversation_id``
argument or the message history the run continues, else makes new for the run (so a constant
call id, as ``TestModel``'s ``pyd_ai_tool_call_id__<tool>``, in two separate runs is two
actions). When the tool's ``timeout`` expires Pydantic AI asks the model to retry; the model
re-emits the call with the same id and gets the stored result. Within the scope, a write whose
arguments equal an earlier call's within the window (``fallback_window``, default 60 s, 0 turns
it off) is the same action under a new call id. Every call that did not run (the window's, a
re-sent or reused call id, the model's own key again, the program's key) answers the model with
a text that says so, with the stored result, naming the tool as registered
(``RunContext.tool_name``). The model repeats on purpose with the tool's optional
``idempotency_key`` argument (added to its schema, optional and nullable); the program names
actions itself with
``key=lambda args, ctx: ...`` (a business identity, the same in every conversation) or chooses
the scope with ``scope=lambda args, ctx: ...``.

The first parameter must take the ``RunContext`` (it is not fingerprinted). ``async`` tools are
shielded by default: the timed-out call still finishes and stores its outcome, and the retry
waits for it (the policy's ``wait``). Refusals raise idemgate's exceptions (``OutcomeUnknown``,
``InFlight``, ``KeyReused``...), which Pydantic AI raises out of the run to the program.
A retry past the tool's ``ttl`` within its ``tombstone`` (``OutcomeExpired``) is not
raised: the model reads, in words, that the action already ran (when), was not performed again,
that its result is no longer kept, and how to do it again on purpose.

MCP servers behind ``idemgate mcp`` (or gated by the FastMCP middleware):
``MCPServerStdio(..., process_tool_call=process_tool_call)`` sends the key of the call's action
(its call id within its scope) as ``_meta["dev.idemgate/idempotency-key"]`` and the scope as
``_meta["dev.idemgate/conversation"]``.
"""

from __future__ import annotations

from typing import Any, Callable, Unpack

from ..engine import Engine, PolicyOptions
from ._tool_calls import KEY_META, Namer, context_tool, scoped_meta

__all__ = ["KEY_META", "conversation_scope", "idempotent_tool", "process_tool_call"]


def conversation_scope(ctx: Any) -> str | None:
    """The default scope of a call: the run's ``conversation_id``, else its ``run_id``."""
    conversation = getattr(ctx, "conversation_id", None) or getattr(ctx, "run_id", None)
    return f"pydantic-ai/{conversation}" if conversation else None


def idempotent_tool(
    engine: Engine,
    func: Callable[..., Any] | None = None,
    *,
    tool: str | None = None,
    key: Namer | None = None,
    scope: Namer | None = None,
    model_key: bool = True,
    shield: bool = True,
    **policy: Unpack[PolicyOptions],
) -> Any:
    """``func`` (whose first parameter takes the ``RunContext``) gated by ``engine``: one action
    per ``RunContext.tool_call_id`` within its conversation, and per identical call within the
    window (see the module documentation); register the result with ``@agent.tool``,
    ``Tool(...)`` or a ``FunctionToolset``. ``tool`` is the record's tool name (default: the
    function's name); ``key(args, ctx)`` names the action by its business identity (not scoped;
    ``None``: the call id); ``scope(args, ctx)`` replaces the default scope
    (:func:`conversation_scope`); ``model_key=False`` leaves the ``idempotency_key`` argument out
    of the schema; the keyword arguments of :class:`~idemgate.engine.PolicyOptions` override the
    engine's policy (``fallback_window`` is the re-emission window). Use bare or with
    arguments."""

    def build(fn: Callable[..., Any]) -> Any:
        return context_tool(
            engine,
            fn,
            what="RunContext",
            tool=tool or fn.__name__,
            default_scope=conversation_scope,
            key=key,
            scope=scope,
            model_key=model_key,
            shield=shield,
            policy=policy,
        )

    return build(func) if func is not None else build


async def process_tool_call(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
    """A ``process_tool_call`` for Pydantic AI's MCP servers: the call's tool-call id as
    ``_meta["dev.idemgate/tool-call-id"]`` and its conversation as
    ``_meta["dev.idemgate/conversation"]``, from which ``idemgate mcp`` and the FastMCP
    middleware name its action as the integrations do (the call id within the conversation,
    with the re-emission window)."""
    meta = scoped_meta(conversation_scope(ctx), getattr(ctx, "tool_call_id", None))
    return await call_tool(name, args, metadata=meta)
