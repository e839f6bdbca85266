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
``tools`` is still gated. What names a call's action is the one rule every door shares
(:func:`~idemgate.integrations._tool_calls.name_action`, ``idemgate_kit::identity``); this
middleware only hands it the call's facts:

- the **orchestration key**: ``params._meta["dev.idemgate/idempotency-key"]`` (or
  ``params.idempotencyKey``, SEP-3182), where a program puts the key of its tool call. It names
  the action in every session; a new key is a new action.
- the **call id**: ``params._meta["dev.idemgate/tool-call-id"]``, where the packages' MCP
  integrations put the framework's tool-call id: it names the action within the call's scope
  (some models send the same ids in every conversation), and an identical call re-emitted in
  the scope within the window (the policy's ``fallback_window``, else 60 s) under a new id is
  the same action.
- the **business key**: ``key=lambda args, context: ...``, the server's own name for the action
  (the same in every session). When it names one, the client's key is not used: the server
  knows best what its tool's action is.
- the **model key**: the ``idempotency_key``/``idempotencyKey`` argument (taken out of the
  arguments unless the tool declares it; ``tools/list`` shows it, optional and nullable, on every
  write tool). It is the model's: it names an action only within the call's scope, so a model's
  "1" in one session is not another's. It is how the model repeats an action on purpose.
- the **scope**: ``params._meta["dev.idemgate/conversation"]`` when the client names its
  conversation, else the MCP session (handshake-era connections), else the request itself (MCP
  2026-07-28 has no sessions: FastMCP gives every request a new session id), so nothing joins
  two clients. ``scope=lambda args, context: ...`` chooses it instead.

A call with no key at all gets the re-emission window of its scope only when the tool's policy
sets a ``fallback_window`` (the proxy's ``on_missing_key = "window"``): an identical call of the
tool in the scope within the window is taken for the model re-emitting it. Else it is refused (the
proxy's default), telling the model what to send.

The first call runs the tool and stores its result (content blocks, structured content, meta,
as the MCP result's wire form). A replay gets the stored result with its original content blocks,
``_meta`` ``dev.idemgate/replayed: true``, ``dev.idemgate/executed_at`` and ``dev.idemgate/rule``,
and a notice, in words, naming the tool as the model calls it: a text block, and, for a tool with
structured output whose output schema admits more properties, the same words in the structured
content under ``idemgate_notice`` (clients such as Pydantic AI's show a model only the structured
content). When the output schema admits no more properties, a replay the model may have meant as a
new action (the window's, or under the model's own key) is answered as an error result carrying
the notice and the stored result in text, since a structured-only client would otherwise hide it.

``async`` tools are shielded by default: a client that times out (and cancels) does not tear the
call in half; it finishes and stores its outcome, and the client's retry waits for it (the
policy's ``wait``). A tool raising ``NotApplied`` (nothing happened) frees the key, as does a call
FastMCP rejects before the tool runs (invalid arguments, unknown tool); ``Failed(result)`` is
stored and replayed as an error; any other exception leaves the record unknown, and the model is
told that it cannot resolve that itself and which record a person resolves. Refusals (in flight,
unknown, key required or reused...) are error results whose text starts with ``idemgate:``; so
is a retry past the tool's ``ttl`` within its ``tombstone`` (``OutcomeExpired``), which tells
the model that the action already ran (when), was not performed again, that its result is no
longer kept, and how to do it again on purpose (a new ``idempotency_key``), as ``idemgate mcp``
answers it.
"""

from __future__ import annotations

import copy
import json
import secrets
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from ..engine import _POLICY_FIELDS, Engine, Policy, Result
from ..errors import (
    Failed,
    IdemgateError,
    KeyRequired,
    KeyReused,
    MaybeApplied,
    NotApplied,
    OutcomeExpired,
    OutcomeUnknown,
)
from ._tool_calls import (
    CALL_ID_META,
    CONVERSATION_META,
    KEY_ARGUMENT,
    KEY_DESCRIPTION,
    KEY_META,
    Action,
    Namer,
    call_async,
    earlier_call,
    expired_notice,
    jsonable,
    name_action,
)

__all__ = ["CALL_ID_META", "CONVERSATION_META", "KEY_META", "NOTICE_FIELD", "IdempotencyMiddleware"]

_IDEMGATE_EXCEPTIONS = (NotApplied, Failed, MaybeApplied)

#: The arguments a model may pass its key in, as ``idemgate mcp`` reads them.
KEY_ARGUMENTS = (KEY_ARGUMENT, "idempotencyKey")

#: Where a replay's notice goes in its structured content, when the output schema admits it.
NOTICE_FIELD = "idemgate_notice"


def _sessionless() -> tuple[str, ...]:
    """The MCP protocol versions without sessions (FastMCP gives each request its own id)."""
    try:
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS
    except ImportError:  # pragma: no cover - another mcp release
        return ("2026-07-28",)
    return tuple(MODERN_PROTOCOL_VERSIONS)


#: The ``tools/list`` schema of the model's key: optional, nullable, described.
KEY_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "string"}, {"type": "null"}],
    "default": None,
    "description": KEY_DESCRIPTION,
}


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


def _request_context(context: Any) -> Any:
    try:
        return context.fastmcp_context.request_context
    except (AttributeError, LookupError, RuntimeError):
        return None


def _raw_params(context: Any) -> Mapping[str, Any]:
    """The ``tools/call`` params as the client sent them (FastMCP's documented escape hatch to
    the SDK's request context): where ``idempotencyKey`` and the name the client called are."""
    rc = _request_context(context)
    raw = getattr(rc, "_srctx", None)
    if getattr(raw, "method", None) != "tools/call":
        return {}
    params = getattr(raw, "params", None)
    return params if isinstance(params, Mapping) else {}


def _request_meta(context: Any) -> dict[str, Any]:
    """The request's ``params._meta``: as FastMCP 4 delivers it on the request context, and
    whatever the message itself carries."""
    out: dict[str, Any] = {}
    rc = _request_context(context)
    for meta in (getattr(rc, "meta", None), getattr(context.message, "meta", None)):
        if meta is None:
            continue
        if not isinstance(meta, Mapping):
            meta = getattr(meta, "model_extra", None) or {}
        out.update(meta)
    return out


def called_name(context: Any, name: str) -> str:
    """The tool's name as the client (and so the model) calls it: a server mounted under a
    namespace sees ``charge`` for the ``billing_charge`` the model called."""
    raw = _raw_params(context).get("name")
    if isinstance(raw, str) and (raw == name or raw.endswith(f"_{name}")):
        return raw
    return name


def session_scope(meta: Mapping[str, Any], context: Any) -> str:
    """The default scope of a call: the conversation the client names in ``_meta``, else the MCP
    session of a handshake-era connection, else the request itself (a 2026-07-28 connection has
    no session: each request is its own, and the window never joins two clients)."""
    conversation = meta.get(CONVERSATION_META)
    if isinstance(conversation, str) and conversation:
        return f"conversation:{conversation}"
    rc = _request_context(context)
    if rc is not None and getattr(rc, "protocol_version", None) not in _sessionless():
        try:
            return f"session:{context.fastmcp_context.session_id}"
        except (AttributeError, RuntimeError):
            pass
    return f"request:{secrets.token_hex(16)}"


def _iso(at: datetime | None) -> str:
    if at is None:
        return "an earlier time"
    return at.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def admits_notice(output_schema: Any) -> bool:
    """Whether structured content valid for ``output_schema`` stays valid with
    :data:`NOTICE_FIELD` added (clients validate it against the schema they listed): no schema,
    or an object schema that allows any more properties."""
    if output_schema is None:
        return True
    if not isinstance(output_schema, Mapping) or output_schema.get("type") != "object":
        return False
    if any(
        k in output_schema
        for k in ("$ref", "allOf", "anyOf", "oneOf", "not", "if", "propertyNames",
                  "patternProperties", "maxProperties", "dependentSchemas")
    ):
        return False
    if NOTICE_FIELD in (output_schema.get("properties") or {}):
        return False
    return all(output_schema.get(k, True) is True for k in ("additionalProperties", "unevaluatedProperties"))


def with_key_argument(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """A tool's input schema with the model's optional, nullable ``idempotency_key`` declared
    (so ``additionalProperties: false`` does not forbid it), unless it declares a key itself."""
    schema = copy.deepcopy(dict(parameters or {}))
    properties = schema.setdefault("properties", {})
    if not any(k in properties for k in KEY_ARGUMENTS):
        properties[KEY_ARGUMENT] = copy.deepcopy(KEY_SCHEMA)
    schema.setdefault("type", "object")
    return schema


def _stored(result: Any) -> dict[str, Any]:
    """A ``ToolResult`` as the MCP ``CallToolResult`` wire form it is stored in."""
    out: dict[str, Any] = {
        "content": [
            b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content
        ]
    }
    if result.structured_content is not None:
        out["structuredContent"] = result.structured_content
    if result.meta:
        out["_meta"] = result.meta
    if result.is_error:
        out["isError"] = True
    return out


def _parts(value: Any) -> tuple[list[Any], Any, dict[str, Any], bool]:
    """A stored outcome as (content blocks, structured content, meta, is_error): the wire form,
    this middleware's earlier form (snake case), or any other door's JSON (an operator's
    ``keys resolve --result``, a gateway's record), shown as JSON text and structured content."""
    from mcp_types import ContentBlock, TextContent
    from pydantic import TypeAdapter, ValidationError

    if not (isinstance(value, Mapping) and isinstance(value.get("content"), list)):
        text = TextContent(type="text", text=json.dumps(value))
        return [text], value if isinstance(value, dict) else None, {}, False
    adapter: TypeAdapter[Any] = TypeAdapter(ContentBlock)
    blocks: list[Any] = []
    for block in value["content"]:
        try:
            blocks.append(adapter.validate_python(block))
        except ValidationError:  # a block this SDK does not know: shown, not lost
            blocks.append(TextContent(type="text", text=json.dumps(block)))
    structured = value.get("structuredContent", value.get("structured_content"))
    meta = value.get("_meta", value.get("meta")) or {}
    is_error = bool(value.get("isError", value.get("is_error", False)))
    return blocks, structured, dict(meta), is_error


def _notice(
    called: str, action: Action, at: datetime | None, shown: str, identity: Sequence[str] = ()
) -> str:
    """What the model reads on a replay: what ran when, that it was not run again, where its
    result is (``shown``), and how to do it again on purpose, if it can. ``identity``: the
    tool's identity fields, when the window compared only them."""
    when = _iso(at)
    again = (
        f"To do it again on purpose, call {called} again with the argument {KEY_ARGUMENT} set "
        "to a new value that names the new action."
    )
    if action.rule in ("window", "call_id"):
        head = (
            f"{earlier_call(called, identity)} ran at {when} in this "
            "conversation, so this one was taken for a repeat of that action and was not run again"
        )
    elif action.rule == "model_key":
        head = (
            f"this action of {called} was already performed at {when} under the same "
            f"{KEY_ARGUMENT}, and was not repeated"
        )
    elif action.rule == "business_key":
        head = f"this action of {called} was already performed at {when} and was not repeated"
        again = (
            "The server names this action by its own key, so it is not done twice: ask the user "
            "if it must be done again."
        )
    else:
        head = f"this action of {called} was already performed at {when} and was not repeated"
    return f"idemgate: {head}; {shown}. {again}"


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
    from fastmcp.exceptions import FastMCPError, NotFoundError, ToolError, ValidationError
    from fastmcp.tools.base import ToolResult
    from mcp_types import TextContent

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

    def is_write(name: str) -> bool:
        return engine.policy(name, **overrides.get(name, {})).kind == "write"

    async def tool_of(context: Any, name: str) -> Any:
        try:
            return await context.fastmcp_context.fastmcp.get_tool(name)
        except Exception:  # noqa: BLE001 - no such tool: FastMCP answers it
            return None

    def refused(called: str, e: IdemgateError, rule: str) -> str:
        """What the model reads when a call is refused: what happened and what it can do
        (``rule``: what named the call's action)."""
        if isinstance(e, KeyRequired):
            return (
                f"idemgate: the tool {called} changes state, so this call needs an idempotency "
                f"key, and none was sent; nothing was done. To the model: call {called} again "
                f'with the argument "{KEY_ARGUMENT}" set to a value that names this one action '
                "(the same value on every retry of it, a new value for a new action). To the "
                f'developer: put a stable key (for example the tool call id) in params._meta["'
                f'{KEY_META}"], or give the tool a fallback_window.'
            )
        if isinstance(e, KeyReused):
            # The exception's own message says the same for a person: appended, the model read
            # every sentence twice. Only the fact it adds, when the key was first used, is kept.
            first_seen = e.problem.get("first_seen")
            return (
                f"idemgate: this idempotency key was already used for {called} with other arguments"
                + (f" (first at {first_seen})" if first_seen else "")
                + ", so nothing was done. Use a new key for a new action, and the same arguments "
                "when retrying an action."
            )
        if isinstance(e, OutcomeUnknown):
            return unknown(called, e.problem.get("key"), e.fence, e.since, e.problem.get("message"), False)
        if isinstance(e, OutcomeExpired):
            # The action ran before and its result is no longer kept: nothing ran now.
            return expired_notice(called, e, rule)
        return f"idemgate: {e}"

    def unknown(
        called: str,
        key: str | None,
        fence: int | None,
        since: str | None,
        why: str | None,
        ran_here: bool,
        tool: str | None = None,
    ) -> str:
        """The outcome-unknown answer for a model: it can do nothing about it itself (calling
        again under a new key could do the action twice); a person resolves the record, which it
        names, with the command that does it."""
        tool = tool or called
        record = (
            f"the record of tool {tool!r} under key {key!r} (tenant {engine.tenant!r}"
            + (f", fence {fence})" if fence is not None else ")")
            if key
            else f"the unknown record of tool {tool!r} (`idemgate keys list --state unknown`)"
        )
        command = (
            f"`idemgate keys resolve {key} --tool {tool} --tenant {engine.tenant}"
            + (f" --fence {fence}" if fence is not None else "")
            + " --completed --result JSON` (it did) or `--release` (it did not; the next call "
            "runs it again), with `--store` naming this server's store, or `engine.resolve(...)` "
            "in the server's program"
            if key
            else "`idemgate keys resolve`"
        )
        how = why or (
            "the tool failed without saying whether it took effect"
            if ran_here
            else "no outcome was ever recorded for an earlier attempt (it stopped first, or could not tell "
            "whether it took effect)"
        )
        done = (
            f"It was sent to {called} once, and calls with the same key will not send it again."
            if ran_here
            else "It was NOT repeated, so that it cannot happen twice."
        )
        return (
            f"idemgate: the outcome of this action of {called} is unknown"
            + (f" (since {since})" if since else "")
            + f": {how}. {done} You cannot resolve this yourself, and calling again under a new "
            "key could do it twice: tell the user that a person must check whether it took "
            f"effect and record what happened for {record} with {command}."
        )

    def record_of(name: str, action: Action, payload: Any, given: dict[str, Any]) -> tuple[str | None, int | None]:
        """The key and fence of a call's record (for the person who resolves it)."""
        try:
            key = action.key
            if key is None:
                named = engine.key_for(name, None, payload, scope=action.scope, **given)
                key = named["key"] if named else None
            rec = engine.record(name, key) if key else None
            fence = rec.get("fence") if rec else None
            return key, int(fence) if fence is not None else None
        except Exception:  # noqa: BLE001 - the answer names what it can
            return action.key, None

    def replayed(
        r: Result,
        called: str,
        action: Action,
        window: bool,
        output_schema: Any,
        identity: Sequence[str] = (),
    ) -> Any:
        """The stored result as the replay's answer: its original blocks, ``_meta`` marks and
        the notice in every channel the client shows the model (see the module's docs)."""
        blocks, structured, meta, is_error = _parts(r.value)
        meta["dev.idemgate/replayed"] = True
        if r.executed_at is not None:
            meta["dev.idemgate/executed_at"] = _iso(r.executed_at)
        meta["dev.idemgate/rule"] = "fallback" if window else (r.rule or "explicit")
        text = _notice(
            called, action, r.executed_at, "the result above is the one it returned then", identity
        )
        if isinstance(structured, dict) and (is_error or admits_notice(output_schema)):
            structured = {
                **structured,
                NOTICE_FIELD: _notice(
                    called, action, r.executed_at,
                    "the other fields of this result are the ones it returned then", identity,
                ),
            }
        elif structured is not None and (window or action.rule in ("model_key", "call_id")):
            # A structured-only client would show the model the stored result alone, and its
            # schema admits no notice: a replay named by what the model sent (the window, its
            # own key, its call id), which it may have meant as a new action, is answered as an
            # error that carries the notice and the result in text (as `idemgate mcp` does).
            first = _notice(
                called, action, r.executed_at,
                "the result it returned then is given after this notice", identity,
            )
            return ToolResult(
                content=[TextContent(type="text", text=first), *blocks], meta=meta, is_error=True
            )
        return ToolResult(
            content=[*blocks, TextContent(type="text", text=text)],
            structured_content=structured,
            meta=meta,
            is_error=is_error,
        )

    class _IdempotencyMiddleware(_middleware_base()):  # type: ignore[misc]
        async def on_list_tools(self, context: Any, call_next: Any) -> Any:
            listed = await call_next(context)
            return [
                t.model_copy(update={"parameters": with_key_argument(t.parameters)})
                if is_write(t.name)
                else t
                for t in listed
            ]

        async def on_call_tool(self, context: Any, call_next: Any) -> Any:
            params = context.message
            name = params.name
            given = overrides.get(name, {})
            if not is_write(name):
                return await call_next(context)
            called = called_name(context, name)
            tool = await tool_of(context, name)
            declared = set(KEY_ARGUMENTS) & set(
                ((getattr(tool, "parameters", None) or {}).get("properties") or {})
            )
            arguments = dict(params.arguments or {})
            model_keys = {arguments[a] for a in KEY_ARGUMENTS if arguments.get(a) is not None}
            if any(not isinstance(k, str) for k in model_keys) or len(model_keys) > 1:
                raise ToolError(
                    f"idemgate: the {KEY_ARGUMENT} of this call must be one string; nothing was "
                    "done."
                )
            if any(a in arguments for a in KEY_ARGUMENTS):
                passed = {
                    k: v for k, v in arguments.items() if k not in KEY_ARGUMENTS or k in declared
                }
                if passed != arguments:
                    context = context.copy(message=params.model_copy(update={"arguments": passed}))
            payload = jsonable({k: v for k, v in arguments.items() if k not in KEY_ARGUMENTS})
            meta = _request_meta(context)
            keys = {
                k for k in (meta.get(KEY_META), _raw_params(context).get("idempotencyKey"))
                if k is not None
            }
            if any(not isinstance(k, str) for k in keys) or len(keys) > 1:
                raise ToolError(
                    f'idemgate: the idempotency key (params._meta["{KEY_META}"], '
                    "params.idempotencyKey) must be one string; nothing was done."
                )
            business = key(payload, context) if key is not None else None
            # The framework's tool-call id, where the packages' MCP integrations send it (as
            # `idemgate mcp` reads it): the action within the conversation, with the window.
            call_id = meta.get(CALL_ID_META)
            if call_id is not None and (not isinstance(call_id, str) or not call_id):
                raise ToolError(
                    f'idemgate: params._meta["{CALL_ID_META}"] must be a non-empty string; '
                    "nothing was done."
                )
            try:
                action = name_action(
                    call_id=call_id,
                    scope=scope(payload, context) if scope is not None else session_scope(meta, context),
                    business_key=business,
                    # The server's own key names the action; the client's is then not used.
                    orchestration_key=None if business is not None else next(iter(keys), None),
                    model_key=next(iter(model_keys), None),
                )
            except ValueError as e:  # an invalid key: nothing was done
                raise ToolError(f"idemgate: {e}; nothing was done.") from e
            if action.key is None and engine.policy(name, **given).fallback_window is None:
                # No key and no window for the tool (the proxy's on_missing_key = "refuse"):
                # the engine refuses it, telling the model what to send.
                action = replace(action, window=False)
            first: list[Any] = []
            rejected: list[Exception] = []

            async def run() -> Any:
                try:
                    result = await call_next(context)
                except (ValidationError, NotFoundError) as e:
                    # FastMCP rejected the call before the tool ran (invalid arguments, unknown
                    # tool): nothing happened, so the key is free again.
                    rejected.append(e)
                    raise NotApplied(str(e)) from e
                except Exception as e:
                    inner = _cause(e)
                    if inner is not None and inner is not e:
                        raise inner from e
                    raise
                first.append(result)
                return _stored(result)

            try:
                out = await call_async(engine, name, action, payload, run, given, shield)
            except Failed as e:
                again = (
                    f"idemgate: this action of {called} was already performed earlier and failed; "
                    "it was not repeated. " if e.replayed else ""
                )
                raise ToolError(f"{again}{called} failed: {json.dumps(jsonable(e.result))}") from e
            except NotApplied as e:  # what the tool (or FastMCP) said: nothing happened
                if rejected:
                    raise rejected[0] from None
                raise ToolError(f"{called}: {e}") from e
            except MaybeApplied as e:  # the tool ran and cannot say whether it took effect
                k, fence = record_of(name, action, payload, given)
                raise ToolError(unknown(called, k, fence, None, f"{e}", True, name)) from e
            except IdemgateError as e:  # a refusal (an expired action's too: nothing ran)
                raise ToolError(refused(called, e, action.rule)) from e
            except Exception as e:  # the tool failed: its record is unknown now
                k, fence = record_of(name, action, payload, given)
                said = str(e) if isinstance(e, FastMCPError) else f"Error calling tool {called!r}"
                raise ToolError(unknown(called, k, fence, None, said, True, name)) from e
            r = out.result
            if out.repeat_of is not None:
                return replayed(
                    out.repeat_of, called, action, True, getattr(tool, "output_schema", None),
                    out.identity,
                )
            if first and r.executed:
                return first[0]
            return replayed(r, called, action, False, getattr(tool, "output_schema", None))

    return _IdempotencyMiddleware()

