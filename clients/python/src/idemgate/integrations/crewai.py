# CrewAI has a venv of its own (tests/integrations/crewai): where the package is type-checked it is
# not installed, and this module imports it only when used (mypy: pyproject.toml's override).
# pyright: reportMissingImports=false
"""CrewAI tools (``crewai``; tested with 1.15.30): any CrewAI tool (a ``@tool`` function, a
``BaseTool`` subclass, a ``crewai_tools`` tool), run at most once per logical action::

    from crewai import Agent
    from idemgate import Engine
    from idemgate.integrations.crewai import idempotent, idempotent_tool

    engine = Engine.open("postgres://…")

    @idempotent_tool(engine)
    def charge(order: int, amount: str) -> dict:
        \"\"\"Charges the customer for an order.\"\"\"
        return payments.charge(order, amount)

    agent = Agent(role="billing", goal="…", backstory="…",
                  tools=[charge, idempotent(engine, SendInvoiceTool())])

CrewAI hands a tool no call id: the LLM's tool-call id stays in the agent loop (neither the tool,
its hooks nor its events see it), and its text (ReAct) tool calling has none at all. So a call's
action is named by its **arguments within its scope**: a write whose canonical arguments equal an
earlier call's of the same tool in the scope within the window (``fallback_window``, default 60 s)
is the same action. That is what CrewAI repeats: after a tool raised (its own timeout, a dropped
connection) the text loop re-sends the same call at once, up to three times; an agent whose step
failed is re-run (``max_retry_limit``) and its model emits the calls again; a model unsure of a
result re-emits the call. The first call's outcome answers them all, and the model reads, in
words, that the action already ran, when, with what result, and that it was not repeated. A first
call that raised is *unknown* (it may have charged before failing): its repeats are refused with
``OutcomeUnknown``, never run again, until it is resolved.

The **scope** (:func:`crew_scope`) is the conversation CrewAI knows: inside a ``Flow``, its state
id (``flow:<id>``, the same on each kickoff of the flow and when a persisted flow is restored with
its ``id``); else the execution (``execution:<id>``), one per outermost kickoff (``crew.kickoff``,
``Agent.kickoff``, each input of ``kickoff_for_each``), which a host that keeps conversations binds
itself with ``crewai.execution.set_execution_uuid(conversation_id)`` before the kickoff. The same
arguments in another scope are another action. A tool run outside any kickoff has no scope, so
nothing names its action: it needs ``key=`` (else ``KeyRequired``); so does a tool with
``fallback_window=0``.

The model repeats on purpose with the tool's optional ``idempotency_key`` argument (added to its
schema; CrewAI's text prompt renders every argument as required and non-null, so the wrapper
shows it there as optional and nullable); a replay under it, or under ``key=``, is told in words
as the window's is, naming the tool as CrewAI shows it to the model. The program names actions
itself with ``key=lambda args, ctx: ...`` (a business identity, the same in every scope) or
chooses the scope with ``scope=lambda args, ctx: ...``; ``ctx`` is a :class:`CrewContext`
(CrewAI gives a tool no context object of its own).

The wrapped tool keeps the name, description and argument schema of the tool it wraps, and never
lets CrewAI's in-memory tool cache answer for it (``cache_function`` says no): the record does,
in every process, and says so. Its result is stored as JSON data; a replay gets that same data.
Refusals raise idemgate's exceptions (``OutcomeUnknown``, ``InFlight``, ``KeyReused``...), which
CrewAI hands the model as the tool's error. A call named by ``key=`` or the model's
``idempotency_key`` retried past the tool's ``ttl`` within its ``tombstone`` (``OutcomeExpired``)
is not raised: the model reads, in words, that the action already ran (when), was not performed
again, that its result is no longer kept, and how to do it again on purpose. (A call the window
named keeps no tombstone: its record lives for the window.)

MCP tools: CrewAI's MCP clients retry a call that timed out (``MCPClient``, ``MCPToolWrapper``)
inside the tool, below this wrapper; gate those at the server (``idemgate mcp`` or the FastMCP
middleware).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Unpack

from ..engine import Engine, PolicyOptions
from ._tool_calls import (
    KEY_ARGUMENT,
    Action,
    Namer,
    ToolCalls,
    jsonable,
    schema_fields,
    split_policy,
)

__all__ = ["CrewContext", "crew_scope", "current_context", "idempotent", "idempotent_tool"]

#: The name CrewAI gives the ``Flow`` it runs each agent's loop in: not a user's flow.
_EXECUTOR_FLOW = "AgentExecutor"


@dataclass(frozen=True)
class CrewContext:
    """What CrewAI tells a running tool of where it runs (from its context variables): the
    ``execution_id`` of the outermost kickoff, the id of the user's ``Flow`` it runs in
    (``flow_id``, ``None`` outside one) and the ``task_id`` of the task being executed."""

    execution_id: str | None
    flow_id: str | None
    task_id: str | None


def current_context() -> CrewContext:
    """The :class:`CrewContext` of the running tool."""
    from crewai.context import get_current_task_id
    from crewai.execution import get_execution_uuid
    from crewai.flow.flow_context import current_flow_id, current_flow_name

    flow = current_flow_id.get() if current_flow_name.get() != _EXECUTOR_FLOW else None
    return CrewContext(get_execution_uuid(), flow or None, get_current_task_id())


def crew_scope(ctx: CrewContext) -> str | None:
    """The default scope of a call: ``crewai/flow:<flow id>`` inside a ``Flow``, else
    ``crewai/execution:<execution id>``; ``None`` outside any kickoff."""
    if ctx.flow_id:
        return f"crewai/flow:{ctx.flow_id}"
    if ctx.execution_id:
        return f"crewai/execution:{ctx.execution_id}"
    return None


def _never_cache(_args: Any = None, _result: Any = None) -> bool:
    return False


class _Calls(ToolCalls):
    """How one wrapped tool names and runs its calls."""

    def __init__(self, engine: Engine, inner: Any, tool: str, *a: Any, **options: Any) -> None:
        super().__init__(engine, inner, tool, *a, **options)
        from crewai.utilities.string_utils import sanitize_tool_name

        # CrewAI shows the model the tool's name sanitized (`Charge Order` -> `charge_order`):
        # the name a notice must use.
        self.name = sanitize_tool_name(self.name)

    def prepare(self, kwargs: dict[str, Any]) -> tuple[Action, Any, dict[str, Any]]:
        """The call's action, its fingerprinted arguments, and what the wrapped tool gets."""
        model_key = self.model_key_of(kwargs)
        payload = jsonable({k: v for k, v in kwargs.items() if k != KEY_ARGUMENT})
        ctx = current_context()
        # CrewAI hands a tool no call id: the window names the action.
        return self.action(None, payload, ctx, lambda: crew_scope(ctx), model_key), payload, kwargs


