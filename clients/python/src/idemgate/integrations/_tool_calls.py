"""What every framework integration shares: how a tool call's logical action is named (the
framework's tool-call id within its scope, the re-emission window, the model's and the program's
keys) and how a tool function is run once per action through the in-process engine, with the
framework's own signature kept intact."""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from .._native import name_action as _native_name_action
from ..engine import _CURRENT_KEY, _POLICY_FIELDS, Engine, Result, given_policy
from ..errors import IdemgateError, LeaseLost, NotApplied, OutcomeExpired, OutcomeNotRecorded

F = TypeVar("F", bound=Callable[..., Any])

#: Where MCP requests carry the idempotency key (``params._meta``), as ``idemgate mcp`` reads it.
KEY_META = "dev.idemgate/idempotency-key"

#: Where MCP requests name the conversation they belong to (``params._meta``), as ``idemgate
#: mcp`` reads it: the scope of the re-emission window.
CONVERSATION_META = "dev.idemgate/conversation"

#: Where MCP requests carry the framework's tool-call id (``params._meta``), as ``idemgate mcp``
#: reads it: it names the action within the conversation, with the re-emission window.
CALL_ID_META = "dev.idemgate/tool-call-id"

#: The tool argument a model sets to name a new action (a deliberate repeat), as ``idemgate mcp``
#: reads it.
KEY_ARGUMENT = "idempotency_key"

#: The re-emission window when a tool's policy sets no ``fallback_window``, in seconds: an
#: identical write in one scope within it is taken for the same action (a model re-emitting a
#: call it was unsure of does so within seconds); ``fallback_window=0`` turns it off.
DEFAULT_WINDOW = 60.0

