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

A call is one action per ``ctx.tool_call_id`` within its **scope**, the conversation the SDK
knows: ``RunConfig.group_id`` when the application sets it (the SDK's id linking the runs of one
conversation: set it to the session's id or the server conversation's), else the run itself. A
retried run in the same conversation that emits the same call id gets the stored result; the
same id in another run (a model reusing ids) is another action. Within the scope, a write whose
arguments equal an earlier call's within the window (``fallback_window``, default 60 s, 0 turns
it off) is the same action under a new call id: the model re-emitting a call after a timeout or
an error is told, in words, that it already ran and was not repeated. The model repeats on
purpose with the tool's optional ``idempotency_key`` argument (added to its schema); the program
names actions itself with ``key=lambda args, ctx: ...`` (a business identity, the same in every
conversation) or chooses the scope with ``scope=lambda args, ctx: ...``.

The first parameter must take the ``ToolContext`` (it is not fingerprinted). ``async`` tools are
shielded by default: when the SDK's ``timeout`` cancels the call, the function still finishes and
its outcome is stored, so a retry waits for it (the policy's ``wait``) and replays it. Every call
that did not run tells the model so in words: a replay (a re-sent call id, the model's own
``idempotency_key`` again, the program's ``key=``, the window) answers with a notice that holds
the stored result. Refusals raise idemgate's exceptions (``OutcomeUnknown``, ``InFlight``,
``KeyReused``...), which the SDK turns into a tool error message for the model: without a
``failure_error_function`` of the application's, idemgate's own says what was refused and why
(the SDK's default hides every exception's text; other exceptions still get it).
A retry past the tool's ``ttl`` within its ``tombstone`` (``OutcomeExpired``) is not
raised: the model reads, in words, that the action already ran (when), was not performed again,
that its result is no longer kept, and how to do it again on purpose.

MCP servers behind ``idemgate mcp`` (or gated by the FastMCP middleware):
``MCPServerStdio(..., tool_meta_resolver=tool_meta_resolver)`` sends the key of the call's action
(its call id within its scope) as ``_meta["dev.idemgate/idempotency-key"]`` and the scope as
``_meta["dev.idemgate/conversation"]``.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

from ..engine import Engine
from ..errors import IdemgateError
from ._tool_calls import KEY_META, Namer, context_tool, scoped_meta, split_policy

__all__ = [
    "KEY_META",
    "failure_error_function",
    "idempotent_function_tool",
    "run_scope",
    "tool_meta_resolver",
]

# Where the run's scope is kept: on the run's ``Usage``, the one object every ``ToolContext`` of a
# run shares (the SDK gives tools no run id).
_RUN_ATTR = "_idemgate_run_scope"


def run_scope(ctx: Any) -> str | None:
    """The default scope of a call: ``group:<RunConfig.group_id>`` when the application set one,
    else ``run:<a random id of this run>`` (kept on the run's ``Usage``, which the SDK copies
    into an in-process checkpoint of the run but not into a serialized ``RunState``: a run
    resumed from one is a new run here, so set ``group_id`` for those)."""
    group = getattr(getattr(ctx, "run_config", None), "group_id", None)
    if group:
        return f"openai-agents/group:{group}"
    usage = getattr(ctx, "usage", None)
    if usage is None:
        return None
    run = getattr(usage, _RUN_ATTR, None)
    if run is None:
        run = f"openai-agents/run:{uuid.uuid4().hex}"
        try:
            setattr(usage, _RUN_ATTR, run)
        except AttributeError:
            return None
    return str(run)


def failure_error_function(ctx: Any, error: Exception) -> str:
    """The tool error the model reads when no ``failure_error_function`` is given: an idemgate
    refusal in words (why the call did not run, what may be done), so the model never takes a
    call that was not run for an unexplained failure to try again; any other exception as the
    SDK's default (which hides its text)."""
    if isinstance(error, IdemgateError):
        name = getattr(ctx, "tool_name", None) or "the tool"
        return f"idemgate: this call of {name} was not run: {error}"
    from agents.tool import default_tool_error_function

    return default_tool_error_function(ctx, error)


def idempotent_function_tool(
    engine: Engine,
    func: Callable[..., Any] | None = None,
    *,
    tool: str | None = None,
    key: Namer | None = None,
    scope: Namer | None = None,
    model_key: bool = True,
    shield: bool = True,
    **kwargs: Any,
) -> Any:
    """``agents.function_tool`` of ``func`` gated by ``engine``: one action per
    ``ToolContext.tool_call_id`` within its scope, and per identical call within the scope's
    window (see the module documentation).

    ``tool`` is the record's tool name (default: ``name_override`` or the function's name);
    ``key(args, ctx)`` names the action by its business identity (not scoped; ``None``: the call
    id); ``scope(args, ctx)`` replaces the default scope (:func:`run_scope`); ``model_key=False``
    leaves the ``idempotency_key`` argument out of the schema. The keyword arguments of
    :class:`~idemgate.engine.PolicyOptions` override the engine's policy (``fallback_window`` is
    the re-emission window); the others go to ``function_tool`` (``timeout``, ``name_override``,
    ``failure_error_function``..., default :func:`failure_error_function`). Use bare or with
    arguments.
    """
    from agents import function_tool

    policy, function_tool_kwargs = split_policy(kwargs)
    function_tool_kwargs.setdefault("failure_error_function", failure_error_function)

    def build(fn: Callable[..., Any]) -> Any:
        gated = context_tool(
            engine,
            fn,
            what="ToolContext",
            tool=tool or function_tool_kwargs.get("name_override") or fn.__name__,
            name=function_tool_kwargs.get("name_override"),
            default_scope=run_scope,
            key=key,
            scope=scope,
            model_key=model_key,
            shield=shield,
            policy=policy,
        )
        return function_tool(gated, **function_tool_kwargs)

    return build(func) if func is not None else build


def tool_meta_resolver(context: Any) -> dict[str, Any] | None:
    """A ``tool_meta_resolver`` for the SDK's MCP servers: the tool call's id as
    ``_meta["dev.idemgate/tool-call-id"]`` and its scope as ``_meta["dev.idemgate/conversation"]``,
    from which ``idemgate mcp`` and the FastMCP middleware name its action as the integrations
    do (the call id within the conversation, with the re-emission window)."""
    run_context = context.run_context
    return scoped_meta(run_scope(run_context), getattr(run_context, "tool_call_id", None))
