"""The "same action" conformance suite of the Python framework integrations: one table of cases
(:data:`CASES`), stamped for each framework (:func:`stamp`), as the stores share one suite.

Each framework's test module gives a :class:`Driver` that runs a turn of a conversation the way
the framework does, with its own fake model emitting the tool calls a case scripts, under the
integration's DEFAULT options, through a tool ``buy`` recorded as ``billing.buy`` that counts
its side effects. A case then counts the executions and reads what the last call answered:

- ``""``: a fresh result (the action ran);
- ``"model"``: the model reads, in words, that idemgate did not run it (a replay's notice, or a
  refusal handed to the model as the tool's error);
- ``"expired"``: the model reads, in words, that the action already ran, was not performed
  again, and that its result is no longer kept (a retry past the tool's ``ttl``, within its
  ``tombstone``);
- ``"program"``: the call was refused with an exception the program gets (the framework does not
  hand tool errors to the model).

Never silent: a replay the model reads as a fresh result fails every case. What a framework does
differently, and why, is :data:`STAMPS` (the table in ``clients/python/README.md`` is
:func:`markdown`'s, which a test compares)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

#: The model-facing name of the suite's tool, and the record's (``tool=``): a notice must name
#: the first, which the model knows, never the second.
TOOL, RECORD = "buy", "billing.buy"
ARGS = {"item": "book", "quantity": 1}

#: The tool's ``ttl`` in the case of a retry after it, in seconds (the ``tombstone`` is the
#: default, 30 days), and how long that case waits for it to pass: time itself must pass, the
#: engine judges expiry by the store's clock.
TTL = 0.3
PAST_TTL = TTL + 0.3

#: The case of a re-plan: the arguments that name the tool's action, and two wordings of the free
#: text beside them (what a guardrail's retry rewrites).
IDENTITY = ("item", "quantity")
NOTES = ("Gift wrap it, please: it is a present.", "Please wrap it as a present, it is a gift.")


@dataclass(frozen=True)
class Outcome:
    """What a case ends with: how many times the side effect ran, and how the last call was
    answered (``""``, ``"model"`` or ``"program"``, see the module)."""

    executions: int
    told: str = ""

    def __str__(self) -> str:
        told = {
            "": "",
            "model": ", told",
            "expired": ", told it expired",
            "program": ", refused to the program",
        }[self.told]
        return f"{self.executions}{told}"


@dataclass(frozen=True)
class Case:
    id: str
    what: str
    want: Outcome
    #: Other outcomes that keep the promise (never a silent replay).
    also: tuple[Outcome, ...] = ()


CASES = [
    Case(
        "same_call_id",
        "the same call id re-sent in the conversation (a retried run, or the id reused in a later "
        "turn with the same arguments)",
        Outcome(1, "model"),
    ),
    Case(
        "new_call_id",
        "the identical call re-emitted under a new call id in the conversation (after a timeout)",
        Outcome(1, "model"),
    ),
    Case(
        "replan",
        "a re-plan under a new call id: the same `item` and `quantity` (the tool's `identity`), "
        "its `note` reworded",
        Outcome(1, "model"),
    ),
    Case(
        "two_conversations",
        "the same arguments and a constant call id in two conversations",
        Outcome(2),
    ),
    Case(
        "deliberate_repeat",
        "a repeat done as the notice says: the identical call again with a new `idempotency_key`",
        Outcome(2),
    ),
    Case(
        "business_key",
        "the program's `key=` names the action; the call made in two conversations",
        Outcome(1, "model"),
    ),
    Case(
        "reused_call_id",
        "a later turn reuses a call id for a new action (other arguments)",
        Outcome(1, "model"),
        also=(Outcome(1, "program"), Outcome(2)),
    ),
    Case(
        "reused_model_key",
        "a later turn reuses the model's earlier `idempotency_key` for a new action (the same "
        "arguments: the user asks again)",
        Outcome(1, "model"),
        also=(Outcome(2),),
    ),
    Case(
        "after_ttl",
        "a retry after the TTL: the same call id re-sent in the conversation once the tool's "
        "`ttl` passed (the default `tombstone`, 30 days)",
        Outcome(1, "expired"),
        also=(Outcome(1, "model"),),
    ),
]

_BARE = (
    "Not possible: `tool.invoke(tool_call)` without a config names no conversation, so each "
    "call is its own invocation (never global); give the calls the conversation's `thread_id` "
    "to have re-sent and re-emitted calls answered once"
)

_BARE_OWN = (
    "`tool.invoke(tool_call)` without a config: each call is its own invocation, so a reused "
    "call id or key names nothing of another call"
)

#: Each stamped framework (the README's columns, in order) and what it does differently from a
#: case's ``want``, with why.
STAMPS: dict[str, dict[str, tuple[Outcome, str]]] = {
    "OpenAI Agents SDK": {},
    "Pydantic AI": {
        "reused_call_id": (
            Outcome(1, "program"),
            "Pydantic AI raises a tool's exception (`KeyReused`) out of the run",
        ),
    },
    "LangGraph": {
        "reused_call_id": (
            Outcome(1, "program"),
            "`ToolNode`'s default `handle_tool_errors` re-raises `KeyReused` out of the graph",
        ),
    },
    "LangChain tools (`thread_id`)": {
        "reused_call_id": (
            Outcome(1, "program"),
            "`tool.invoke` raises `KeyReused` to the agent loop",
        ),
    },
    "LangChain tools (no config)": {
        "same_call_id": (Outcome(2), _BARE),
        "new_call_id": (Outcome(2), _BARE),
        "replan": (Outcome(2), _BARE),
        "deliberate_repeat": (Outcome(3), _BARE),
        "reused_call_id": (Outcome(2), _BARE_OWN),
        "reused_model_key": (Outcome(2), _BARE_OWN),
        "after_ttl": (Outcome(2), _BARE),
    },
    "CrewAI": {
        "reused_call_id": (
            Outcome(2),
            "CrewAI hands a tool no call id: other arguments are another action",
        ),
        "after_ttl": (
            Outcome(1, "model"),
            "CrewAI hands a tool no call id: the window names the action, and a window's record "
            "lives for the window (60 s), not the `ttl`, so the retry is a replay of the stored "
            "result, told",
        ),
    },
    "Pydantic AI's MCP client, FastMCP middleware": {},
    "Pydantic AI's MCP client, `idemgate mcp`": {},
}


@dataclass
class Call:
    """A tool call the fake model emits: its id and arguments."""

    id: str
    args: dict[str, Any] = field(default_factory=lambda: dict(ARGS))


@dataclass
class Answer:
    """What one call answered: the text (or content) the model reads, or the exception the
    program got."""

    content: Any = None
    error: BaseException | None = None


class Driver(Protocol):
    """A framework driven by its fake model, with a tool ``buy(item, quantity, note=None)``
    (record ``billing.buy``; ``note`` is free text) made with the integration's default options (and ``key=`` when a case names the action, the
    policy fields a case sets, such as ``ttl``, as the integration takes them)."""

    #: The side effects, one per execution.
    executions: list[Any]

    def conversation(self) -> Any:
        """A new conversation (the framework's own: a thread, a group id, an execution...)."""

    def turn(self, conversation: Any, calls: list[Call]) -> list[Answer]:
        """One turn in ``conversation``: the fake model emits ``calls``, the framework runs them;
        what each answered."""


#: A driver's maker: the suite's engine, the tool's ``key=`` (``None``: the default), and as
#: keyword arguments the policy fields the case sets for the tool (``ttl=``).
Make = Callable[..., Driver]


def _told(answer: Answer) -> str:
    if answer.error is not None:
        return "program"
    text = str(answer.content)
    if "no longer kept" in text and "performed again" in text:
        return "expired"  # the kit's words for an expired action, at every door
    # A notice begins with "idemgate:"; a refusal handed to the model names the key.
    return "model" if "idemgate" in text or "idempotency key" in text else ""


def _business_key(args: dict[str, Any], ctx: Any) -> str:
    return f"order-{args['item']}"


def play(case: Case, make: Make, engine: Any) -> tuple[Outcome, list[Answer]]:
    """Plays ``case`` against a new driver; its outcome and every answer."""
    policy: dict[str, Any] = {}
    if case.id == "after_ttl":
        policy = {"ttl": TTL}
    elif case.id == "replan":
        policy = {"identity": IDENTITY}
    d = make(engine, _business_key if case.id == "business_key" else None, **policy)
    conv = d.conversation()
    answers: list[Answer] = []

    def turn(c: Any, *calls: Call) -> None:
        answers.extend(d.turn(c, list(calls)))

    if case.id == "same_call_id":
        turn(conv, Call("call_1"))
        turn(conv, Call("call_1"))
    elif case.id == "new_call_id":
        turn(conv, Call("call_1"))
        turn(conv, Call("call_2"))
    elif case.id == "replan":
        turn(conv, Call("call_1", dict(ARGS, note=NOTES[0])))
        turn(conv, Call("call_2", dict(ARGS, note=NOTES[1])))
    elif case.id in ("two_conversations", "business_key"):
        turn(conv, Call("call_1"))
        turn(d.conversation(), Call("call_1"))
    elif case.id == "deliberate_repeat":
        turn(conv, Call("call_1"))
        turn(conv, Call("call_2"))  # taken for a repeat: the notice says how to mean it
        turn(conv, Call("call_3", dict(ARGS, idempotency_key=f"again-{uuid.uuid4().hex[:8]}")))
    elif case.id == "reused_call_id":
        turn(conv, Call("call_1"))
        turn(conv, Call("call_1", dict(ARGS, item="pen")))
    elif case.id == "reused_model_key":
        turn(conv, Call("call_1", dict(ARGS, idempotency_key="buy-1")))
        turn(conv, Call("call_2", dict(ARGS, idempotency_key="buy-1")))
    elif case.id == "after_ttl":
        turn(conv, Call("call_1"))
        time.sleep(PAST_TTL)  # the record's TTL passes; its tombstone remains
        turn(conv, Call("call_1"))
    else:
        raise AssertionError(f"no scenario for {case.id}")
    return Outcome(len(d.executions), _told(answers[-1])), answers


def expected(framework: str, case: Case) -> Outcome:
    """What ``framework`` must do in ``case``: the case's ``want``, else its stamp's."""
    deviation = STAMPS[framework].get(case.id)
    return case.want if deviation is None else deviation[0]


def check(framework: str, case: Case, make: Make, engine: Any) -> None:
    """Plays ``case`` and asserts the framework's expected outcome; every notice names the tool
    as the model calls it."""
    got, answers = play(case, make, engine)
    assert got == expected(framework, case), (case.id, str(got), [str(a) for a in answers])
    # Never silent, in every turn: each answer the model reads as a fresh result is an execution.
    fresh = [a for a in answers if _told(a) == ""]
    assert len(fresh) == got.executions, (case.id, [str(a) for a in answers])
    for a in answers:
        text = str(a.content)
        if "not repeated" in text or "taken for a repeat" in text or "no longer kept" in text:
            # A replay's notice, or an expired action's: it names the tool as the model calls
            # it, or no tool ("this tool", "this action", as the MCP doors' notices do), never
            # by the record's name.
            named = f"call {TOOL} " in text or f"of {TOOL} " in text
            anonymous = "this tool" in text.lower() or "this action" in text.lower()
            assert named or anonymous, text
            assert RECORD not in text, f"the notice names the record's tool: {text}"
        if _told(a) == "expired":
            # When it ran, that it was not done now, and how to do it again on purpose.
            assert "already performed at " in text and "NOT performed again" in text, text
            assert "idempotency_key" in text, text


def assert_optional_key(schema: dict[str, Any]) -> None:
    """The ``idempotency_key`` argument in a JSON schema a model reads: described ("Leave
    empty..."), nullable, and optional (absent from ``required``; a strict schema, which lists
    every argument there, says "optional" by the null)."""
    from idemgate.integrations._tool_calls import KEY_DESCRIPTION

    prop = schema["properties"]["idempotency_key"]
    assert prop.get("description") == KEY_DESCRIPTION, prop
    types = [t.get("type") for t in prop.get("anyOf", [])] or prop.get("type")
    assert "null" in types and "string" in types, prop
    strict = schema.get("additionalProperties") is False and set(schema.get("required", ())) == set(
        schema["properties"]
    )
    assert strict or "idempotency_key" not in schema.get("required", ()), schema


def markdown() -> str:
    """The suite's table, as ``clients/python/README.md`` shows it."""
    names = list(STAMPS)
    notes: list[str] = []
    rows = [
        "| case | want | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for case in CASES:
        cells = []
        for name in names:
            deviation = STAMPS[name].get(case.id)
            if deviation is None:
                cells.append(str(case.want))
                continue
            if deviation[1] not in notes:
                notes.append(deviation[1])
            # In bold: an outcome the case does not accept (the framework cannot do it).
            shown = str(deviation[0]) if deviation[0] in case.also else f"**{deviation[0]}**"
            cells.append(f"{shown} ({notes.index(deviation[1]) + 1})")
        want = str(case.want)
        if case.also:
            want += " (or " + "; ".join(str(o) for o in case.also) + ")"
        rows.append(f"| {case.what} | {want} | " + " | ".join(cells) + " |")
    legend = (
        "The number is the side effect's executions; \"told\": the model reads, in words, that "
        "the call was not run (when the action ran, its result, how to repeat it on purpose); "
        "\"told it expired\": the model reads, in words, that the action already ran (when), was "
        "not performed again, that its result is no longer kept, and how to do it again on "
        "purpose (a new `idempotency_key`); "
        "\"refused to the program\": the framework raises idemgate's exception to the program "
        "instead of handing it to the model. In bold: what the case does not accept, which the "
        "framework cannot do."
    )
    footnotes = [f"({i}) {note}." for i, note in enumerate(notes, 1)]
    return "\n".join(rows) + "\n\n" + legend + "\n\n" + "\n".join(footnotes) + "\n"


def stamp(framework: str, make: Make) -> Callable[..., None]:
    """The suite's test for ``framework``, driven by ``make``: one test per case."""
    import pytest

    assert framework in STAMPS, framework
    for case in CASES:  # an outcome a case does not accept is marked "Not possible", with why
        deviation = STAMPS[framework].get(case.id)
        if deviation is not None and deviation[0] not in case.also:
            assert deviation[1].startswith("Not possible"), (framework, case.id)

    @pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
    def test_same_action(engine: Any, case: Case) -> None:
        check(framework, case, make, engine)

    return test_same_action
