"""LangChain tools (``langchain-core``; tested with 1.8.3): any ``BaseTool`` (a ``@tool``
function, a ``StructuredTool``, the tools ``langchain-mcp-adapters`` loads from an MCP server),
run at most once per logical action::

    from langchain_core.tools import tool
    from idemgate import Engine
    from idemgate.integrations.langchain import idempotent, idempotent_tool

    engine = Engine.open("postgres://…")

    @idempotent_tool(engine)
    async def charge(order: int, amount: str) -> dict:
        \"\"\"Charges the customer for an order.\"\"\"
        return payments.charge(order, amount)

    tools = [charge, *[idempotent(engine, t) for t in await mcp_client.get_tools()]]

A call is one action per tool-call id (the ``id`` of the ``ToolCall`` the tool is invoked with;
the function needs no parameter for it) within its **scope**: the run's ``RunnableConfig``, its
``thread_id`` (with the checkpoint namespace inside a LangGraph graph, as
:func:`idemgate.integrations.langgraph.graph_scope`), else the graph run, else the run the tool
is called from (the agent loop's chain or ``Runnable``: its run id, the tool run's parent, one
per ``invoke``). A tool called outside any run and without a ``thread_id`` (the bare
``tool.invoke(tool_call)`` loop of LangChain's tool-calling guide) names no conversation: each
call is its own invocation, so its call id reaches no other call (a model sending the same id
in every conversation never gets another conversation's result) and no window applies; give
the loop's calls the conversation's ``thread_id`` (``tool.invoke(tool_call, {"configurable":
{"thread_id": ...}})``) to have re-sent and re-emitted calls answered once. The call id names a
message, not an action: the same id in another thread or run is another action. A re-sent
``ToolCall`` (an agent loop retrying after a timeout or an error) gets the stored result. Within
the scope, a write whose arguments equal an earlier call's within the window
(``fallback_window``, default 60 s, 0 turns it off) is the same action under a new call id.
Every call that did not run tells the model so in words (when the action ran, its result, how
to do it again on purpose), under a re-sent call id as under the window; a tool whose content is
a list of content blocks keeps them, the notice added as a text block. The model repeats on
purpose with the tool's optional ``idempotency_key`` argument (added to its schema, optional
and nullable); the program names actions itself with
``key=lambda args, config: ...`` (a business identity, the same in every thread) or chooses the
scope with ``scope=``; both get the tool's ``RunnableConfig``.

The wrapped tool keeps the name, description and model-facing schema of the tool it wraps
(injected arguments, such as ``InjectedToolCallId`` or ``InjectedState``, are passed through and
not fingerprinted). It returns the tool's content as JSON data (stored and replayed; the artifact
of a ``content_and_artifact`` tool is not kept). Async invocations (``ainvoke``) are shielded by
default: a timeout that cancels the call does not tear it in half, it finishes and stores its
outcome, and the re-sent call waits for it (the policy's ``wait``). Refusals raise idemgate's
exceptions (``OutcomeUnknown``, ``InFlight``, ``KeyReused``...).
A retry past the tool's ``ttl`` within its ``tombstone`` (``OutcomeExpired``) is not
raised: the model reads, in words, that the action already ran (when), was not performed again,
that its result is no longer kept, and how to do it again on purpose.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from typing import Any, Callable, Unpack

from ..engine import Engine, PolicyOptions
from ._tool_calls import (
    KEY_ARGUMENT,
    Action,
    Namer,
    Outcome,
    ToolCalls,
    jsonable,
    schema_fields,
    split_policy,
)
from .langgraph import graph_scope

__all__ = ["idempotent", "idempotent_tool", "run_scope"]

# The ToolCall id the running tool was invoked with: set by the wrapper's run/arun, which
# LangChain copies into the context _run/_arun run in.
_CALL_ID: ContextVar[str | None] = ContextVar("idemgate_langchain_call_id", default=None)


def run_scope(config: Any, parent_run_id: Any = None) -> str | None:
    """The default scope of a call: the ``thread_id`` (and the checkpoint namespace), else the
    LangGraph run (:func:`~idemgate.integrations.langgraph.graph_scope`), else
    ``langchain/run:<parent_run_id>``, the run the tool is called from; ``None`` without either."""
    scope = graph_scope(config)
    if scope is not None:
        return scope
    return f"langchain/run:{parent_run_id}" if parent_run_id is not None else None


@functools.lru_cache(maxsize=None)
def _tool_class() -> type:
    """The ``BaseTool`` subclass wrapping a tool (made on first use: langchain-core is imported
    only when this module is used)."""
    from langchain_core.runnables.config import ensure_config
    from langchain_core.tools import BaseTool

    class IdempotentTool(BaseTool):
        """A tool gated by an engine: one execution per action (see the module)."""

        inner: BaseTool
        calls: Any

        def run(self, tool_input: Any, *args: Any, tool_call_id: str | None = None, **kw: Any) -> Any:
            token = _CALL_ID.set(tool_call_id)
            try:
                return super().run(tool_input, *args, tool_call_id=tool_call_id, **kw)
            finally:
                _CALL_ID.reset(token)

        async def arun(
            self, tool_input: Any, *args: Any, tool_call_id: str | None = None, **kw: Any
        ) -> Any:
            token = _CALL_ID.set(tool_call_id)
            try:
                return await super().arun(tool_input, *args, tool_call_id=tool_call_id, **kw)
            finally:
                _CALL_ID.reset(token)

        def _run(self, *args: Any, run_manager: Any = None, **kwargs: Any) -> Any:
            g: _Calls = self.calls
            call = g.prepare(args, kwargs, ensure_config(), run_manager)
            return g.run(
                call.action, call.payload, lambda: _content(self.inner.invoke(call.input, call.config))
            )

        async def _arun(self, *args: Any, run_manager: Any = None, **kwargs: Any) -> Any:
            g: _Calls = self.calls
            call = g.prepare(args, kwargs, ensure_config(), run_manager)

            async def run() -> Any:
                return _content(await self.inner.ainvoke(call.input, call.config))

            return await g.arun(call.action, call.payload, run)

    return IdempotentTool


def _content(output: Any) -> Any:
    """A tool's output without its ``ToolMessage`` (invoked with a ``ToolCall``, a tool answers
    with one): its content."""
    from langchain_core.messages import ToolMessage

    return output.content if isinstance(output, ToolMessage) else output


def _blocks(value: Any) -> bool:
    """Whether a tool's content is a list of LangChain content blocks."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in value)
    )


