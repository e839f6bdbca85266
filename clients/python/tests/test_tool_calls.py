"""What every framework integration shares (``idemgate.integrations._tool_calls``), without a
framework: a call's action is its call id within its scope, and inside the scope an identical
call within the window is the same action under any call id, exactly once under races."""

from __future__ import annotations

import asyncio
import inspect
import threading
from pathlib import Path
from typing import Any

import pytest

from idemgate import Engine, InFlight, Policy, current_key
from idemgate.integrations import scoped_key
from idemgate.integrations._tool_calls import (
    Action,
    call_async,
    call_sync,
    name_action,
    once_per_action,
    with_key_argument,
)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine.open(
        f"sqlite://{tmp_path / 'idem.db'}", journal=str(tmp_path / "journal"), default=Policy(wait=30)
    )


def action(scope: str, call_id: str) -> Action:
    return name_action(call_id=call_id, scope=scope)


def test_sixteen_threads_emitting_one_call_under_new_ids_run_it_once(engine: Engine) -> None:
    runs: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(16)
    outcomes = []

    def charge() -> dict:
        with lock:
            runs.append(1)
        return {"charge_id": "ch_7"}

    def one(i: int) -> None:
        start.wait()
        out = call_sync(engine, "charge", action("conv", f"call_{i}"), {"order": 7}, charge, {})
        with lock:
            outcomes.append(out)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runs) == 1, "one execution"
    assert len(outcomes) == 16
    assert sum(o.repeat_of is None for o in outcomes) == 1
    assert all(o.result.value == {"charge_id": "ch_7"} for o in outcomes)


def test_sixteen_tasks_emitting_one_call_under_new_ids_run_it_once(engine: Engine) -> None:
    runs: list[int] = []

    async def charge() -> dict:
        runs.append(1)
        await asyncio.sleep(0)  # lets the other tasks reach the store meanwhile
        return {"charge_id": "ch_7"}

    async def scenario() -> list:
        return await asyncio.gather(
            *(
                call_async(engine, "charge", action("conv", f"call_{i}"), {"order": 7}, charge, {}, True)
                for i in range(16)
            )
        )

    outcomes = asyncio.run(scenario())
    assert len(runs) == 1, "one execution"
    assert sum(o.repeat_of is None for o in outcomes) == 1
    told = [o.answer("charge", True) for o in outcomes if o.repeat_of is not None]
    assert len(told) == 15 and all("taken for a repeat" in t for t in told)


def test_a_call_the_window_refuses_leaves_its_call_id_free(engine: Engine) -> None:
    """A re-emitted call that finds the first still running and may not wait for it is refused
    (``InFlight``); nothing ran under its call id, so that id is not kept: re-sent once the first
    has finished, it is told it was a repeat."""
    entered, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def charge() -> dict:
        runs.append(1)
        entered.set()
        release.wait()
        return {"charge_id": "ch_7"}

    first = threading.Thread(
        target=call_sync, args=(engine, "charge", action("conv", "call_1"), {"order": 7}, charge, {})
    )
    first.start()
    assert entered.wait(30)
    with pytest.raises(InFlight):
        call_sync(engine, "charge", action("conv", "call_2"), {"order": 7}, charge, {"wait": 0})
    assert engine.record("charge", scoped_key("conv", "call_2")) is None, "released"
    release.set()
    first.join()
    again = call_sync(engine, "charge", action("conv", "call_2"), {"order": 7}, charge, {})
    assert runs == [1] and again.repeat_of is not None


def test_the_window_is_per_scope_and_off_at_zero(engine: Engine) -> None:
    runs: list[int] = []

    def charge() -> int:
        runs.append(1)
        return len(runs)

    for scope, call_id in (("conv-a", "c1"), ("conv-a", "c2"), ("conv-b", "c1"), ("conv-b", "c3")):
        call_sync(engine, "charge", action(scope, call_id), {"order": 7}, charge, {})
    assert len(runs) == 2, "once per conversation"
    call_sync(engine, "charge", action("conv-a", "c4"), {"order": 7}, charge, {"fallback_window": 0})
    assert len(runs) == 3, "no window: a new call id is a new action"