#: Calls still running after their caller was cancelled (a framework's tool timeout): kept
#: referenced until they finish and their outcome is stored.
_SHIELDED: set[asyncio.Task[Any]] = set()


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: pydantic models and dataclasses as their fields, anything else
    JSON cannot hold as its ``repr``. A tool's result goes through it before it is stored, so the
    first answer and every replay are the same data."""
    return json.loads(json.dumps(value, default=_default))


def _default(o: Any) -> Any:
    dump = getattr(o, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if hasattr(o, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(o)
    return repr(o)


def _retrieve(task: asyncio.Task[Any]) -> None:
    _SHIELDED.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: its outcome is in the store, nobody awaits it any more


@dataclass(frozen=True)
class Action:
    """What names the action of one call, as the kit's one rule named it
    (``idemgate_kit::identity``, ``docs/DESIGN.md`` "What names an action"): the record ``key``
    (``None``: the window alone names it), the ``scope`` it was made in, the ``rule`` that named
    it (``business_key``, ``model_key``, ``call_id``, ``window``; ``orchestration_key`` at the
    doors that take one), and whether the re-emission ``window`` applies (an identical call in
    the scope within the window is the same action)."""

    key: str | None
    scope: str | None
    window: bool
    # The framework's id of the model's tool call, for the call's span (gen_ai.tool.call.id).
    call_id: str | None = None
    rule: str = "window"


def name_action(
    *,
    call_id: str | None,
    scope: str | None,
    business_key: str | None = None,
    model_key: str | None = None,
    orchestration_key: str | None = None,
) -> Action:
    """Names a call's action by the one rule every door shares (the native ``name_action``):

    - ``orchestration_key`` (an MCP ``_meta`` key) or ``business_key`` (the caller's ``key=``):
      the action itself, the same in every conversation; no window.
    - ``model_key`` (the model's ``idempotency_key`` argument): a new action the model named,
      within the scope (a model's "1" in one conversation is not another's); no window, which
      is how the model repeats an action on purpose.
    - else the framework's ``call_id`` within the scope (the same id in another conversation is
      another action), with the window joining a re-emission under a new id.

    A call whose framework names no scope is its own invocation: its call id or key reaches no
    other call, and no window is kept for it. Never global."""
    key, named_scope, rule, window = _native_name_action(
        scope=scope,
        orchestration_key=orchestration_key,
        business_key=business_key,
        model_key=model_key,
        call_id=call_id,
    )
    return Action(key, named_scope, window, call_id, rule)


def scoped_key(scope: str | None, call_id: str) -> str:
    """The key of a tool call's action: its call id within its scope (:func:`name_action`);
    without a scope, within this one invocation (a key no other call shares)."""
    key = name_action(call_id=call_id, scope=scope).key
    assert key is not None  # a call id always names a key
    return key


def scoped_meta(scope: str | None, call_id: str | None) -> dict[str, Any]:
    """The ``_meta`` an MCP request of a tool call carries for ``idemgate mcp`` and the FastMCP
    middleware: the framework's call id (``dev.idemgate/tool-call-id``) and the conversation,
    from which the door names the action by the same rule as here (:func:`name_action`: the call
    id within the conversation, with the re-emission window). Not an idempotency key: a key in
    ``_meta`` is the orchestration layer's, which names an action in every conversation and has
    no window. Without a scope the conversation is this invocation's own, never none (the
    proxy would take its whole session, every conversation of a desktop agent, for one)."""
    action = name_action(call_id=call_id, scope=scope)
    meta: dict[str, Any] = {CONVERSATION_META: action.scope}
    if call_id:
        meta[CALL_ID_META] = call_id
    return meta


def window_of(engine: Engine, tool: str, overrides: dict[str, Any], action: Action) -> float:
    """The re-emission window of a call in seconds (0: none): the policy's ``fallback_window``,
    else :data:`DEFAULT_WINDOW`. 0 without a scope: a window must never join calls of two
    conversations."""
    if not action.window or action.scope is None:
        return 0.0
    configured = engine.policy(tool, **overrides).fallback_window
    return DEFAULT_WINDOW if configured is None else configured


class _Window:
    """The window's record, checked inside the call of the key's record (the key's record first,
    then the window's, always in that order, so two calls never wait for each other in a cycle):
    the key's call runs :meth:`run`, which asks the window's record; its ``result`` says whether
    the function ran or an identical call's outcome was replayed."""

    def __init__(self, identity: tuple[str, ...] = ()) -> None:
        self.result: Result | None = None
        self.refused: IdemgateError | None = None
        # The tool's identity fields: what the window compared, for the notice of a repeat.
        self.identity = identity

    def _refused(self, e: IdemgateError) -> NotApplied:
        # Refused before anything ran (in flight, unknown, store unavailable...): the key's record
        # is released (nothing happened under it), and the refusal is what the caller is told.
        self.refused = e
        return NotApplied(f"the re-emission window refused the call: {e}")

    def run(self, call: Callable[[], Result]) -> Any:
        try:
            self.result = call()
        except (OutcomeNotRecorded, LeaseLost):
            raise  # the function ran: the key's record must not be released
        except IdemgateError as e:
            raise self._refused(e) from e
        return self.result.value

    async def arun(self, call: Callable[[], Awaitable[Result]]) -> Any:
        try:
            self.result = await call()
        except (OutcomeNotRecorded, LeaseLost):
            raise
        except IdemgateError as e:
            raise self._refused(e) from e
        return self.result.value

    def outcome(self, r: Result) -> Outcome:
        w = self.result
        return Outcome(r, w if w is not None and w.replayed else None, self.identity)


@dataclass(frozen=True)
class Outcome:
    """How a call ended: ``result``, the answer of the action's record (for a call the window
    alone named, the window's), and ``repeat_of``, the window's replay when the call was taken
    for a repeat of an earlier identical call (``None`` otherwise)."""

    result: Result
    repeat_of: Result | None
    #: The tool's identity fields when the window compared only them (the policy's
    #: ``identity``): the repeat's notice names them.
    identity: tuple[str, ...] = ()

    def notice(
        self, tool: str, model_key: bool, rule: str, result_above: bool = False
    ) -> str | None:
        """What the model must read besides the value when this call did not run (``None``
        when it ran): the window's notice, or, for a replay under the call's key, the key's.
        ``tool`` is the name the model calls the tool by; ``rule`` the one that named the
        action (:attr:`Action.rule`)."""
        if self.repeat_of is not None:
            return repeat_notice(tool, self.repeat_of, model_key, result_above, self.identity)
        if self.result.replayed:
            return key_notice(tool, self.result, rule, model_key, result_above)
        return None

    def answer(self, tool: str, model_key: bool, rule: str = "call_id") -> Any:
        """What the model is handed: the value, or, for a call that did not run (a replay under
        its key, or the window's), a text that says so in words with the result in it (a silent
        replay would let the model believe it did the action again)."""
        told = self.notice(tool, model_key, rule)
        return self.result.value if told is None else told


def _again(tool: str, model_key: bool, until: str = "") -> str:
    """How the model does an action again on purpose (``model_key``: the tool takes the
    ``idempotency_key`` argument), in the notices' words; without the argument, that it is not
    repeated (``until``: for how long)."""
    if model_key:
        return (
            f"To do it again on purpose, call {tool} again with the argument {KEY_ARGUMENT} set "
            "to a new value that names the new action."
        )
    return f"It is not repeated{until}: ask the user if it must be done again."


def _result_text(replayed: Result, result_above: bool) -> str:
    if result_above:
        return "the result above is the one it returned then"
    return f"the result it returned then: {json.dumps(replayed.value)}"


def repeat_notice(
    tool: str,
    replayed: Result,
    model_key: bool = True,
    result_above: bool = False,
    identity: Sequence[str] = (),
) -> str:
    """What the model reads for a call taken for a repeat of an earlier identical call (or, with
    the tool's ``identity`` fields, of an earlier call with the same ones): when it ran, its
    result (or, ``result_above``, that the result shown is that one), that it was not run again,
    and how to do it again on purpose (``model_key``: the tool takes the ``idempotency_key``
    argument). ``tool`` is the name the model calls it by."""
    when = _when(replayed.executed_at)
    return (
        f"idemgate: {earlier_call(tool, identity)} ran at {when} in this "
        "conversation, so this one was taken for a repeat of that action and was not run "
        f"again; {_result_text(replayed, result_above)}. "
        f"{_again(tool, model_key, ' within the window')}"
    )


def earlier_call(tool: str, identity: Sequence[str] = ()) -> str:
    """The earlier call a window's replay names, in words: an identical call of ``tool``, or,
    when the window compared only the tool's ``identity`` fields, an action with the same ones."""
    if identity:
        return (
            f"an action of {tool} with the same {', '.join(identity)} (the arguments that name it; "
            "the others may have been worded differently)"
        )
    return f"an identical call of {tool} (the same arguments)"


def identity_of(engine: Engine, tool: str, overrides: dict[str, Any]) -> tuple[str, ...]:
    """The tool's identity fields under ``overrides``: what its window compares."""
    return tuple(engine.policy(tool, **overrides).identity)


#: Why a call's key named an action already done, by the rule that named it (Action.rule).
_NAMED_BY = {
    "call_id": "this call of {tool} has the tool-call id of an earlier call in this conversation",
    "model_key": f"this call of {{tool}} has the {KEY_ARGUMENT} of an earlier call in this "
    "conversation",
    "business_key": "the program names this call of {tool} as that same action",
    "orchestration_key": "the idempotency key of this call of {tool} names that same action",
    "window": "an identical call of {tool} (the same arguments) was made earlier in this "
    "conversation",
}


def key_notice(
    tool: str, replayed: Result, rule: str, model_key: bool = True, result_above: bool = False
) -> str:
    """What the model reads for a call answered from an earlier call's record under its key (a
    re-sent or reused call id, the model's own ``idempotency_key`` used again, the program's
    key): the kit's words for a replay (``idemgate_kit::Explanation::for_model``), why the call
    named that action, its result, and how to do it again on purpose. A program's key names
    the action whatever the model sends, so the model is told to ask, not to pass a key."""
    when = _when(replayed.executed_at)
    why = _NAMED_BY.get(rule, _NAMED_BY["orchestration_key"]).format(tool=tool)
    program = rule in ("business_key", "orchestration_key")
    again = (
        "It is done once, whatever the conversation: ask the user if it must be done again."
        if program
        else _again(tool, model_key)
    )
    return (
        f"idemgate: this action was already performed at {when} and was not repeated ({why}); "
        f"{_result_text(replayed, result_above)}. {again}"
    )


def expired_notice(
    tool: str, expired: OutcomeExpired, rule: str, model_key: bool = True
) -> str:
    """What the model reads for a call refused as expired (:class:`~idemgate.errors.OutcomeExpired`:
    past the record's TTL, within its tombstone): the kit's words for it
    (``idemgate_kit::Explanation::for_model``), naming the tool as the model calls it: the
    action this call names was already performed (when), it was NOT performed again now, why
    the call named that action (``rule``, :attr:`Action.rule`), that its result is no longer
    kept and so cannot be shown, and how to do it again on purpose (``model_key``: with a new
    ``idempotency_key``). A program's key names the action whatever the model sends, so the
    model is told to ask the user, not to pass a key. Never how a person reopens the record:
    that is the program's (the exception's message)."""
    why = _NAMED_BY.get(rule, _NAMED_BY["orchestration_key"]).format(tool=tool)
    program = rule in ("business_key", "orchestration_key")
    again = (
        "It is done once, whatever the conversation: ask the user if it must be done again."
        if program
        else _again(tool, model_key)
    )
    when = expired.executed_at or "an earlier time"
    until = f" (it expired at {expired.expired_at})" if expired.expired_at else ""
    return (
        f"idemgate: this action of {tool} was already performed at {when} and was NOT "
        f"performed again ({why}); its result is no longer kept{until}, so it cannot be shown. "
        f"{again}"
    )


def _when(at: datetime | None) -> str:
    if at is None:
        return "an earlier time"
    return at.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def call_sync(
    engine: Engine,
    tool: str,
    action: Action,
    args: Any,
    fn: Callable[[], Any],
    overrides: dict[str, Any],
) -> Outcome:
    """Runs ``fn`` once per action (see :func:`name_action`): the key's record, and inside it
    the window's record of ``(scope, tool, arguments)``."""
    window = window_of(engine, tool, overrides, action)
    if not window:
        return Outcome(
            engine.call(
                tool, action.key, args, fn, scope=action.scope, call_id=action.call_id, **overrides
            ), None
        )
    in_window = dict(overrides, fallback_window=window)
    w = _Window(identity_of(engine, tool, overrides))

    def windowed(run: Callable[[], Any]) -> Result:
        return engine.call(
            tool, None, args, run, scope=action.scope, call_id=action.call_id, **in_window
        )

    if action.key is None:  # the window alone names the action
        r = w.result = windowed(fn)
        return w.outcome(r)

    def in_key() -> Any:
        # The function runs under the key's record, so it sees that record's downstream key
        # (current_key), not the short-lived window record's.
        return w.run(lambda: windowed(functools.partial(_keyed, _CURRENT_KEY.get(), fn)))

    try:
        # The scope goes on the record too: operators (and `idemgate scan --records`) see which
        # conversation it was made in; a key is not named by it.
        r = engine.call(
            tool, action.key, args, in_key, scope=action.scope, call_id=action.call_id, **overrides
        )
    except NotApplied:
        if w.refused is None:
            raise  # the function's own: nothing happened
        raise w.refused from None
    return w.outcome(r)


async def call_async(
    engine: Engine,
    tool: str,
    action: Action,
    args: Any,
    fn: Callable[[], Any],
    overrides: dict[str, Any],
    shield: bool,
) -> Outcome:
    """As :func:`call_sync`, awaited (``fn`` may return an awaitable; its value is made JSON
    data). With ``shield``, cancelling the caller (a framework's tool timeout) does not cancel
    the call: it finishes in the background and its outcome is stored, so the retry with the
    same key waits for it and gets the replay (instead of a record left unknown by a function
    torn in half)."""
    window = window_of(engine, tool, overrides, action)
    in_window = dict(overrides, fallback_window=window)
    w = _Window(identity_of(engine, tool, overrides) if window else ())

    def windowed(run: Callable[[], Awaitable[Any]]) -> Awaitable[Result]:
        return engine.acall(
            tool, None, args, run, scope=action.scope, call_id=action.call_id, **in_window
        )

    def in_key() -> Awaitable[Any]:
        # As in call_sync: the function sees the key's downstream key.
        key = _CURRENT_KEY.get()
        return w.arun(lambda: windowed(lambda: _akeyed(key, fn)))

    async def call() -> Outcome:
        if not window:
            return Outcome(
                await engine.acall(
                    tool,
                    action.key,
                    args,
                    lambda: _awaited(fn),
                    scope=action.scope,
                    call_id=action.call_id,
                    **overrides,
                ),
                None,
            )
        if action.key is None:  # the window alone names the action
            r = w.result = await windowed(lambda: _awaited(fn))
            return w.outcome(r)
        try:
            r = await engine.acall(
                tool, action.key, args, in_key, scope=action.scope, call_id=action.call_id, **overrides
            )
        except NotApplied:
            if w.refused is None:
                raise  # the function's own: nothing happened
            raise w.refused from None
        return w.outcome(r)

    if not shield:
        return await call()
    task = asyncio.ensure_future(call())
    _SHIELDED.add(task)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


async def _awaited(fn: Callable[[], Any]) -> Any:
    value = fn()
    if inspect.isawaitable(value):
        value = await value
    return jsonable(value)


def _keyed(key: str | None, fn: Callable[[], Any]) -> Any:
    """``fn()`` seeing ``key`` as its ``current_key``."""
    token = _CURRENT_KEY.set(key)
    try:
        return fn()
    finally:
        _CURRENT_KEY.reset(token)


async def _akeyed(key: str | None, fn: Callable[[], Any]) -> Any:
    """``_awaited(fn)`` seeing ``key`` as its ``current_key``."""
    token = _CURRENT_KEY.set(key)
    try:
        return await _awaited(fn)
    finally:
        _CURRENT_KEY.reset(token)


#: What a ``scope=``/``key=`` option is called with: the call's arguments (without the framework's
#: context objects) and the framework's context (``ToolContext``, ``RunContext``, the graph's
#: ``RunnableConfig``, FastMCP's ``MiddlewareContext``).
Namer = Callable[[dict[str, Any], Any], "str | None"]


def once_per_action(
    engine: Engine,
    fn: F,
    *,
    tool: str,
    call_id_of: Callable[[inspect.BoundArguments], str | None],
    context_of: Callable[[inspect.BoundArguments], Any],
    default_scope: Callable[[Any], str | None],
    exclude: set[str],
    shield: bool,
    policy: Mapping[str, Any],
    key: Namer | None = None,
    scope: Namer | None = None,
    model_key: bool = True,
    name: str | None = None,
    name_of: Callable[[Any], str | None] | None = None,
) -> F:
    """``fn`` run through ``engine`` under ``tool``, once per action (:func:`name_action`): the
    call id is ``call_id_of(bound arguments)``, the framework's context ``context_of(...)``, its
    scope ``scope(args, context)`` or else ``default_scope(context)``; ``key(args, context)``
    names the action by its business identity instead. The fingerprinted arguments are the
    call's minus ``exclude`` (the framework's context objects) and the model's key. ``policy``
    (:class:`~idemgate.engine.PolicyOptions`) overrides the engine's policy for the tool.

    A notice names the tool as the model calls it, not by the record's ``tool``: the name the
    framework's context gives the call (``name_of(context)``), else ``name`` (default: the
    function's name, which the frameworks name a tool by).

    With ``model_key``, the model may pass an ``idempotency_key`` argument to name a new action
    (a deliberate repeat): the wrapper's signature gains it (optional, described to the model)
    unless ``fn`` declares it itself, and ``fn`` is called without it. The wrapper otherwise has
    ``fn``'s signature, name and docstring (``functools.wraps``), so a framework derives the same
    schema from it."""
    sig = inspect.signature(fn)
    given = given_policy(policy)
    engine.policy(tool, **given)  # refuse bad settings now
    declared = KEY_ARGUMENT in sig.parameters
    injected = model_key and not declared
    skip = exclude | ({KEY_ARGUMENT} if declared else set())
    fallback_name: str = name or str(getattr(fn, "__name__", tool))

    def prepare(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[Action, Any, dict[str, Any], str]:
        given_key = kw.pop(KEY_ARGUMENT, None) if injected else None
        bound = sig.bind(*a, **kw)
        bound.apply_defaults()
        if declared:
            given_key = bound.arguments.get(KEY_ARGUMENT)
        payload = jsonable({k: v for k, v in bound.arguments.items() if k not in skip})
        ctx = context_of(bound)
        action = name_action(
            call_id=call_id_of(bound),
            scope=scope(payload, ctx) if scope is not None else default_scope(ctx),
            business_key=key(payload, ctx) if key is not None else None,
            model_key=(given_key or None) if model_key else None,
        )
        called = (name_of(ctx) if name_of is not None else None) or fallback_name
        return action, payload, kw, called

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*a: Any, **kw: Any) -> Any:
            action, payload, kw, called = prepare(a, kw)
            try:
                out = await call_async(
                    engine, tool, action, payload, lambda: fn(*a, **kw), given, shield
                )
            except OutcomeExpired as e:  # nothing ran: the model reads so, in words
                return expired_notice(called, e, action.rule, model_key)
            return out.answer(called, model_key, action.rule)

        wrapped: Any = awrapper
    else:

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            action, payload, kw, called = prepare(a, kw)
            try:
                out = call_sync(engine, tool, action, payload, lambda: jsonable(fn(*a, **kw)), given)
            except OutcomeExpired as e:  # nothing ran: the model reads so, in words
                return expired_notice(called, e, action.rule, model_key)
            return out.answer(called, model_key, action.rule)

        wrapped = wrapper
    if injected:
        _add_key_parameter(wrapped, sig)
    return wrapped  # type: ignore[no-any-return]


#: How the model is told what the ``idempotency_key`` argument is for.
KEY_DESCRIPTION = (
    "Leave empty. Only to do an action again on purpose that was already done with the same "
    "arguments: a new value that names the new action."
)


def _add_key_parameter(wrapper: Any, sig: inspect.Signature) -> None:
    """Gives ``wrapper`` an optional keyword parameter ``idempotency_key`` in its signature and
    annotations, where frameworks read a tool's schema."""
    try:
        from typing import Annotated

        from pydantic import Field

        annotation: Any = Annotated[str | None, Field(description=KEY_DESCRIPTION)]
    except ImportError:  # no pydantic (every framework here has it): the name alone
        annotation = str | None
    params = list(sig.parameters.values())
    extra = inspect.Parameter(
        KEY_ARGUMENT, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )
    at = next(
        (i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params)
    )
    params.insert(at, extra)
    wrapper.__signature__ = sig.replace(parameters=params)
    # A new dict: functools.wraps shares the function's own.
    wrapper.__annotations__ = {**getattr(wrapper, "__annotations__", {}), KEY_ARGUMENT: annotation}


def schema_fields(schema: Any) -> set[str]:
    """The argument names of a tool schema (a pydantic model or a JSON schema)."""
    if schema is None:
        return set()
    if isinstance(schema, dict):
        return set(schema.get("properties") or {})
    fields = getattr(schema, "model_fields", None)
    return set(fields if fields is not None else getattr(schema, "__fields__", {}))


def with_key_argument(schema: Any) -> Any:
    """``schema`` (a JSON schema or a pydantic model) with an optional ``idempotency_key``
    argument, described to the model."""
    if isinstance(schema, dict):
        out = copy.deepcopy(schema)
        # Optional (not in "required") and nullable, as pydantic renders `str | None = None`:
        # a framework that makes every argument required for a strict schema (OpenAI's strict
        # mode, CrewAI) must still let the model send null.
        out.setdefault("properties", {})[KEY_ARGUMENT] = {
            "anyOf": [{"type": "string"}, {"type": "null"}],
            "default": None,
            "description": KEY_DESCRIPTION,
        }
        if KEY_ARGUMENT in out.get("required", ()):
            out["required"] = [r for r in out["required"] if r != KEY_ARGUMENT]
        return out
    from pydantic import Field, create_model

    fields: dict[str, Any] = {
        KEY_ARGUMENT: (str | None, Field(default=None, description=KEY_DESCRIPTION))
    }
    return create_model(schema.__name__, __base__=schema, **fields)


class ToolCalls:
    """How a framework's tool object wrapped by an integration (LangChain's and CrewAI's
    ``idempotent``) names and runs its calls: the wrapper's options, and whether the model's
    ``idempotency_key`` is an argument of the tool itself (``declared``: passed on) or one the
    wrapper adds to its schema (``injected``: taken out of the call)."""

    def __init__(
        self,
        engine: Engine,
        inner: Any,
        tool: str,
        fields: set[str],
        *,
        key: Namer | None,
        scope: Namer | None,
        model_key: bool,
        shield: bool,
        policy: Mapping[str, Any],
    ) -> None:
        self.engine, self.inner, self.tool = engine, inner, tool
        # The name the model calls the tool by (the wrapper keeps the tool's): what a notice
        # names, never the record's `tool=`, which the model does not know.
        self.name: str = getattr(inner, "name", None) or tool
        self.key, self.scope, self.model_key, self.shield = key, scope, model_key, shield
        self.given = given_policy(policy)
        engine.policy(tool, **self.given)  # refuse bad settings now
        self.declared = KEY_ARGUMENT in fields
        self.injected = model_key and not self.declared

    def schema(self, schema: Any) -> Any:
        """The wrapper's argument schema: the tool's, with the model's key when it is added."""
        return with_key_argument(schema) if self.injected and schema is not None else schema

    def model_key_of(self, kwargs: dict[str, Any]) -> str | None:
        """The model's key of a call (taken out of ``kwargs`` when the wrapper added it)."""
        given = kwargs.pop(KEY_ARGUMENT, None) if self.injected else kwargs.get(KEY_ARGUMENT)
        return (given or None) if self.model_key else None

    def action(
        self,
        call_id: str | None,
        payload: Any,
        ctx: Any,
        default_scope: Callable[[], str | None],
        model_key: str | None,
    ) -> Action:
        """The action of a call (:func:`name_action`): its scope ``scope(payload, ctx)``, else
        ``default_scope()``; its business key ``key(payload, ctx)``."""
        return name_action(
            call_id=call_id,
            scope=self.scope(payload, ctx) if self.scope is not None else default_scope(),
            business_key=self.key(payload, ctx) if self.key is not None else None,
            model_key=model_key,
        )

    def answer(self, out: Outcome, action: Action) -> Any:
        """What the model is handed of a call's outcome (:meth:`Outcome.answer`)."""
        return out.answer(self.name, self.model_key, action.rule)

    def run(self, action: Action, payload: Any, fn: Callable[[], Any]) -> Any:
        """``fn()`` once per action; what the model is handed (for an action whose result is
        no longer kept, :func:`expired_notice`)."""
        try:
            out = call_sync(
                self.engine, self.tool, action, payload, lambda: jsonable(fn()), self.given
            )
        except OutcomeExpired as e:
            return expired_notice(self.name, e, action.rule, self.model_key)
        return self.answer(out, action)

    async def arun(self, action: Action, payload: Any, fn: Callable[[], Any]) -> Any:
        """As :meth:`run`, awaited (``fn`` may return an awaitable)."""
        try:
            out = await call_async(
                self.engine, self.tool, action, payload, fn, self.given, self.shield
            )
        except OutcomeExpired as e:
            return expired_notice(self.name, e, action.rule, self.model_key)
        return self.answer(out, action)


def split_policy(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword arguments of a wrapper that also takes its framework's own: the policy fields
    (:class:`~idemgate.engine.PolicyOptions`) and the rest, for the framework."""
    policy = {k: kwargs[k] for k in _POLICY_FIELDS if k in kwargs}
    return policy, {k: v for k, v in kwargs.items() if k not in policy}


def context_tool(
    engine: Engine,
    fn: F,
    *,
    what: str,
    tool: str,
    default_scope: Callable[[Any], str | None],
    key: Namer | None,
    scope: Namer | None,
    model_key: bool,
    shield: bool,
    policy: Mapping[str, Any],
    name: str | None = None,
) -> F:
    """:func:`once_per_action` of ``fn`` whose first parameter takes the framework's context
    (``what``: its name), which carries the call's ``tool_call_id`` and ``tool_name`` (the OpenAI
    Agents SDK's ``ToolContext``, Pydantic AI's ``RunContext``): the context is not
    fingerprinted, and is what ``default_scope``, ``key=`` and ``scope=`` are given; its
    ``tool_name`` (else ``name``) is the name a notice gives the tool."""
    ctx = context_param(fn, what)
    return once_per_action(
        engine,
        fn,
        tool=tool,
        call_id_of=lambda b: getattr(b.arguments[ctx], "tool_call_id", None),
        context_of=lambda b: b.arguments[ctx],
        default_scope=default_scope,
        exclude={ctx},
        shield=shield,
        policy=policy,
        key=key,
        scope=scope,
        model_key=model_key,
        name=name,
        # The name the model called: a framework may register the function under another.
        name_of=lambda c: getattr(c, "tool_name", None),
    )


def context_param(fn: Callable[..., Any], what: str) -> str:
    """The name of ``fn``'s first parameter, where the framework passes its context."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(
            f"{getattr(fn, '__name__', fn)!r}: the first parameter must take the {what} "
            "(its tool-call id is the idempotency key)"
        )
    return params[0].name