class _Call:
    def __init__(self, action: Any, payload: Any, input: Any, config: Any) -> None:
        self.action, self.payload, self.input, self.config = action, payload, input, config


class _Calls(ToolCalls):
    """How one wrapped tool names and runs its calls."""

    def __init__(self, engine: Engine, inner: Any, tool: str, **options: Any) -> None:
        self.visible = schema_fields(inner.tool_call_schema)  # what the model sends: fingerprinted
        super().__init__(engine, inner, tool, self.visible, **options)

    def answer(self, out: Outcome, action: Action) -> Any:
        # A tool answering with content blocks (an MCP tool's text, images...) keeps them on a
        # replay, the notice after them as a text block: the model reads both.
        value = out.result.value
        if _blocks(value):
            told = out.notice(self.name, self.model_key, action.rule, result_above=True)
            return value if told is None else [*value, {"type": "text", "text": told}]
        return super().answer(out, action)

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any], config: Any, run_manager: Any) -> _Call:
        call_id = _CALL_ID.get()
        model_key = self.model_key_of(kwargs)
        if args:  # a single string input
            payload: Any = {"input": args[0]}
            args_in: Any = args[0]
        else:
            payload = {k: v for k, v in kwargs.items() if k in self.visible and k != KEY_ARGUMENT}
            args_in = kwargs
        payload = jsonable(payload)
        parent = getattr(run_manager, "parent_run_id", None)
        action = self.action(call_id, payload, config, lambda: run_scope(config, parent), model_key)
        # The wrapped tool gets the call as a ToolCall (its injected call id, if it has one).
        tool_input = (
            {"name": self.inner.name, "args": args_in, "id": call_id, "type": "tool_call"}
            if call_id is not None and isinstance(args_in, dict)
            else args_in
        )
        return _Call(action, payload, tool_input, config)


def idempotent(
    engine: Engine,
    base_tool: Any,
    *,
    tool: str | None = None,
    key: Namer | None = None,
    scope: Namer | None = None,
    model_key: bool = True,
    shield: bool = True,
    **policy: Unpack[PolicyOptions],
) -> Any:
    """A LangChain tool running ``base_tool`` (any ``BaseTool``) through ``engine``: one action
    per tool-call id within its scope, and per identical call within the window (see the module
    documentation). ``tool`` is the record's tool name (default: the tool's name);
    ``key(args, config)`` names the action by its business identity (not scoped; ``None``: the
    call id); ``scope(args, config)`` replaces the default scope (:func:`run_scope`);
    ``model_key=False`` leaves the ``idempotency_key`` argument out of the schema; the keyword
    arguments of :class:`~idemgate.engine.PolicyOptions` override the engine's policy
    (``fallback_window`` is the re-emission window)."""
    g = _Calls(
        engine,
        base_tool,
        tool or base_tool.name,
        key=key,
        scope=scope,
        model_key=model_key,
        shield=shield,
        policy=policy,
    )
    return _tool_class()(
        name=base_tool.name,
        description=base_tool.description,
        args_schema=g.schema(base_tool.args_schema),
        return_direct=base_tool.return_direct,
        handle_tool_error=base_tool.handle_tool_error,
        handle_validation_error=base_tool.handle_validation_error,
        metadata=base_tool.metadata,
        tags=base_tool.tags,
        inner=base_tool,
        calls=g,
    )


def idempotent_tool(
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
    """``langchain_core.tools.tool(func, **tool_kwargs)`` gated by ``engine``
    (:func:`idempotent`): the keyword arguments of :class:`~idemgate.engine.PolicyOptions` go to
    the gate, the others to ``tool``. Use bare or with arguments."""
    policy, tool_kwargs = split_policy(kwargs)

    def build(fn: Callable[..., Any]) -> Any:
        from langchain_core.tools import tool as make_tool

        made = make_tool(fn, **tool_kwargs)
        return idempotent(
            engine, made, tool=tool, key=key, scope=scope, model_key=model_key, shield=shield, **policy
        )

    return build(func) if func is not None else build