def test_the_model_key_is_added_to_a_tool_and_passed_to_one_declaring_it(engine: Engine) -> None:
    seen: list[str | None] = []

    def declared(ctx: str, order: int, idempotency_key: str | None = None) -> int:
        seen.append(idempotency_key)
        return order

    def plain(ctx: str, order: int) -> int:
        seen.append("plain")
        return order

    def gated(fn: object) -> object:
        return once_per_action(
            engine,
            fn,  # type: ignore[arg-type]
            tool=fn.__name__,  # type: ignore[attr-defined]
            call_id_of=lambda b: b.arguments["ctx"],
            context_of=lambda b: None,
            default_scope=lambda ctx: "conv",
            exclude={"ctx"},
            shield=True,
            policy={},
        )

    d, p = gated(declared), gated(plain)
    assert list(inspect.signature(d).parameters) == ["ctx", "order", "idempotency_key"]  # type: ignore[arg-type]
    assert list(inspect.signature(p).parameters) == ["ctx", "order", "idempotency_key"]  # type: ignore[arg-type]
    assert "idempotency_key" not in inspect.signature(plain).parameters, "the function is untouched"
    assert d("c1", 7, idempotency_key="k1") == 7  # type: ignore[operator]
    assert p("c2", 7, idempotency_key="k1") == 7  # type: ignore[operator]
    replay = p("c3", 7, idempotency_key="k1")  # type: ignore[operator]
    assert "not repeated" in replay and "7" in replay, "the same model key: a replay, told"
    assert seen == ["k1", "plain"]


def test_a_function_under_a_call_id_and_a_window_reads_the_call_ids_downstream_key(
    engine: Engine,
) -> None:
    act = action("conv", "call_1")
    digest = engine.key_for("charge", act.key, {"order": 7})["digest"]  # type: ignore[index]
    out = call_sync(engine, "charge", act, {"order": 7}, current_key, {})
    assert out.result.value == digest

    async def charge() -> str:
        return current_key()

    act = action("conv", "call_2")
    other = {"order": 8}
    out = asyncio.run(call_async(engine, "charge", act, other, charge, {}, True))
    assert out.result.value == engine.key_for("charge", act.key, other)["digest"]  # type: ignore[index]


def test_every_replay_the_model_reads_says_so_by_the_name_the_model_knows(engine: Engine) -> None:
    """A replay under a call id, the model's key or the program's key is told in words, as the
    window's is (they were returned bare: a silent replay), naming the tool as the model calls it
    (``buy``), never by its record (``billing.buy``); a program's key is not the model's to
    repeat, so it is told to ask."""
    runs: list[int] = []

    def buy(ctx: str, item: str) -> str:
        runs.append(1)
        return f"bought {item}"

    def gated(**opts: object) -> Any:
        return once_per_action(
            engine,
            buy,
            tool="billing.buy",
            call_id_of=lambda b: b.arguments["ctx"],
            context_of=lambda b: None,
            default_scope=lambda ctx: "conv",
            exclude={"ctx"},
            shield=True,
            policy={},
            **opts,  # type: ignore[arg-type]
        )

    by_id, by_key = gated(), gated(key=lambda args, ctx: f"order-{args['item']}")
    assert by_id("c1", "book") == "bought book"
    notices = [again := by_id("c1", "book")]
    assert "bought book" in again and "not repeated" in again and "tool-call id" in again, again
    assert "call buy again with the argument idempotency_key" in again, again
    assert by_id("c2", "pen", idempotency_key="k") == "bought pen"
    notices.append(again := by_id("c3", "pen", idempotency_key="k"))
    assert "not repeated" in again and "idempotency_key of an earlier call" in again, again
    assert by_key("c4", "mug") == "bought mug"
    notices.append(again := by_key("c5", "mug"))
    assert "not repeated" in again and "ask the user" in again, again
    assert "idempotency_key" not in again, "the model's key cannot repeat a program's action"
    assert len(runs) == 3
    assert not any("billing.buy" in n for n in notices), notices


def test_the_key_argument_added_to_a_json_schema_is_optional_and_nullable() -> None:
    from integrations.same_action import assert_optional_key

    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    out = with_key_argument(schema)
    assert_optional_key(out)
    assert out["required"] == ["a"] and schema["properties"] == {"a": {"type": "string"}}


def test_a_replan_reworded_outside_the_identity_fields_runs_once_and_says_which_fields(
    engine: Engine,
) -> None:
    """A guardrail's retry rewrites a mail's body under a new call id: with the tool's identity
    fields (``to``, ``subject``) the window takes it for the action it re-plans, and the model
    reads which arguments named it; another recipient is another action."""
    sent: list[str] = []

    def send_mail(ctx: str, to: str, subject: str, body: str) -> str:
        sent.append(body)
        return f"sent to {to}"

    gated = once_per_action(
        engine,
        send_mail,
        tool="send_mail",
        call_id_of=lambda b: b.arguments["ctx"],
        context_of=lambda b: None,
        default_scope=lambda ctx: "conv",
        exclude={"ctx"},
        shield=True,
        policy={"identity": ("to", "subject")},
    )
    assert gated("c1", "ann@x", "Refund", "Hello Ann, it is on its way.") == "sent to ann@x"
    told = gated("c2", "ann@x", "Refund", "Dear Ann, we have refunded you.")
    assert "an action of send_mail with the same to, subject" in told, told
    assert "was not run again" in told and "sent to ann@x" in told, told
    assert gated("c3", "bob@x", "Refund", "Dear Ann, we have refunded you.") == "sent to bob@x"
    assert sent == ["Hello Ann, it is on its way.", "Dear Ann, we have refunded you."]
