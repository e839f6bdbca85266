"""LangChain tools in LangGraph (``langgraph``, ``langchain-core``; tested with 1.2.24 and 1.8.3).

A tool run at most once per tool call::

    from typing import Annotated
    from langchain_core.tools import InjectedToolCallId
    from langgraph.prebuilt import ToolNode
    from langgraph.types import RetryPolicy
    from idemgate import Engine
    from idemgate.integrations.langgraph import idempotent_tool

    engine = Engine.open("postgres://…")

    @idempotent_tool(engine)
    async def charge(order: int, amount: str,
                     tool_call_id: Annotated[str, InjectedToolCallId]) -> dict:
        \"\"\"Charges the customer for an order.\"\"\"
        return payments.charge(order, amount)

    graph.add_node("tools", ToolNode([charge]), retry_policy=RetryPolicy(), timeout=10)

A call is one action per tool-call id (the parameter annotated ``InjectedToolCallId``; it is
not fingerprinted, and the model never sees it) within its **scope**: the graph's ``thread_id``
and checkpoint namespace (its node names, without task ids), the conversation a checkpointer
keeps; without a ``thread_id``, the graph run (one ``invoke``/``stream``). A retried node (its
``retry_policy`` after an exception or a node ``timeout``), a resumed checkpoint or a re-sent
call re-runs the tool with the same id and gets the stored result: the payment is made once; the
same id in another thread is another action. Within the scope, a write whose arguments equal an
earlier call's within the window (``fallback_window``, default 60 s, 0 turns it off) is the same
action under a new call id. Every call that did not run (the window's, a re-sent call id, the
model's own key again, the program's key) answers the model with a text that says so, with the
stored result. The model repeats on purpose with the tool's optional ``idempotency_key`` argument
(added to its schema, optional and nullable); the program names actions itself with
``key=lambda args, config: ...`` (a business identity, the same in every thread) or chooses the
scope with ``scope=``; both get the graph's ``RunnableConfig``.

``async`` tools are shielded by default: a node timeout does not tear the call in half, it
finishes and stores its outcome, and the retry waits for it (the policy's ``wait``). The tool
returns JSON data (stored and replayed), not a ``Command`` or a ``ToolMessage``. Refusals raise
idemgate's exceptions (``OutcomeUnknown``, ``InFlight``, ``KeyReused``...), which
``ToolNode(handle_tool_errors=...)`` may turn into messages.
A retry past the tool's ``ttl`` within its ``tombstone`` (``OutcomeExpired``) is not
raised: the model reads, in words, that the action already ran (when), was not performed again,
that its result is no longer kept, and how to do it again on purpose.
"""

from __future__ import annotations

import inspect
import threading
import typing
import uuid
from collections import OrderedDict
from typing import Any, Callable

from ..engine import Engine
from ._tool_calls import Namer, once_per_action, split_policy

__all__ = ["graph_scope", "idempotent_tool"]

# The scopes of graph runs without a thread or run id, by their `RunControl`: the one object Pregel
# makes per run and hands every task and retry of it (it takes neither attributes nor weak
# references). Each entry holds its control, so no other object can take its id while it is here.
# Least recently used first out past `_RUNS_MAX`: a run that has not called a tool while that many
# others did would get a new scope (its retried call would run again), so a long-lived process
# with many concurrent runs should give each a thread_id (or a run_id) instead.
_RUNS: OrderedDict[int, tuple[Any, str]] = OrderedDict()
_RUNS_MAX = 65536
_RUNS_LOCK = threading.Lock()


def _run_scope(control: Any) -> str:
    with _RUNS_LOCK:
        held = _RUNS.get(id(control))
        if held is not None and held[0] is control:
            _RUNS.move_to_end(id(control))
            return held[1]
        scope = f"langgraph/run:{uuid.uuid4().hex}"
        _RUNS[id(control)] = (control, scope)
        _RUNS.move_to_end(id(control))
        while len(_RUNS) > _RUNS_MAX:
            _RUNS.popitem(last=False)
        return scope


def _config() -> Any:
    """The graph's ``RunnableConfig`` of the running tool, or ``None`` outside a graph."""
    from langgraph.config import get_config

    try:
        return get_config()
    except RuntimeError:
        return None


def graph_scope(config: Any) -> str | None:
    """The default scope of a call: ``thread:<thread_id>/<namespace>`` (the checkpoint namespace's
    node names: a task id changes on every step), else ``run:<run_id>`` when the caller set one,
    else a random id of this graph run."""
    if not config:
        return None
    configurable = config.get("configurable") or {}
    thread = configurable.get("thread_id")
    if thread is not None:
        ns = str(configurable.get("checkpoint_ns") or "")
        nodes = "|".join(part.split(":", 1)[0] for part in ns.split("|")) if ns else ""
        return f"langgraph/thread:{thread}/{nodes}"
    if config.get("run_id") is not None:
        return f"langgraph/run:{config['run_id']}"
    control = getattr(configurable.get("__pregel_runtime"), "control", None)
    return None if control is None else _run_scope(control)


def _call_id_param(fn: Callable[..., Any]) -> str:
    """The parameter annotated ``InjectedToolCallId``."""
    from langchain_core.tools import InjectedToolCallId

    hints = typing.get_type_hints(fn, include_extras=True)
    for name in inspect.signature(fn).parameters:
        hint = hints.get(name)
        for meta in getattr(hint, "__metadata__", ()):
            if meta is InjectedToolCallId or isinstance(meta, InjectedToolCallId):
                return name
    raise TypeError(
        f"{getattr(fn, '__name__', fn)!r} needs a parameter "
        "`tool_call_id: Annotated[str, InjectedToolCallId]` (the idempotency key)"
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
    """A LangChain tool (``langchain_core.tools.tool``) of ``func`` gated by ``engine``: one action
    per ``InjectedToolCallId`` within its scope, and per identical call within the window (see
    the module documentation). ``tool`` is the record's tool name (default: the function's
    name); ``key(args, config)`` names the action by its business identity (not scoped;
    ``None``: the call id); ``scope(args, config)`` replaces the default scope
    (:func:`graph_scope`); ``model_key=False`` leaves the ``idempotency_key`` argument out of the
    schema; the keyword arguments of :class:`~idemgate.engine.PolicyOptions` override the
    engine's policy (``fallback_window`` is the re-emission window); the others go to
    ``langchain_core.tools.tool`` (``description``, ``parse_docstring``...). Use bare or with
    arguments."""
    from langchain_core.tools import tool as make_tool

    policy, tool_kwargs = split_policy(kwargs)

    def build(fn: Callable[..., Any]) -> Any:
        call_id = _call_id_param(fn)
        gated = once_per_action(
            engine,
            fn,
            tool=tool or fn.__name__,
            call_id_of=lambda b: b.arguments.get(call_id),
            context_of=lambda b: _config(),
            default_scope=graph_scope,
            exclude={call_id},
            shield=shield,
            policy=policy,
            key=key,
            scope=scope,
            model_key=model_key,
        )
        return make_tool(gated, **tool_kwargs)

    return build(func) if func is not None else build
