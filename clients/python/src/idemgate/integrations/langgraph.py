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

The key is the injected tool-call id (the parameter annotated ``InjectedToolCallId``; it is not
fingerprinted, and the model never sees it). A retried node (its ``retry_policy`` after an
exception or a node ``timeout``), a resumed checkpoint or a re-emitted call re-runs the tool with
the same id and gets the stored result: the payment is made once. ``async`` tools are shielded by
default: a node timeout does not tear the call in half, it finishes and stores its outcome, and
the retry waits for it (the policy's ``wait``). The tool returns JSON data (stored and replayed),
not a ``Command`` or a ``ToolMessage``. Refusals raise idemgate's exceptions (``OutcomeUnknown``,
``InFlight``, ``KeyReused``...), which ``ToolNode(handle_tool_errors=...)`` may turn into messages.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any, Callable

from ..engine import Engine
from ._gate import gate, policy_overrides

__all__ = ["idempotent_tool"]


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
    shield: bool = True,
    kind: str | None = None,
    ttl: float | None = None,
    lease: float | None = None,
    wait: float | None = None,
    fallback_window: float | None = None,
    on_unknown: str | None = None,
    **tool_kwargs: Any,
) -> Any:
    """A LangChain tool (``langchain_core.tools.tool``) of ``func`` gated by ``engine``, keyed by
    its ``InjectedToolCallId`` parameter. ``tool`` is the record's tool name (default: the
    function's name); the policy fields override the engine's; ``tool_kwargs`` go to
    ``langchain_core.tools.tool`` (``description``, ``parse_docstring``...). Use bare or with
    arguments."""
    from langchain_core.tools import tool as make_tool

    overrides = policy_overrides(kind, ttl, lease, wait, fallback_window, on_unknown)

    def build(fn: Callable[..., Any]) -> Any:
        call_id = _call_id_param(fn)
        gated = gate(
            engine,
            fn,
            tool=tool or fn.__name__,
            key_of=lambda b: b.arguments.get(call_id),
            exclude={call_id},
            shield=shield,
            overrides=overrides,
        )
        return make_tool(gated, **tool_kwargs)

    return build(func) if func is not None else build
