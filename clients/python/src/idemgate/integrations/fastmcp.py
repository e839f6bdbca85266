"""A FastMCP server middleware (``fastmcp``; tested with 4.2.3): the server author gates the
server's own write tools in-process, no proxy needed::

    from fastmcp import FastMCP
    from idemgate import Engine, Policy
    from idemgate.integrations.fastmcp import IdempotencyMiddleware

    mcp = FastMCP("billing")
    mcp.add_middleware(IdempotencyMiddleware(Engine.open("postgres://…"),
                                             tools={"charge": Policy(wait=10),
                                                    "balance": Policy(kind="read")}))

    @mcp.tool
    async def charge(order: int, amount: str) -> dict: ...

Every tool is a write unless its policy (in ``tools``, else the engine's) says ``read`` or
``natural_idempotent``, as ``idemgate mcp`` treats unknown tools: a write tool forgotten in
``tools`` is still gated. What names a call's action, as at the proxy:

- a key: ``params._meta["dev.idemgate/idempotency-key"]`` (where a client puts the key of its
  tool call; the integrations' ``process_tool_call`` and ``tool_meta_resolver`` put the call id
  within its conversation there) or the ``idempotency_key``/``idempotencyKey`` argument, the
  model's (taken out of the arguments unless the tool declares it). A key names the action in
  every session; a new key is a new action, which is how the model repeats one on purpose.
- the re-emission window, within the **scope**: ``params._meta["dev.idemgate/conversation"]``
  when the client names its conversation, else the MCP session (on connections of MCP
  2026-07-28, which have no session, each request is its own scope: send the conversation).
  A call with a ``_meta`` key whose arguments equal an earlier call's of the same tool in the
  scope within the window (``fallback_window``, default 60 s, 0 turns it off) is the same
  action; the model reads that it was taken for a repeat and how to repeat on purpose. A call
  with no key at all gets the window only when the tool's policy sets a ``fallback_window``
  (the proxy's ``on_missing_key = "window"``); else it is refused (the proxy's default), with
  what the model can send.

``key=lambda args, context: ...`` names the action by its business identity instead,
``scope=lambda args, context: ...`` chooses the scope (``context`` is FastMCP's
``MiddlewareContext``). The first call runs the tool and stores its result (content, structured
content, meta); a replay gets the stored result, with ``_meta`` ``dev.idemgate/replayed: true``,
``dev.idemgate/executed_at`` and ``dev.idemgate/rule``, and one more text block saying the action
was already performed and was not repeated, as the proxy marks replays. ``async`` tools are
shielded by default: a client that times out (and cancels) does not tear the call in half; it
finishes and stores its outcome, and the client's retry waits for it (the policy's ``wait``). A
tool raising ``NotApplied`` (nothing happened) frees the key, ``Failed(result)`` is stored and
replayed as an error, any other exception leaves the record unknown. Refusals (in flight,
unknown, key required or reused...) are error results whose text starts with ``idemgate:``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, cast

from ..engine import _POLICY_FIELDS, Engine, Policy, Result
from ..errors import Failed, IdemgateError, KeyRequired, KeyReused, MaybeApplied, NotApplied
from ._tool_calls import (
    CONVERSATION_META,
    KEY_ARGUMENT,
    KEY_META,
    Action,
    Namer,
    call_async,
    jsonable,
    repeat_notice,
)

__all__ = ["CONVERSATION_META", "KEY_META", "IdempotencyMiddleware"]

_IDEMGATE_EXCEPTIONS = (NotApplied, Failed, MaybeApplied)

#: The arguments a model may pass its key in, as ``idemgate mcp`` reads them.
KEY_ARGUMENTS = (KEY_ARGUMENT, "idempotencyKey")


def _middleware_base() -> type:
    from fastmcp.server.middleware import Middleware

    return Middleware


def _cause(e: BaseException) -> BaseException | None:
    """The ``NotApplied``/``Failed``/``MaybeApplied`` a tool raised, under FastMCP's wrapping."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, _IDEMGATE_EXCEPTIONS):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _request_meta(context: Any) -> Mapping[str, Any]:
    """The request's ``params._meta``: on the message, or (as FastMCP 4 delivers it) on the
    request context."""
    meta = getattr(context.message, "meta", None)
    if meta:
        return cast(Mapping[str, Any], meta)
    try:
        meta = context.fastmcp_context.request_context.meta
    except (AttributeError, LookupError, RuntimeError):
        meta = None
    if meta is None:
        return {}
    return meta if isinstance(meta, Mapping) else getattr(meta, "model_extra", None) or {}


def session_scope(meta: Mapping[str, Any], context: Any) -> str | None:
    """The default scope of a call: the conversation the client names in ``_meta``, else the
    MCP session (``None`` when there is neither: no window then)."""
    conversation = meta.get(CONVERSATION_META)
    if isinstance(conversation, str) and conversation:
        return f"conversation:{conversation}"
    try:
        return f"session:{context.fastmcp_context.session_id}"
    except (AttributeError, RuntimeError):
        return None


def _iso(at: datetime) -> str:
    return at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _refusal_text(name: str, e: IdemgateError) -> str:
    """What the model reads when a call is refused: what happened and what it can do."""
    if isinstance(e, KeyRequired):
        return (
            f"idemgate: the tool {name} changes state, so this call needs an idempotency key, and "
            f"none was sent; nothing was done. To the model: call {name} again with the argument "
            f'"{KEY_ARGUMENT}" set to a value that names this one action (the same value on every '
            "retry of it, a new value for a new action). To the developer: put a stable key (for "
            f'example the tool call id) in params._meta["{KEY_META}"], or give the tool a '
            "fallback_window."
        )
    if isinstance(e, KeyReused):
        return (
            f"idemgate: this idempotency key was already used for {name} with other arguments, so "
            "nothing was done. Use a new key for a new action, and the same arguments when "
            f"retrying an action. ({e})"
        )
    return f"idemgate: {e}"


