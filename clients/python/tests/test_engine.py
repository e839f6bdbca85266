"""The engine in-process (idemgate._native): answers, races, effects, and records shared with the
command line on the same SQLite file."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import idemgate
from conftest import idemgate_bin
from idemgate import (
    Engine,
    Failed,
    IdemgateError,
    InFlight,
    KeyRequired,
    KeyReused,
    MaybeApplied,
    NotApplied,
    OutcomeUnknown,
    Policy,
    StoreUnavailable,
    derive_key,
    idempotent,
    mint_key,
)


def stores() -> list[str]:
    urls = ["memory:", "sqlite"]
    if os.environ.get("IDEMGATE_TEST_POSTGRES_URL"):
        urls.append(os.environ["IDEMGATE_TEST_POSTGRES_URL"])
    if os.environ.get("IDEMGATE_TEST_REDIS_URL"):
        # The shared test Redis runs without persistence, which the store refuses unless told.
        url = os.environ["IDEMGATE_TEST_REDIS_URL"]
        urls.append(url + ("&" if "?" in url else "?") + "allow_volatile=true")
    return urls


@pytest.fixture(params=stores(), ids=lambda u: u.split(":")[0])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    url = request.param
    if url == "sqlite":
        url = f"sqlite://{tmp_path / 'idem.db'}"
    # Every test uses fresh keys, so the shared Postgres and Redis need no cleaning; a short TTL
    # lets their records expire soon (Redis drops them itself).
    return Engine.open(
        url, tenant="py-tests", journal=str(tmp_path / "journal"), default=Policy(ttl=300)
    )


@pytest.fixture
def sqlite(tmp_path: Path) -> tuple[Engine, str]:
    url = f"sqlite://{tmp_path / 'idem.db'}"
    return Engine.open(url, tenant="local"), url


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def bump(self) -> int:
        with self.lock:
            self.n += 1
            return self.n


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(idemgate_bin()), *args], capture_output=True, text=True, check=check)


# ---- answers ---------------------------------------------------------------------------------


def test_fresh_then_replay(engine: Engine) -> None:
    runs = Counter()
    key = mint_key()
    first = engine.call("send_invoice", key, {"invoice": 7}, lambda: {"sent": runs.bump()})
    assert first.executed and not first.replayed
    assert first.value == {"sent": 1}
    assert first.verdict == "executed" and first.rule == "explicit" and first.key == key
    assert first.content == "json" and first.recording == "stored"
    assert first.executed_at is not None and first.executed_at.tzinfo is not None

    again = engine.call("send_invoice", key, {"invoice": 7}, lambda: {"sent": runs.bump()})
    assert again.replayed and not again.executed
    assert again.value == {"sent": 1}
    assert again.executed_at == first.executed_at
    assert runs.n == 1


def test_decorator_on_plain_functions(engine: Engine) -> None:
    runs = Counter()

    @idempotent(engine, key=lambda order, call_id: call_id, args=lambda order, call_id: order)
    def charge(order: dict[str, Any], call_id: str) -> dict[str, Any]:
        """Charges an order."""
        return {"charged": order["amount"], "n": runs.bump()}

    call_id = mint_key()
    assert charge({"amount": 5}, call_id) == {"charged": 5, "n": 1}
    assert charge({"amount": 5}, call_id) == {"charged": 5, "n": 1}
    assert runs.n == 1
    assert charge.__doc__ == "Charges an order."
    with pytest.raises(KeyReused) as e:
        charge({"amount": 6}, call_id)
    assert e.value.status == 422 and isinstance(e.value, IdemgateError)
    assert runs.n == 1


def test_big_integers_and_unicode_survive(engine: Engine) -> None:
    key = mint_key()
    value = {"id": 2**70 + 1, "name": "ünïcødé 🙂"}
    engine.call("t", key, {"n": 2**80}, lambda: value)
    assert engine.call("t", key, {"n": 2**80}, lambda: None).value == value
    with pytest.raises(KeyReused):
        engine.call("t", key, {"n": 2**80 + 1}, lambda: None)


def test_key_required_and_the_fallback_window(engine: Engine) -> None:
    with pytest.raises(KeyRequired) as e:
        engine.call("needs_key", None, {"a": 1}, lambda: 1)
    assert e.value.status == 400
    runs = Counter()
    args = {"to": mint_key()}
    first = engine.call("mail", None, args, runs.bump, fallback_window=60)
    second = engine.call("mail", None, args, runs.bump, fallback_window=60)
    assert first.rule == second.rule == "fallback"
    assert second.replayed and second.value == 1 and runs.n == 1


def test_identity_fields_make_a_reworded_replan_the_same_action(engine: Engine) -> None:
    runs = Counter()
    to = mint_key()
    window = {"scope": "conv-a", "fallback_window": 60, "identity": ("to", "/subject")}
    first = engine.call("mail", None, {"to": to, "subject": "Refund", "body": "Hello Ann."}, runs.bump, **window)
    # A guardrail's retry rewrites the body: the same recipient and subject, the same action.
    replan = engine.call("mail", None, {"body": "Dear Ann, refunded.", "subject": "Refund", "to": to}, runs.bump, **window)
    assert first.executed and replan.replayed and replan.rule == "fallback" and runs.n == 1
    other = engine.call("mail", None, {"to": mint_key(), "subject": "Refund", "body": "Hello Ann."}, runs.bump, **window)
    assert other.executed and runs.n == 2
    # Without the subject, all the arguments name the call.
    alone = engine.call("mail", None, {"to": to, "body": "Hello Ann."}, runs.bump, **window)
    assert alone.executed and runs.n == 3
    assert Policy(identity=["to"]).identity == ["to"]
    with pytest.raises(ValueError, match="identity"):
        Policy(identity=[""])


def test_observe_mode_runs_every_call_and_the_record_tells_what_enforce_would_have_done(
    engine: Engine,
) -> None:
    runs = Counter()
    key = mint_key()
    first = engine.call("charge", key, {"amount": 5}, runs.bump, mode="observe")
    again = engine.call("charge", key, {"amount": 5}, runs.bump, mode="observe")
    reused = engine.call("charge", key, {"amount": 6}, runs.bump, mode="observe")
    # Nothing suppressed: each call ran and got its own value.
    assert first.executed and first.value == 1
    assert again.executed and not again.replayed and again.verdict == "pass_through"
    assert again.value == 2 and reused.value == 3 and runs.n == 3
    assert first.observed is None and again.observed == "replayed"
    assert reused.observed == "key_reused"
    # A write without a key runs too (enforce would raise KeyRequired).
    assert engine.call("charge", None, {"amount": 7}, runs.bump, mode="observe").value == 4
    record = engine.record("charge", key)
    assert record is not None and record["state"] == "completed" and record["fence"] == 1
    observed = [s for s in record["history"] if s["what"] == "observed"]
    assert [s["reason"].split("enforce mode would have ")[1].split(" ")[0] for s in observed] == [
        "replayed",
        "refused",
    ], observed
    # The function of an observed call sees its record's downstream key, as a run does.
    named = engine.key_for("charge", key, {"amount": 5})
    assert named is not None
    seen = engine.call("charge", key, {"amount": 5}, idemgate.current_key, mode="observe")
    assert seen.observed == "replayed" and seen.value == named["digest"]
    # One word to enforce: the record observe mode kept is replayed.
    enforced = engine.call("charge", key, {"amount": 5}, runs.bump)
    assert enforced.replayed and enforced.value == 1 and runs.n == 4
    assert Policy(mode="observe").mode == "observe" and Policy().mode == "enforce"
    with pytest.raises(ValueError, match="mode"):
        Policy(mode="shadow")  # type: ignore[arg-type]


def test_observe_mode_observes_a_call_id_duplicate_once_with_the_window_inside_it(
    engine: Engine,
) -> None:
    # An integration's shape: the call id's record, and inside its function the window's record
    # of the same tool. Its duplicate is one observation, on the call id's record; a call of
    # another tool inside the function is observed on its own.
    runs = Counter()
    call_id, audit_key = mint_key(), mint_key()
    observe: dict[str, Any] = {"mode": "observe"}

    def windowed() -> Any:
        engine.call("audit", audit_key, {"n": 1}, lambda: "noted", **observe)
        inner = engine.call(
            "mail", None, {"to": "ann"}, runs.bump, scope=call_id, fallback_window=60, **observe
        )
        return inner.value

    first = engine.call("mail", call_id, {"to": "ann"}, windowed, scope=call_id, **observe)
    again = engine.call("mail", call_id, {"to": "ann"}, windowed, scope=call_id, **observe)
    assert first.executed and first.observed is None
    assert again.observed == "replayed" and runs.n == 2
    outer = engine.record("mail", call_id)
    assert outer is not None
    assert [s["what"] for s in outer["history"]].count("observed") == 1, outer["history"]
    window = engine.key_for("mail", None, {"to": "ann"}, scope=call_id, fallback_window=60)
    assert window is not None
    inner = engine.record("mail", window["key"])
    assert inner is not None
    assert [s["what"] for s in inner["history"]].count("observed") == 0, inner["history"]
    audit = engine.record("audit", audit_key)
    assert audit is not None
    assert [s["what"] for s in audit["history"]].count("observed") == 1, audit["history"]


def test_a_fallback_window_joins_identical_calls_of_one_scope_only(engine: Engine) -> None:
    runs = Counter()
    args = {"to": mint_key()}
    first = engine.call("mail", None, args, runs.bump, scope="conv-a", fallback_window=60)
    again = engine.call("mail", None, args, runs.bump, scope="conv-a", fallback_window=60)
    other = engine.call("mail", None, args, runs.bump, scope="conv-b", fallback_window=60)
    assert first.executed and again.replayed and again.value == 1
    assert other.executed and other.value == 2 and runs.n == 2
    assert first.key != other.key
    named = engine.key_for("mail", None, args, scope="conv-b", fallback_window=60)
    assert named is not None and named["key"] == other.key
    # A key is not scoped: it names the action everywhere.
    key = mint_key()
    engine.call("mail", key, args, runs.bump, scope="conv-a")
    assert engine.call("mail", key, args, runs.bump, scope="conv-b").replayed and runs.n == 3


def test_an_operator_lists_unknown_records_and_resolves_them(engine: Engine) -> None:
    tool = f"charge-{mint_key()[4:16]}"  # a tool of its own: the shared stores hold others
    done, gone = mint_key(), mint_key()

    def maybe() -> None:
        raise MaybeApplied("the provider timed out after sending")

    for key in (done, gone):
        with pytest.raises(MaybeApplied):
            engine.call(tool, key, {"order": 7}, maybe)
    unknown = engine.records(state="unknown", tool=tool)
    assert sorted(r["key"]["key"] for r in unknown) == sorted([done, gone])
    # Each says why, from the store: the reason the call gave, and the key to search for.
    assert {r["reason"] for r in unknown} == {"MaybeApplied: the provider timed out after sending"}
    assert all(len(r["downstream_key"]) == 64 for r in unknown)
    assert [s["what"] for s in unknown[0]["history"]] == ["reserved", "became_unknown"]
    assert engine.records(state="completed", tool=tool) == []
    fences = {r["key"]["key"]: r["fence"] for r in unknown}
    with pytest.raises(idemgate.NotResolvable):
        engine.resolve(tool, done, fence=fences[done] + 1, resolution="release")
    after = engine.resolve(
        tool,
        done,
        fence=fences[done],
        resolution="completed",
        result={"charge_id": "ch_7"},
        by="ops:ann",
        reason="the provider's dashboard shows ch_7",
    )
    assert after is not None and after["state"] == "completed"
    resolved = next(s for s in after["history"] if s["what"] == "resolved_completed")
    assert resolved["by"] == "ops:ann"
    assert resolved["reason"] == "the provider's dashboard shows ch_7"
    assert engine.resolve(tool, gone, fence=fences[gone], resolution="release") is None
    runs = Counter()
    replay = engine.call(tool, done, {"order": 7}, runs.bump)
    assert replay.replayed and replay.value == {"charge_id": "ch_7"} and runs.n == 0
    ran = engine.call(tool, gone, {"order": 7}, runs.bump)
    assert ran.executed and runs.n == 1, "released: it did not happen, so it runs"
    assert len(engine.records(tool=tool)) == 2 and len(engine.records(tool=tool, limit=1)) == 1
    with pytest.raises(idemgate.NotFound):
        engine.resolve(tool, mint_key(), fence=1, resolution="release")
    with pytest.raises(ValueError):
        engine.records(state="lost")


def test_an_operator_reopens_a_completed_action_so_it_runs_again(engine: Engine) -> None:
    tool = f"refund-{mint_key()[4:16]}"
    key, args, runs = mint_key(), {"order": 9}, Counter()
    assert engine.call(tool, key, args, runs.bump).executed
    record = engine.record(tool, key)
    assert record is not None and record["state"] == "completed"
    with pytest.raises(idemgate.NotResolvable):
        engine.reopen(tool, key, record["fence"] + 1, reason="a stale look")
    assert engine.call(tool, key, args, runs.bump).replayed and runs.n == 1
    assert engine.reopen(tool, key, record["fence"], reason="the charge was refunded") == "completed"
    again = engine.call(tool, key, args, runs.bump)
    assert again.executed and runs.n == 2, "reopened: the next call runs the action again"
    # A retried reopen with the fence looked at first never touches the new outcome.
    with pytest.raises(idemgate.NotResolvable):
        engine.reopen(tool, key, record["fence"], reason="the same click, twice")
    assert engine.call(tool, key, args, runs.bump).replayed and runs.n == 2
    with pytest.raises(idemgate.NotFound):
        engine.reopen(tool, mint_key(), 1, reason="nothing there")


def test_a_call_in_flight_is_never_reopened(engine: Engine) -> None:
    tool, key = f"mail-{mint_key()[4:16]}", mint_key()
    started, release = threading.Event(), threading.Event()

    def send() -> int:
        started.set()
        assert release.wait(30)
        return 1

    holder = threading.Thread(target=lambda: engine.call(tool, key, None, send))
    holder.start()
    try:
        assert started.wait(30)
        record = engine.record(tool, key)
        assert record is not None and record["state"] == "in_flight"
        with pytest.raises(idemgate.NotResolvable) as refused:
            engine.reopen(tool, key, record["fence"], reason="impatient")
        assert "twice" in str(refused.value), str(refused.value)
    finally:
        release.set()
        holder.join()


def test_records_are_found_by_the_conversation_they_were_made_in(engine: Engine) -> None:
    tool, runs = f"note-{mint_key()[4:16]}", Counter()
    scope_a, scope_b = f"conv-{mint_key()}", f"conv-{mint_key()}"
    engine.call(tool, None, {"n": 1}, runs.bump, scope=scope_a, fallback_window=60)
    engine.call(tool, None, {"n": 2}, runs.bump, scope=scope_a, fallback_window=60)
    engine.call(tool, mint_key(), {"n": 3}, runs.bump, scope=scope_b)
    in_a = engine.records(tool=tool, scope=scope_a)
    assert len(in_a) == 2 and all(r["scope"] == scope_a for r in in_a), in_a
    assert [r["scope"] for r in engine.records(tool=tool, scope=scope_b)] == [scope_b]
    assert engine.records(tool=tool, scope=f"conv-{mint_key()}") == []


def test_the_function_reads_its_downstream_key(engine: Engine) -> None:
    key, args = mint_key(), {"order": 7}
    digest = engine.key_for("charge", key, args)["digest"]  # type: ignore[index]
    assert engine.call("charge", key, args, idemgate.current_key).value == digest

    async def charge() -> str:
        await asyncio.sleep(0)  # still known after a suspension
        return idemgate.current_key()

    other = mint_key()
    r = asyncio.run(engine.acall("charge", other, args, charge))
    assert r.value == engine.key_for("charge", other, args)["digest"]  # type: ignore[index]
    with pytest.raises(LookupError):
        idemgate.current_key()
    with pytest.raises(LookupError):  # a read has no record
        engine.call("lookup", None, args, idemgate.current_key, kind="read")


def test_a_decorated_functions_result_tells_a_replay_from_a_run(engine: Engine) -> None:
    runs = Counter()

    @idempotent(engine, key=lambda order, call_id: call_id)
    def charge(order: int, call_id: str) -> int:
        return runs.bump()

    @idempotent(engine, key=lambda order, call_id: call_id)
    async def refund(order: int, call_id: str) -> int:
        return runs.bump()

    key = mint_key()
    first, again = charge.result(7, key), charge.result(7, key)
    assert first.executed and not first.replayed and first.value == 1
    assert again.replayed and again.value == 1 and again.executed_at == first.executed_at
    assert charge(7, key) == 1, "the plain call returns the value, as before"
    other = mint_key()
    r = asyncio.run(refund.result(7, other))
    assert r.executed and r.value == 2
    assert asyncio.run(refund.result(7, other)).replayed
    assert asyncio.run(refund(7, other)) == 2 and runs.n == 2


def test_the_decorators_replay_is_the_stored_value_and_its_answer_still_says_replayed(
    engine: Engine,
) -> None:
    runs = Counter()

    @idempotent(engine, key=lambda call_id: call_id)
    def nothing(call_id: str) -> None:
        runs.bump()
        return None  # a stored `null`: a replay's value, never taken for a pass-through

    @idempotent(engine, key=lambda call_id: call_id)
    def decline(call_id: str) -> None:
        runs.bump()
        raise Failed({"code": 7})

    key = mint_key()
    assert nothing(key) is None and nothing(key) is None and runs.n == 1
    r = nothing.result(key)
    assert r.replayed and not r.executed and r.value is None and r.verdict == "replayed"
    other = mint_key()
    with pytest.raises(Failed) as first:
        decline(other)
    assert not first.value.replayed
    with pytest.raises(Failed) as again:
        decline(other)
    assert again.value.replayed and again.value.result == {"code": 7} and runs.n == 2


def test_the_async_decorators_replay_is_the_stored_value_and_reads_pass_through(
    engine: Engine,
) -> None:
    runs = Counter()

    @idempotent(engine, key=lambda call_id: call_id)
    async def nothing(call_id: str) -> None:
        runs.bump()
        return None

    @idempotent(engine, key=lambda call_id: call_id)
    async def decline(call_id: str) -> None:
        runs.bump()
        raise Failed({"code": 7})

    @idempotent(engine, key=lambda: None, kind="read")
    async def look() -> int:
        return runs.bump()

    async def main() -> None:
        key = mint_key()
        assert await nothing(key) is None and await nothing(key) is None and runs.n == 1
        r = await nothing.result(key)
        assert r.replayed and r.value is None
        other = mint_key()
        with pytest.raises(Failed) as first:
            await decline(other)
        assert not first.value.replayed
        with pytest.raises(Failed) as again:
            await decline(other)
        assert again.value.replayed and again.value.result == {"code": 7} and runs.n == 2
        assert await look() == 3 and await look() == 4

    asyncio.run(main())


def test_async_quiet_halves_answer_none_or_the_value(engine: Engine) -> None:
    native, policy = engine.native, engine.policy("t")

    async def main() -> None:
        key = mint_key()
        ticket = await engine._future(
            lambda done: native.begin_async("t", key, [1], policy, done, value=True)
        )
        assert isinstance(ticket, idemgate._native.Ticket)
        recorded = await engine._future(
            lambda done: native.finish_async(ticket, "success", '"v"', done, quiet=True)
        )
        assert recorded is None
        replayed = await engine._future(
            lambda done: native.begin_async("t", key, [1], policy, done, value=True)
        )
        assert replayed == "v"

    asyncio.run(main())


def test_begin_for_a_value_answers_a_ticket_a_pass_through_or_the_stored_value(engine: Engine) -> None:
    native, policy = engine.native, engine.policy("t")
    key = mint_key()
    ticket = native.begin("t", key, {"a": 1}, policy, value=True)
    assert isinstance(ticket, idemgate._native.Ticket)
    assert native.finish(ticket, "success", '{"v":[1,2]}', quiet=True) is None
    assert native.begin("t", key, {"a": 1}, policy, value=True) == {"v": [1, 2]}
    read = engine.policy("t", kind="read")
    assert native.begin("t", key, {"a": 1}, read, value=True) is idemgate._native.PASSED_THROUGH
    with pytest.raises(KeyReused):
        native.begin("t", key, {"a": 2}, policy, value=True)


def test_a_quiet_finish_raises_what_finish_raises(engine: Engine) -> None:
    native, policy = engine.native, engine.policy("t")
    key = mint_key()
    ticket = native.begin("t", key, None, policy, value=True)
    with pytest.raises(ValueError, match="not JSON"):
        native.finish(ticket, "success", "not json", quiet=True)
    with pytest.raises(OutcomeUnknown):  # the answer of a record made unknown, as from `finish`
        native.finish(ticket, "ambiguous", "it timed out", quiet=True)
    with pytest.raises(RuntimeError, match="already finished"):
        native.finish(ticket, "success", "1", quiet=True)
    freed = native.begin("t", mint_key(), None, policy, value=True)
    with pytest.raises(NotApplied):  # the answer of a released key, as `finish` raises it
        native.finish(freed, "not_applied", "nothing was sent", quiet=True)


def test_a_decorated_read_runs_every_time(engine: Engine) -> None:
    runs = Counter()

    @idempotent(engine, key=lambda: None, kind="read")
    def look() -> None:
        runs.bump()

    assert look() is None and look() is None and runs.n == 2


def test_the_decorator_sees_a_policy_changed_after_it_was_applied(engine: Engine) -> None:
    runs = Counter()

    @idempotent(engine, tool="later", key=lambda call_id: call_id)
    def act(call_id: str) -> int:
        return runs.bump()

    key = mint_key()
    assert act(key) == 1 and act(key) == 1
    engine.tools["later"] = Policy(kind="read")
    assert act(key) == 2 and act(key) == 3
    del engine.tools["later"]
    assert act(key) == 1


def test_a_decorated_function_may_take_any_keyword(engine: Engine) -> None:
    # The decorator's own helpers take their arguments by position: a function's keywords are its.
    @idempotent(engine, key=lambda **kw: kw["key"])
    def odd(*, tool: str, fn: str, begun: str, quiet: str, key: str, self: str) -> str:
        return tool + fn + begun + quiet + self

    kw = {"tool": "a", "fn": "b", "begun": "c", "quiet": "d", "key": mint_key(), "self": "e"}
    assert odd(**kw) == "abcde" and odd(**kw) == "abcde"


def test_the_threads_json_encoder_survives_a_failure_and_is_never_shared() -> None:
    from idemgate.engine import _json_text

    with pytest.raises(ValueError, match="Circular"):
        _json_text(cycle())
    held = [1, object()]
    with pytest.raises(TypeError):
        _json_text(held)  # fails inside `held`: a kept encoder would still have it marked
    held[1] = 2
    assert _json_text({"a": held, "b": held}) == '{"a": [1, 2], "b": [1, 2]}'
    shared = [1, 2]
    big = {"items": [shared] * 2000}
    texts: list[str] = []

    def write() -> None:
        for _ in range(20):
            texts.append(_json_text(big))

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert texts == [json.dumps(big)] * 160


@pytest.mark.parametrize("store", ["memory:", "sqlite"])
def test_a_verifier_decides_what_an_unknown_record_becomes(tmp_path: Path, store: str) -> None:
    provider: dict[str, dict[str, str]] = {}  # the payments the provider holds, by their key
    asked: list[tuple[str, str]] = []

    def verify(tool: str, key: str, downstream: str) -> dict[str, str]:
        asked.append((tool, key))
        if downstream in provider:
            return provider[downstream]  # it happened: this is its result
        if key.startswith("gone"):
            raise NotApplied("the provider has no such payment")
        raise MaybeApplied("the provider cannot be asked now")

    url = f"sqlite://{tmp_path / 'idem.db'}" if store == "sqlite" else store
    engine = Engine.open(
        url,
        journal=str(tmp_path / "journal"),
        tools={"charge": Policy(on_unknown="verify")},
        verifiers={"charge": verify},
    )
    args = {"order": 7}

    def sent() -> None:
        provider[idemgate.current_key()] = {"charge_id": "ch_7"}  # the charge went through,
        raise MaybeApplied("the connection dropped before the answer")  # but nobody heard it

    def lost() -> None:
        raise MaybeApplied("the connection dropped: sent or not?")

    done, gone, dark = f"done-{mint_key()}", f"gone-{mint_key()}", f"dark-{mint_key()}"
    for key, fn in ((done, sent), (gone, lost), (dark, lost)):
        with pytest.raises(MaybeApplied):
            engine.call("charge", key, args, fn)
    ran: list[str] = []

    def again(key: str) -> Any:
        # Each first sight of an unknown record waits the engine's settle window (2 s): the
        # three in parallel wait it once.
        try:
            return engine.call("charge", key, args, lambda: ran.append(key) or "ran")
        except OutcomeUnknown as e:
            return e

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        verified, rerun, unknown = pool.map(again, (done, gone, dark))
    assert verified.replayed and verified.value == {"charge_id": "ch_7"}
    assert rerun.executed and rerun.value == "ran" and ran == [gone], "it did not happen: it ran"
    assert isinstance(unknown, OutcomeUnknown), "still cannot tell: not run"
    assert sorted(k for _, k in asked) == sorted([done, gone, dark])
    assert engine.call("charge", done, args, lambda: "x").replayed, "stored: not asked again"
    assert len(asked) == 3


def test_reads_pass_through(engine: Engine) -> None:
    runs = Counter()
    for _ in range(3):
        r = engine.call("lookup", None, {"q": 1}, runs.bump, kind="read")
        assert r.verdict == "pass_through" and r.executed
    assert runs.n == 3


# ---- effects ---------------------------------------------------------------------------------


def test_not_applied_frees_the_key(engine: Engine) -> None:
    runs = Counter()
    key = mint_key()

    def refuse() -> None:
        runs.bump()
        raise NotApplied("mail server refused the connection")

    with pytest.raises(NotApplied):
        engine.call("mail", key, None, refuse)
    r = engine.call("mail", key, None, lambda: runs.bump())
    assert r.executed and r.value == 2


def test_failed_is_stored_and_replayed(engine: Engine) -> None:
    runs = Counter()
    key = mint_key()

    def decline() -> None:
        runs.bump()
        raise Failed({"error": "card declined"})

    with pytest.raises(Failed) as first:
        engine.call("charge", key, None, decline)
    assert not first.value.replayed
    with pytest.raises(Failed) as again:
        engine.call("charge", key, None, decline)
    assert again.value.replayed and again.value.result == {"error": "card declined"}
    assert runs.n == 1


@pytest.mark.parametrize("exc", [MaybeApplied("timed out after sending"), ValueError("boom")])
def test_maybe_applied_and_other_exceptions_leave_unknown(engine: Engine, exc: Exception) -> None:
    runs = Counter()
    key = mint_key()

    def send() -> None:
        runs.bump()
        raise exc

    with pytest.raises(type(exc)):
        engine.call("send", key, None, send)
    with pytest.raises(OutcomeUnknown) as e:
        engine.call("send", key, None, send)
    assert runs.n == 1
    assert e.value.fence == 1 and e.value.since is not None and e.value.status == 409
    record = engine.record("send", key)
    assert record is not None and record["state"] == "unknown"


def test_unserializable_results_leave_unknown(engine: Engine) -> None:
    key = mint_key()
    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        engine.call("t", key, None, lambda: object())
    with pytest.raises(OutcomeUnknown):
        engine.call("t", key, None, lambda: 1)


def nested(depth: int) -> list[Any]:
    """``[[[...]]]``, ``depth`` lists deep."""
    outer: list[Any] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


def cycle() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


# Return values JSON cannot hold: the encoder raises TypeError, ValueError (NaN and the infinities,
# which `json.dumps` writes by default but no JSON reader takes, the engine's included; a cycle)
# or RecursionError (nesting deeper than the interpreter's limit).
NOT_JSON: dict[str, Any] = {
    "object": object,
    "nan": lambda: float("nan"),
    "inf": lambda: float("inf"),
    "nested -inf": lambda: {"total": [1.5, float("-inf")]},
    "cycle": cycle,
    "too deep": lambda: nested(5000),
}


@pytest.mark.parametrize("make", NOT_JSON.values(), ids=NOT_JSON.keys())
def test_a_result_json_cannot_hold_makes_the_record_unknown_at_once(
    engine: Engine, make: Any
) -> None:
    # The function ran, so its record must say unknown now: not stay in flight for the lease (a
    # retry waited out its `wait` and got InFlight), and not be released (a retry would run again).
    runs = Counter()
    key = mint_key()

    @idempotent(engine, tool="nj", key=lambda: key, wait=0)
    def compute() -> Any:
        runs.bump()
        return make()

    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        compute()
    record = engine.record("nj", key)
    assert record is not None and record["state"] == "unknown", record
    assert runs.n == 1


def test_a_nan_result_is_never_run_again(engine: Engine) -> None:
    runs = Counter()
    key = mint_key()

    def measure() -> float:
        runs.bump()
        return float("nan")

    with pytest.raises(TypeError, match="cannot be stored as JSON") as e:
        engine.call("nan", key, None, measure, wait=0)
    assert isinstance(e.value.__cause__, ValueError)  # what json said: NaN is not JSON
    # The first sight of an unknown record watches it for the settle window (2 s), then answers.
    with pytest.raises(OutcomeUnknown):
        engine.call("nan", key, None, measure, wait=0)
    assert runs.n == 1


def test_a_failure_whose_result_is_not_json_is_stored_as_its_repr(engine: Engine) -> None:
    key = mint_key()

    def overflow() -> None:
        raise Failed({"ratio": float("inf")})

    with pytest.raises(Failed) as first:
        engine.call("f", key, None, overflow, wait=0)
    assert not first.value.replayed and not getattr(first.value, "__notes__", None)
    record = engine.record("f", key)
    assert record is not None and record["state"] == "completed", record
    with pytest.raises(Failed) as again:
        engine.call("f", key, None, overflow, wait=0)
    assert again.value.replayed and again.value.result == "{'ratio': inf}"


def test_text_the_engine_cannot_read_makes_the_record_unknown(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever the encoder lets through that the engine does not read as JSON ends the same way.
    monkeypatch.setattr(idemgate.engine, "_json_text", lambda value: "NaN")
    key = mint_key()
    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        engine.call("raw", key, None, lambda: 1.0, wait=0)
    record = engine.record("raw", key)
    assert record is not None and record["state"] == "unknown", record

    other = mint_key()

    def decline() -> None:
        raise Failed(1.0)

    with pytest.raises(Failed) as e:
        engine.call("raw", other, None, decline, wait=0)
    assert "recording this outcome failed too" in "".join(getattr(e.value, "__notes__", []))
    record = engine.record("raw", other)
    assert record is not None and record["state"] == "unknown", record


@pytest.mark.parametrize("make", NOT_JSON.values(), ids=NOT_JSON.keys())
def test_async_a_result_json_cannot_hold_makes_the_record_unknown_at_once(
    engine: Engine, make: Any
) -> None:
    runs = Counter()
    key = mint_key()

    @idempotent(engine, tool="anj", key=lambda: key, wait=0)
    async def compute() -> Any:
        runs.bump()
        return make()

    async def main() -> None:
        with pytest.raises(TypeError, match="cannot be stored as JSON"):
            await compute()
        # Answered after the record was marked, not while the mark is still on its way.
        record = engine.record("anj", key)
        assert record is not None and record["state"] == "unknown", record

        other = mint_key()
        with pytest.raises(TypeError, match="cannot be stored as JSON"):
            await engine.acall("anj", other, None, lambda: make(), wait=0)
        record = engine.record("anj", other)
        assert record is not None and record["state"] == "unknown", record

    asyncio.run(main())
    assert runs.n == 1


def test_async_text_the_engine_cannot_read_makes_the_record_unknown(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idemgate.engine, "_json_text", lambda value: "NaN")

    async def decline() -> None:
        raise Failed(1.0)

    async def main() -> None:
        key = mint_key()
        with pytest.raises(TypeError, match="cannot be stored as JSON"):
            await engine.acall("araw", key, None, lambda: asyncio.sleep(0, result=1.0), wait=0)
        record = engine.record("araw", key)
        assert record is not None and record["state"] == "unknown", record

        other = mint_key()
        with pytest.raises(Failed):
            await engine.acall("araw", other, None, decline, wait=0)
        record = engine.record("araw", other)
        assert record is not None and record["state"] == "unknown", record

    asyncio.run(main())


def test_the_readmes_engine_call_returns_json(engine: Engine) -> None:
    # The README's `engine.call(...)` line, run as written against a mailer whose `send` returns a
    # receipt object, as mail clients do: the example must store something JSON can hold.
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith('r = engine.call("send_invoice"'))

    class Receipt:
        def __init__(self, id: str) -> None:
            self.id = id

    class Mailer:
        def __init__(self) -> None:
            self.sent: list[Any] = []

        def send(self, invoice: Any) -> Receipt:
            self.sent.append(invoice)
            return Receipt(f"msg-{len(self.sent)}")

    mailer = Mailer()
    scope = {"engine": engine, "call_id": mint_key(), "invoice": {"n": 7}, "mailer": mailer}
    exec(line, scope)  # noqa: S102 - the documentation's own line
    r = scope["r"]
    assert r.executed and r.value == "msg-1", r
    exec(line, scope)  # noqa: S102
    assert scope["r"].replayed and scope["r"].value == "msg-1"
    assert len(mailer.sent) == 1


def test_the_first_sight_of_an_unknown_record_waits_the_settle_window() -> None:
    # Documented in the README and on OutcomeUnknown: the engine watches a record it first finds
    # unknown for 2 s (Settings::unknown_settle) before answering. A lower bound only: the
    # engine's clock guarantees it, however loaded the machine.
    engine = Engine.open("memory:")
    key = mint_key()

    def lost() -> None:
        raise MaybeApplied("the connection dropped after sending")

    with pytest.raises(MaybeApplied):
        engine.call("settle", key, None, lost)
    start = time.monotonic()
    with pytest.raises(OutcomeUnknown):
        engine.call("settle", key, None, lost)
    assert time.monotonic() - start >= 1.9


# ---- races -----------------------------------------------------------------------------------


def test_sixteen_threads_one_execution(engine: Engine) -> None:
    runs = Counter()
    key = mint_key()
    barrier = threading.Barrier(16)
    results: list[Any] = []
    errors: list[BaseException] = []

    def slow() -> int:
        time.sleep(0.3)  # the GIL is free meanwhile: the others wait in the engine
        return runs.bump()

    def racer() -> None:
        barrier.wait()
        try:
            results.append(engine.call("storm", key, {"k": 1}, slow, wait=20))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=racer) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert runs.n == 1
    assert [r.value for r in results] == [1] * 16
    assert sum(r.executed for r in results) == 1
    assert sum(r.replayed for r in results) == 15


def test_a_duplicate_past_its_wait_gets_in_flight(engine: Engine) -> None:
    key = mint_key()
    started = threading.Event()
    release = threading.Event()

    def hold() -> int:
        started.set()
        release.wait(10)
        return 1

    holder = threading.Thread(target=lambda: engine.call("hold", key, None, hold))
    holder.start()
    try:
        started.wait(10)
        with pytest.raises(InFlight) as e:
            engine.call("hold", key, None, lambda: 2, wait=0.1)
        assert e.value.status == 409 and e.value.retry_after is not None
    finally:
        release.set()
        holder.join()
    assert engine.call("hold", key, None, lambda: 3).value == 1


def test_async_racing_tasks_one_execution(engine: Engine) -> None:
    runs = Counter()
    key = mint_key()

    @idempotent(engine, tool="astorm", key=lambda k: k, wait=20)
    async def work(k: str) -> int:
        await asyncio.sleep(0.2)
        return runs.bump()

    async def main() -> list[int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        values = await asyncio.gather(*[work(key) for _ in range(16)])
        t.cancel()
        # The loop kept running while the duplicates waited for the store.
        assert ticks >= 5
        return values

    assert asyncio.run(main()) == [1] * 16
    assert runs.n == 1


def test_async_effects(engine: Engine) -> None:
    async def main() -> None:
        key = mint_key()

        async def refuse() -> None:
            raise NotApplied("not now")

        with pytest.raises(NotApplied):
            await engine.acall("a", key, None, refuse)
        r = await engine.acall("a", key, None, lambda: asyncio.sleep(0, result=7))
        assert r.executed and r.value == 7
        r = await engine.acall("a", key, None, lambda: asyncio.sleep(0, result=8))
        assert r.replayed and r.value == 7

        other = mint_key()

        async def unsure() -> None:
            raise MaybeApplied("dropped connection")

        with pytest.raises(MaybeApplied):
            await engine.acall("a", other, None, unsure)
        with pytest.raises(OutcomeUnknown):
            await engine.acall("a", other, None, unsure)

    asyncio.run(main())


# ---- keys, identical to Rust -----------------------------------------------------------------


def test_keys_are_the_rust_keys(engine: Engine) -> None:
    # Known outputs of IdempotencyKey::derive (also checked against the binary in test_keys).
    assert derive_key("R", "S") == "run-9787c107d6edb2fa3bc04eb8cf63f933"
    assert mint_key().startswith("key-") and len(mint_key()) == 36

    named = engine.key_for("mail", None, {"b": 1, "a": [1, 2.5]}, fallback_window=60)
    assert named is not None
    canonical = b'{"a":[1,2.5],"b":1}'
    assert named["key"] == "fallback-" + hashlib.sha256(canonical).hexdigest()
    assert named["rule"] == "fallback" and named["ttl"] == 60

    explicit = engine.key_for("mail", "order-1", None)
    assert explicit is not None and explicit["rule"] == "explicit"
    assert explicit["ttl"] == engine.default.ttl
    digest = hashlib.sha256()
    for part in (engine.tenant, "mail", "order-1"):
        digest.update(len(part).to_bytes(8, "big") + part.encode())
    assert explicit["digest"] == digest.hexdigest()  # Key::digest
    assert engine.key_for("lookup", None, None, kind="read") is None
    with pytest.raises(KeyRequired):
        engine.key_for("mail", None, None)
    with pytest.raises(idemgate.BadRequest):
        engine.key_for("mail", "fallback-mine", None)  # reserved for the engine's own keys


def test_policies() -> None:
    p = Policy(kind="natural_idempotent", ttl=60, lease=2, wait=0.5, fallback_window=10)
    assert (p.kind, p.ttl, p.lease, p.wait, p.fallback_window, p.on_unknown) == (
        "natural_idempotent", 60, 2, 0.5, 10, "block"
    )
    with pytest.raises(ValueError):
        Policy(kind="delete")
    with pytest.raises(ValueError):
        Policy(ttl=-1)
    engine = Engine.open("memory:", tools={"charge": {"lease": 3}})
    assert engine.policy("charge").lease == 3
    assert engine.policy("other").lease == 30
    assert engine.policy("charge", wait=1).lease == 3


def test_store_unavailable_at_open() -> None:
    # Nothing listens on port 1: a store out of reach, which a retry may find back.
    with pytest.raises(StoreUnavailable) as e:
        Engine.open("redis://:secret@127.0.0.1:1/0")
    assert "secret" not in str(e.value)
    with pytest.raises(StoreUnavailable) as e:
        Engine.open("postgres://u:secret@127.0.0.1:1/db")
    assert "secret" not in str(e.value) and "u:***@127.0.0.1:1" in str(e.value)


@pytest.mark.parametrize(
    "url",
    [
        "sqlit:///{tmp}/x.db",  # a typo'd scheme
        "mongodb://nowhere",  # a store this build does not have
        "{tmp}/x.db",  # a path, not a URL
        "sqlite://{tmp}/no/such/dir/x.db",  # a directory that does not exist
        "sqlite://{tmp}/x.db?durabilty=normal",  # a misspelt option
        "memory:x",
        "postgres://u:secret@127.0.0.1:notaport/db",  # a URL its store cannot read
        "postgress://u:secret@127.0.0.1/db",
        "redis://127.0.0.1:1/0?prefx=t:",
    ],
)
def test_a_store_url_set_up_wrong_is_a_configuration_error(url: str, tmp_path: Path) -> None:
    # Not StoreUnavailable, whose retry is safe and may succeed: retrying this cannot help.
    with pytest.raises(idemgate.StoreMisconfigured) as e:
        Engine.open(url.format(tmp=tmp_path), journal=str(tmp_path / "journal"))
    assert isinstance(e.value, ValueError) and not isinstance(e.value, IdemgateError)
    assert "secret" not in str(e.value)


# ---- one store, every door -------------------------------------------------------------------


def test_default_store_is_the_command_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    engine = Engine.open(tenant="local")
    db = tmp_path / "data" / "idemgate" / "idemgate.db"
    assert engine.url == f"sqlite://{db}"
    key = mint_key()
    engine.call("py_tool", key, None, lambda: {"ok": True})
    shown = json.loads(cli("keys", "show", key, "--json").stdout)
    assert shown["state"] == "completed", shown


def test_a_record_written_in_python_is_seen_by_keys_show(sqlite: tuple[Engine, str]) -> None:
    engine, url = sqlite
    key = mint_key()
    engine.call("invoice", key, {"n": 1}, lambda: {"invoice": "INV-7", "total": 2**64})
    shown = json.loads(cli("keys", "show", key, "--store", url, "--json").stdout)
    assert shown["state"] == "completed" and shown["key"]["tool"] == "invoice", shown
    assert shown["content"] == "json" and shown["result"]["invoice"] == "INV-7", shown
    # The text view keeps the integer exact (`--json` prints it as a float today).
    assert str(2**64) in cli("keys", "show", key, "--store", url).stdout


def test_a_resolution_by_the_command_line_replays_in_python(sqlite: tuple[Engine, str]) -> None:
    engine, url = sqlite
    key = mint_key()

    def lost() -> None:
        raise MaybeApplied("the mail server hung up after DATA")

    with pytest.raises(MaybeApplied):
        engine.call("mail", key, None, lost)
    cli("keys", "resolve", key, "--store", url, "--tool", "mail", "--completed",
        "--result", '{"message_id": "m-1"}')
    r = engine.call("mail", key, None, lambda: pytest.fail("must not run again"))
    assert r.replayed and r.value == {"message_id": "m-1"}


def test_a_command_record_replays_in_python_as_its_output(sqlite: tuple[Engine, str]) -> None:
    engine, url = sqlite
    key = mint_key()
    with pytest.raises(MaybeApplied):
        engine.call("deploy", key, None, lambda: (_ for _ in ()).throw(MaybeApplied("?")))
    cli("keys", "resolve", key, "--store", url, "--tool", "deploy", "--completed",
        "--exit-code", "0", "--stdout", "deployed v7\n")
    r = engine.call("deploy", key, None, lambda: pytest.fail("must not run again"))
    assert r.content == "command"
    assert r.value["exit_code"] == 0 and r.value["stdout"] == "deployed v7\n"


CRASHER = """
import sys, time
from idemgate import Engine
engine = Engine.open(sys.argv[1], tenant="local")
def effect():
    open(sys.argv[3], "w").write("started")
    time.sleep(60)
