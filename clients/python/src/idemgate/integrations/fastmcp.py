"""A FastMCP server middleware (``fastmcp``; tested with 4.2.3): the server author gates the
server's own write tools in-process, no proxy needed::

    from fastmcp import FastMCP
    from idemgate import Engine, Policy
    from idemgate.integrations.fastmcp import IdempotencyMiddleware

    mcp = FastMCP("billing")
    mcp.add_middleware(IdempotencyMiddleware(Engine.open("postgres://…"),
                                             tools={"charge": Policy(wait=10)}))

    @mcp.tool
    async def charge(order: int, amount: str) -> dict: ...

A call of a gated tool is keyed by ``params._meta["dev.idemgate/idempotency-key"]`` (where a
client puts the tool-call id; the same name ``idemgate mcp`` reads), its arguments fingerprinted.
The first call runs the tool and stores its result (content, structured content, meta); a retry
with the same key gets the stored result, with ``_meta`` ``dev.idemgate/replayed: true``,
``dev.idemgate/executed_at`` and ``dev.idemgate/rule``, as the proxy marks replays. ``async``
tools are shielded by default: a client that times out (and cancels) does not tear the call in
half; it finishes and stores its outcome, and the client's retry waits for it (the policy's
``wait``). A tool raising ``NotApplied`` (nothing happened) frees the key, ``Failed(result)`` is
stored and replayed as an error, any other exception leaves the record unknown. Refusals
(in flight, unknown, key required or reused...) are error results whose text starts with
``idemgate:``. Tools not in ``tools`` pass through.
"""

from __future__ import annotations

from datetime import timezone
from typing import Any, Iterable, Mapping

from ..engine import _POLICY_FIELDS, Engine, Policy
from ..errors import Failed, IdemgateError, MaybeApplied, NotApplied
from ._gate import KEY_META, acall, jsonable

__all__ = ["KEY_META", "IdempotencyMiddleware"]

_IDEMGATE_EXCEPTIONS = (NotApplied, Failed, MaybeApplied)


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
        return meta
    try:
        meta = context.fastmcp_context.request_context.meta
    except (AttributeError, LookupError, RuntimeError):
        meta = None
    if meta is None:
        return {}
    return meta if isinstance(meta, Mapping) else getattr(meta, "model_extra", None) or {}


def IdempotencyMiddleware(  # noqa: N802 - a class factory: fastmcp is imported only when used
    engine: Engine,
    tools: Iterable[str] | Mapping[str, Policy | Mapping[str, Any] | None],
    *,
    shield: bool = True,
) -> Any:
    """The middleware (a ``fastmcp.server.middleware.Middleware``) gating ``tools``: tool names,
    or a mapping of tool names to their :class:`~idemgate.Policy` (or policy fields; ``None``: the
    engine's policy for the tool)."""
    from fastmcp.exceptions import ToolError
    from fastmcp.tools.base import ToolResult

    if isinstance(tools, Mapping):
        policies = {name: p for name, p in tools.items()}
    else:
        policies = {name: None for name in tools}
    overrides: dict[str, dict[str, Any]] = {}
    for name, p in policies.items():
        fields = (
            {k: getattr(p, k) for k in _POLICY_FIELDS} if isinstance(p, Policy) else dict(p or {})
        )
        overrides[name] = {k: v for k, v in fields.items() if v is not None}
        engine.policy(name, **overrides[name])  # refuse bad settings now

    class _IdempotencyMiddleware(_middleware_base()):  # type: ignore[misc]
        async def on_call_tool(self, context: Any, call_next: Any) -> Any:
            params = context.message
            name = params.name
            if name not in overrides:
                return await call_next(context)
            key = _request_meta(context).get(KEY_META)
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
                r = await acall(
                    engine, name, key, jsonable(params.arguments or {}), run, overrides[name], shield
                )
            except Failed as e:
                raise ToolError(f"{name} failed: {jsonable(e.result)}") from e
            except (NotApplied, MaybeApplied) as e:  # what the tool said: an error result
                raise ToolError(f"{name}: {e}") from e
            except IdemgateError as e:  # a refusal
                raise ToolError(f"idemgate: {e}") from e
            if first and r.executed:
                return first[0]
            stored = dict(r.value or {})
            stored_meta = dict(stored.get("meta") or {})
            stored_meta["dev.idemgate/replayed"] = True
            if r.executed_at is not None:
                stored_meta["dev.idemgate/executed_at"] = (
                    r.executed_at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
                )
            if r.rule is not None:
                stored_meta["dev.idemgate/rule"] = r.rule
            stored["meta"] = stored_meta
            return ToolResult.model_validate(stored)

    return _IdempotencyMiddleware()
