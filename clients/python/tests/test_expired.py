"""Tombstones: past a record's ``ttl`` its outcome is no longer replayed, and within the tool's
``tombstone`` (default 30 days after the call ran; 0: none) a retry with the same key is not run
again: it raises ``OutcomeExpired`` (410 ``outcome-expired``), in-process and through the
gateway. The tests wait for time itself to pass (a TTL of a fraction of a second): the engine
judges expiry by the store's clock."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import idemgate
from idemgate import (
    Client,
    Conflict,
    Engine,
    IdemgateError,
    OutcomeExpired,
    Policy,
    idempotent,
    mint_key,
)
from idemgate.errors import PROBLEM_PREFIX, error_from_problem
from test_engine import Counter, stores

#: The TTL of the tests' tool, in seconds, and how long a test waits for it to pass.
TTL = 0.3
PAST_TTL = TTL + 0.3


@pytest.fixture(params=stores(), ids=lambda u: u.split(":")[0])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    url = request.param
    if url == "sqlite":
        url = f"sqlite://{tmp_path / 'idem.db'}"
    return Engine.open(url, tenant="py-tests", journal=str(tmp_path / "journal"))


def _tool(name: str) -> str:
    return f"{name}-{mint_key()[4:16]}"


def _iso(at: datetime | None) -> str:
    assert at is not None
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_a_retry_after_the_ttl_is_not_run_and_raises_outcome_expired(engine: Engine) -> None:
    tool, key, args, runs = _tool("charge"), mint_key(), {"order": 7}, Counter()
    first = engine.call(tool, key, args, lambda: {"charged": runs.bump()}, ttl=TTL)
    assert first.executed
    assert engine.call(tool, key, args, runs.bump, ttl=TTL).replayed, "within the TTL: a replay"
    time.sleep(PAST_TTL)
    for _ in range(2):  # every retry within the tombstone: never run
        with pytest.raises(OutcomeExpired) as expired:
            engine.call(tool, key, args, runs.bump, ttl=TTL)
        assert runs.n == 1, "the action ran once"
    e = expired.value
    # A refusal like the others: an IdemgateError with the gateway's status and problem type,
    # not a conflict (409): 410, the outcome is gone for good.
    assert isinstance(e, IdemgateError) and not isinstance(e, Conflict)
    assert e.status == 410 and e.type == PROBLEM_PREFIX + "outcome-expired"
    assert e.title == "Outcome expired" and e.problem["verdict"] == "expired"
    assert e.key == key and e.rule == "explicit"
    assert e.executed_at == _iso(first.executed_at)
    assert e.expired_at == _iso(first.expires_at)
    record = engine.record(tool, key)
    assert record is not None and record["state"] == "expired"
    assert e.fence == record["fence"] and e.retain_until == record["retain_until"]
    # The default tombstone: 30 days after the call ran.
    retain = datetime.fromisoformat(e.retain_until.replace("Z", "+00:00"))  # type: ignore[union-attr]
    assert first.executed_at is not None
    assert abs((retain - first.executed_at).total_seconds() - 30 * 24 * 3600) < 1
    # The message is the kit's explanation for a person: when it ran, that nothing ran now, and
    # how to run it again on purpose.
    message = str(e)
    for said in (
        f"already ran at {e.executed_at}",
        "no longer kept",
        "not run now",
        "call it again with a new key",
        f"engine.reopen(tool, key, {e.fence}, reason=",
    ):
        assert said in message, (said, message)
    assert e.detail == message
    # A new key is a new action: it runs.
    assert engine.call(tool, mint_key(), args, runs.bump, ttl=TTL).executed and runs.n == 2


def test_the_decorators_raise_outcome_expired(engine: Engine) -> None:
    runs = Counter()
    tool = _tool("send")

    @idempotent(engine, tool, key=lambda n, call_id: call_id, ttl=TTL)
    def send(n: int, call_id: str) -> int:
        return runs.bump()

    @idempotent(engine, tool + "-async", key=lambda n, call_id: call_id, ttl=TTL)
    async def asend(n: int, call_id: str) -> int:
        return runs.bump()

    assert send(1, "k") == 1 and asyncio.run(asend(1, "k")) == 2
    assert send(1, "k") == 1, "within the TTL: the stored value"
    time.sleep(PAST_TTL)
    with pytest.raises(OutcomeExpired):
        send(1, "k")
    with pytest.raises(OutcomeExpired):
        send.result(1, "k")
    with pytest.raises(OutcomeExpired):
        asyncio.run(asend(1, "k"))
    with pytest.raises(OutcomeExpired):
        asyncio.run(asend.result(1, "k"))
    assert runs.n == 2


def test_engine_acall_raises_outcome_expired(engine: Engine) -> None:
    tool, key, runs = _tool("refund"), mint_key(), Counter()

    async def scenario() -> OutcomeExpired:
        assert (await engine.acall(tool, key, None, runs.bump, ttl=TTL)).executed
        await asyncio.sleep(PAST_TTL)
        with pytest.raises(OutcomeExpired) as expired:
            await engine.acall(tool, key, None, runs.bump, ttl=TTL)
        return expired.value

    e = asyncio.run(scenario())
    assert runs.n == 1 and e.key == key and e.fence is not None


def test_without_a_tombstone_a_retry_after_the_ttl_runs_again(engine: Engine) -> None:
    tool, key, runs = _tool("note"), mint_key(), Counter()
    assert engine.call(tool, key, None, runs.bump, ttl=TTL, tombstone=0).executed
    time.sleep(PAST_TTL)
    assert engine.record(tool, key) is None, "no tombstone: the record is gone with its TTL"
    again = engine.call(tool, key, None, runs.bump, ttl=TTL, tombstone=0)
    assert again.executed and runs.n == 2
    # Configured per tool too (as Engine.open(tools=...) does).
    engine.tools[tool] = Policy(ttl=TTL, tombstone=0)
    key = mint_key()
    assert engine.call(tool, key, None, runs.bump).executed
    time.sleep(PAST_TTL)
    assert engine.call(tool, key, None, runs.bump).executed and runs.n == 4


def test_past_its_tombstone_the_key_names_a_new_action(engine: Engine) -> None:
    tool, key, runs = _tool("ping"), mint_key(), Counter()
    # Past the TTL with most of the tombstone's second left, so that a slow call still lands
    # inside it; then past the tombstone.
    assert engine.call(tool, key, None, runs.bump, ttl=0.2, tombstone=1.0).executed
    time.sleep(0.35)
    with pytest.raises(OutcomeExpired):
        engine.call(tool, key, None, runs.bump, ttl=0.2, tombstone=1.0)
    time.sleep(0.7)
    assert engine.call(tool, key, None, runs.bump, ttl=0.2, tombstone=1.0).executed
    assert runs.n == 2


def test_reopening_an_expired_record_runs_the_action_again(engine: Engine) -> None:
    tool, key, args, runs = _tool("refund"), mint_key(), {"order": 9}, Counter()
    assert engine.call(tool, key, args, runs.bump, ttl=TTL).executed
    time.sleep(PAST_TTL)
    with pytest.raises(OutcomeExpired) as expired:
        engine.call(tool, key, args, runs.bump, ttl=TTL)
    fence = expired.value.fence
    assert fence is not None
    with pytest.raises(idemgate.NotResolvable):
        engine.reopen(tool, key, fence + 1, reason="a stale look")
    assert engine.reopen(tool, key, fence, reason="the customer asked again") == "expired"
    again = engine.call(tool, key, args, runs.bump, ttl=TTL)
    assert again.executed and runs.n == 2, "reopened: the next call runs the action again"
    # A retried reopen with the old fence never touches the new outcome.
    with pytest.raises(idemgate.NotResolvable):
        engine.reopen(tool, key, fence, reason="the same click, twice")
    assert engine.call(tool, key, args, runs.bump, ttl=TTL).replayed and runs.n == 2


def test_the_policys_tombstone() -> None:
    assert Policy().tombstone == 30 * 24 * 3600
    p = Policy(ttl=60, tombstone=3600)
    assert (p.ttl, p.tombstone) == (60, 3600)
    assert "tombstone=3600" in repr(p)
    with pytest.raises(ValueError):
        Policy(tombstone=-1)
    engine = Engine.open("memory:", tools={"charge": {"tombstone": 0}}, default=Policy(tombstone=60))
    assert engine.policy("charge").tombstone == 0
    assert engine.policy("other").tombstone == 60
    # An override of another field keeps the tool's tombstone; one of the tombstone takes.
    assert engine.policy("charge", wait=1).tombstone == 0
    assert engine.policy("other", ttl=5).tombstone == 60
    assert engine.policy("other", tombstone=7).tombstone == 7


# ---- through the gateway -----------------------------------------------------------------------


def test_a_410_outcome_expired_problem_raises_outcome_expired() -> None:
    problem: dict[str, Any] = {
        "type": PROBLEM_PREFIX + "outcome-expired",
        "title": "Outcome expired",
        "status": 410,
        "detail": "the tool charge already ran at 2026-01-01T00:00:00.000Z ...",
        "executed_at": "2026-01-01T00:00:00.000Z",
        "expired_at": "2026-01-02T00:00:00.000Z",
        "retain_until": "2026-01-31T00:00:00.000Z",
        "fence": 3,
    }
    e = error_from_problem(410, problem, {})
    assert isinstance(e, OutcomeExpired) and e.status == 410
    assert (e.executed_at, e.expired_at, e.retain_until, e.fence) == (
        "2026-01-01T00:00:00.000Z",
        "2026-01-02T00:00:00.000Z",
        "2026-01-31T00:00:00.000Z",
        3,
    )
    assert "already ran" in str(e)
    # A 410 of another (or no) problem type is still the expired outcome.
    assert isinstance(error_from_problem(410, {"title": "Gone"}, {}), OutcomeExpired)


def test_the_gateways_expired_answer_raises_outcome_expired(acme: Client) -> None:
    # `short_ttl` (tests/conftest.py): ttl 300ms, the default tombstone.
    key = mint_key()
    b = acme.begin("short_ttl", key, {"n": 1})
    assert b.execute and b.lease is not None
    acme.complete("short_ttl", key, b.lease, {"done": 1})
    assert acme.begin("short_ttl", key, {"n": 1}).replayed
    time.sleep(PAST_TTL)
    with pytest.raises(OutcomeExpired) as expired:
        acme.begin("short_ttl", key, {"n": 1})
    e = expired.value
    assert e.status == 410 and e.executed_at and e.expired_at and e.retain_until
    assert e.fence is not None

    runs = Counter()

    @idemgate.idempotent(acme, "short_ttl", key=lambda k: k)
    def act(k: str) -> int:
        return runs.bump()

    k = mint_key()
    assert act(k) == 1 and act(k) == 1
    time.sleep(PAST_TTL)
    with pytest.raises(OutcomeExpired):
        act(k)
    assert runs.n == 1