def IdempotencyMiddleware(  # noqa: N802 - a class factory: fastmcp is imported only when used
    engine: Engine,
    tools: Iterable[str] | Mapping[str, Policy | Mapping[str, Any] | None] | None = None,
    *,
    key: Namer | None = None,
    scope: Namer | None = None,
    shield: bool = True,
) -> Any:
    """The middleware (a ``fastmcp.server.middleware.Middleware``) gating the server's write
    tools. ``tools``: tool names, or a mapping of tool names to their :class:`~idemgate.Policy`
    (or policy fields; ``None``: the engine's policy for the tool); a tool not listed gets the
    engine's policy, a write unless the engine says otherwise. ``key(args, context)`` names a
    call's action by its business identity; ``scope(args, context)`` replaces the default scope
    (:func:`session_scope`)."""
    from fastmcp.exceptions import ToolError
    from fastmcp.tools.base import ToolResult

    if isinstance(tools, Mapping):
        policies = {name: p for name, p in tools.items()}
    else:
        policies = {name: None for name in tools or ()}
    overrides: dict[str, dict[str, Any]] = {}
    for name, p in policies.items():
        fields = (
            {k: getattr(p, k) for k in _POLICY_FIELDS} if isinstance(p, Policy) else dict(p or {})
        )
        overrides[name] = {k: v for k, v in fields.items() if v is not None}
        engine.policy(name, **overrides[name])  # refuse bad settings now

    async def declared(context: Any, name: str) -> set[str]:
        """The key arguments the tool's input schema declares (they are passed on to it)."""
        try:
            tool = await context.fastmcp_context.fastmcp.get_tool(name)
            return set(KEY_ARGUMENTS) & set((tool.parameters or {}).get("properties") or {})
        except Exception:  # noqa: BLE001 - no such tool: FastMCP answers it
            return set()

    def replayed(r: Result, rule: str, notice: str) -> Any:
        stored = dict(r.value or {})
        stored_meta = dict(stored.get("meta") or {})
        stored_meta["dev.idemgate/replayed"] = True
        if r.executed_at is not None:
            stored_meta["dev.idemgate/executed_at"] = _iso(r.executed_at)
        stored_meta["dev.idemgate/rule"] = rule
        stored["meta"] = stored_meta
        # Told in words, as the proxy does: the model reads the content, not `_meta`.
        stored["content"] = [*(stored.get("content") or []), {"type": "text", "text": notice}]
        return ToolResult.model_validate(stored)

    class _IdempotencyMiddleware(_middleware_base()):  # type: ignore[misc]
        async def on_call_tool(self, context: Any, call_next: Any) -> Any:
            params = context.message
            name = params.name
            given = overrides.get(name, {})
            if engine.policy(name, **given).kind != "write":
                return await call_next(context)
            arguments = dict(params.arguments or {})
            model_key = next((arguments[a] for a in KEY_ARGUMENTS if arguments.get(a)), None)
            if any(a in arguments for a in KEY_ARGUMENTS):
                keep = await declared(context, name)
                passed = {k: v for k, v in arguments.items() if k not in KEY_ARGUMENTS or k in keep}
                if passed != arguments:
                    context = context.copy(message=params.model_copy(update={"arguments": passed}))
            payload = jsonable({k: v for k, v in arguments.items() if k not in KEY_ARGUMENTS})
            meta = _request_meta(context)
            where = scope(payload, context) if scope is not None else session_scope(meta, context)
            business = key(payload, context) if key is not None else None
            if business is not None or model_key is not None:
                # The action named by the program or the model: no window (a new key is a new
                # action, which is how the model repeats one on purpose).
                action = Action(str(business if business is not None else model_key), None, False)
            elif meta.get(KEY_META) is not None:
                # A key from `_meta` names the action in every session, as at the proxy; the
                # window joins an identical call of the scope under another key (a client's new
                # tool-call id for a re-emitted call).
                action = Action(meta.get(KEY_META), where, where is not None)
            else:
                # No key at all: the window only when the tool's policy sets one, as the proxy's
                # on_missing_key = "refuse" by default (the scope may be one request: sessions
                # are gone from MCP 2026-07-28); else refused, telling the model what to send.
                windowed = engine.policy(name, **given).fallback_window is not None
                action = Action(None, where, windowed and where is not None)
            first: list[Any] = []

            async def run() -> Any:
                try:
                    result = await call_next(context)
                except Exception as e:
                    inner = _cause(e)
                    if inner is not None and inner is not e:
                        raise inner from e
                    raise
                first.append(result)
                return result.model_dump(mode="json", exclude_none=True)

            try:
                out = await call_async(engine, name, action, payload, run, given, shield)
            except Failed as e:
                raise ToolError(f"{name} failed: {jsonable(e.result)}") from e
            except (NotApplied, MaybeApplied) as e:  # what the tool said: an error result
                raise ToolError(f"{name}: {e}") from e
            except IdemgateError as e:  # a refusal
                raise ToolError(_refusal_text(name, e)) from e
            r = out.result
            if out.repeat_of is not None:
                return replayed(
                    out.repeat_of, "fallback", repeat_notice(name, out.repeat_of, result_above=True)
                )
            if first and r.executed:
                return first[0]
            when = _iso(r.executed_at) if r.executed_at is not None else "an earlier time"
            return replayed(
                r,
                r.rule or "explicit",
                f"idemgate: this action was already performed at {when} and was not repeated; "
                "the result above is the one it returned then.",
            )

    return _IdempotencyMiddleware()