engine.call("crashy", sys.argv[2], None, effect, lease=1)
"""


def lease_until(engine: Engine, key: str) -> str:
    """The end of the lease of the record ``crashy``/``key`` (RFC 3339, so it sorts by time)."""
    record = engine.record("crashy", key)
    assert record is not None and record["state"] == "in_flight", record
    return str(record["lease_until"])


def wait_for(condition: Callable[[], bool], what: str, within: float = 30) -> None:
    """Waits until ``condition()`` holds, looking every 20 ms, or fails after ``within`` s."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"never saw {what} within {within} s"
        time.sleep(0.02)


def test_a_process_killed_mid_function_leaves_unknown(sqlite: tuple[Engine, str], tmp_path: Path) -> None:
    engine, url = sqlite
    key = mint_key()
    marker = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CRASHER), url, key, str(marker)])
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None, "the crasher exited early"
            assert time.monotonic() < deadline, "the crasher never started its effect"
            time.sleep(0.02)
        # Alive and heartbeating: past the end of its first lease, a duplicate finds the call in
        # flight, not unknown (the heartbeat moved the lease on).
        first_lease_end = lease_until(engine, key)
        wait_for(lambda: lease_until(engine, key) > first_lease_end, "a heartbeat")
        with pytest.raises(InFlight):
            engine.call("crashy", key, None, lambda: pytest.fail("ran twice"), wait=0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # Without heartbeats its lease (1 s) runs out, and the record reads unknown.
    wait_for(lambda: (engine.record("crashy", key) or {}).get("state") == "unknown", "unknown")
    with pytest.raises(OutcomeUnknown):
        engine.call("crashy", key, None, lambda: pytest.fail("ran twice"), lease=1)
    shown = json.loads(cli("keys", "show", key, "--store", url, "--json").stdout)
    assert shown["state"] == "unknown", shown


def test_one_package_two_doors() -> None:
    assert idemgate.remote.Client is idemgate.Client
    client = idemgate.Client("http://127.0.0.1:1", token="t")
    engine = Engine.open("memory:")
    # The top-level decorator takes either door.
    assert callable(idemgate.idempotent(engine, "t", key=lambda: "k")(lambda: 1))
    assert callable(idemgate.idempotent(client, "t", key=lambda: "k")(lambda: 1))