@functools.lru_cache(maxsize=None)
def _tool_class() -> type:
    """The ``BaseTool`` subclass wrapping a tool (made on first use: crewai is imported only when
    this module is used)."""
    from crewai.tools import BaseTool
    from crewai.tools.structured_tool import CrewStructuredTool
    from pydantic import PrivateAttr

    class Structured(CrewStructuredTool):  # type: ignore[misc]
        """The tool as an agent runs it, whose prompt shows the model's key as optional."""

        @property
        def formatted_description(self) -> str:
            return _key_optional(super().formatted_description)

    class IdempotentTool(BaseTool):  # type: ignore[misc]
        """A tool gated by an engine: one execution per action (see the module)."""

        _calls: Any = PrivateAttr(default=None)

        @property
        def formatted_description(self) -> str:
            made = super().formatted_description
            return _key_optional(made) if self._calls.injected else made

        def to_structured_tool(self) -> Any:
            made = super().to_structured_tool()
            if not self._calls.injected:
                return made  # the tool's own idempotency_key: its own schema says what it is
            # CrewAI's text (ReAct) prompt renders every argument as required and drops null
            # from its types, so a model reads the added key as a required string and sends a
            # value in every call (each a new action): the same tool, rendered with the key
            # optional and nullable. (Native function calling sends the schema itself: there
            # the key is nullable, which strict mode reads as optional.)
            told = Structured(**{f: getattr(made, f) for f in type(made).model_fields})
            told._original_tool = self
            return told

        def _run(self, *args: Any, **kwargs: Any) -> Any:
            g: _Calls = self._calls
            action, payload, kw = g.prepare(_keywords(g.inner, args, kwargs))
            return g.run(action, payload, lambda: g.inner.run(**kw))

        async def _arun(self, *args: Any, **kwargs: Any) -> Any:
            g: _Calls = self._calls
            action, payload, kw = g.prepare(_keywords(g.inner, args, kwargs))
            return await g.arun(action, payload, lambda: g.inner.arun(**kw))

        def format_output_for_agent(self, raw_result: Any) -> str:
            # The replay notice is text already; a result is shown as the wrapped tool shows it.
            if isinstance(raw_result, str):
                return raw_result
            return str(self._calls.inner.format_output_for_agent(raw_result))

    return IdempotentTool


def _key_optional(block: str) -> str:
    """CrewAI's prompt block of a tool (the lines ``Tool Name: ...``, ``Tool Arguments: <JSON
    schema>``, ``Tool Description: ...``) with the ``idempotency_key`` argument optional and
    nullable (its description kept); the block as it is when it has another shape."""
    head, sep, rest = block.partition("Tool Arguments: ")
    args, sep2, tail = rest.partition("\nTool Description: ")
    try:
        schema = json.loads(args) if sep and sep2 else None
    except ValueError:
        schema = None
    prop = schema.get("properties", {}).get(KEY_ARGUMENT) if isinstance(schema, dict) else None
    if not isinstance(schema, dict) or not isinstance(prop, dict):
        return block
    prop.pop("type", None)
    prop["anyOf"] = [{"type": "string"}, {"type": "null"}]
    schema["required"] = [r for r in schema.get("required", []) if r != KEY_ARGUMENT]
    return f"{head}{sep}{json.dumps(schema, indent=2)}{sep2}{tail}"


def _keywords(inner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by name (a positional call names them in the schema's order)."""
    if not args:
        return dict(kwargs)
    names = list(getattr(inner.args_schema, "model_fields", None) or {})
    return {**dict(zip(names, args)), **kwargs}


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
    """A CrewAI tool running ``base_tool`` (any ``crewai.tools.BaseTool``) through ``engine``:
    one action per identical call within its scope and the window (see the module
    documentation). ``tool`` is the record's tool name (default: the tool's name);
    ``key(args, ctx)`` names the action by its business identity (not scoped; ``None``: the
    window); ``scope(args, ctx)`` replaces the default scope (:func:`crew_scope`); ``ctx`` is the
    call's :class:`CrewContext`; ``model_key=False`` leaves the ``idempotency_key`` argument out
    of the schema; the keyword arguments of :class:`~idemgate.engine.PolicyOptions` override the
    engine's policy (``fallback_window`` is the re-emission window)."""
    g = _Calls(
        engine,
        base_tool,
        tool or base_tool.name,
        schema_fields(base_tool.args_schema),
        key=key,
        scope=scope,
        model_key=model_key,
        shield=shield,
        policy=policy,
    )
    wrapped = _tool_class()(
        name=base_tool.name,
        description=base_tool.description,
        args_schema=g.schema(base_tool.args_schema),
        env_vars=base_tool.env_vars,
        result_as_answer=base_tool.result_as_answer,
        tool_failure_policy=base_tool.tool_failure_policy,
        cache_function=_never_cache,
    )
    wrapped._calls = g
    return wrapped


def idempotent_tool(
    engine: Engine,
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    tool: str | None = None,
    key: Namer | None = None,
    scope: Namer | None = None,
    model_key: bool = True,
    shield: bool = True,
    **kwargs: Any,
) -> Any:
    """``crewai.tools.tool(func)`` (named ``name``, default the function's) gated by ``engine``
    (:func:`idempotent`): the keyword arguments of :class:`~idemgate.engine.PolicyOptions` go to
    the gate, the others to ``tool`` (``result_as_answer``, ``max_usage_count``...). Use bare or
    with arguments."""
    policy, tool_kwargs = split_policy(kwargs)

    def build(fn: Callable[..., Any]) -> Any:
        from crewai.tools import tool as make_tool

        made = make_tool(name, **tool_kwargs)(fn) if name else make_tool(**tool_kwargs)(fn)
        return idempotent(
            engine, made, tool=tool, key=key, scope=scope, model_key=model_key, shield=shield, **policy
        )

    return build(func) if func is not None else build
