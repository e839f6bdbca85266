"""Coordination (begin/complete/release/ambiguous), records and resolve, against a real gateway."""

from __future__ import annotations

from datetime import datetime

import pytest

import idemgate
from idemgate import (
    InFlight,
    KeyRequired,
    KeyReused,
    LeaseLost,
    OutcomeUnknown,
    Unauthorized,
    mint_key,
)

BIG = 12345678901234567890123  # canonical JSON keeps integers exact


def test_execute_then_replay(acme: idemgate.Client) -> None:
    key = mint_key()
    args = {"invoice": 42, "amount": BIG}
    first = acme.begin("invoice", key, args)
    assert first.execute and not first.replayed and not first.pass_through
    assert first.rule == "explicit"
    assert first.lease
    assert isinstance(first.lease_until, datetime)

    done = acme.complete("invoice", key, first.lease, {"sent": True, "id": BIG})
    assert done.decision == "executed"
    assert done.recording == "stored"
    assert isinstance(done.executed_at, datetime)
    assert isinstance(done.expires_at, datetime) and done.expires_at > done.executed_at

    again = acme.begin("invoice", key, {"amount": BIG, "invoice": 42})  # same JSON, other order
    assert again.replayed and not again.execute
    assert again.outcome is not None and again.outcome.kind == "success"
    assert again.outcome.result == {"sent": True, "id": BIG}
    assert again.executed_at == done.executed_at
    assert again.expires_at == done.expires_at
    assert again.rule == "explicit"

    record = acme.record("invoice", key)
    assert record is not None and record.state == "completed"
    assert record.tenant == "acme" and record.tool == "invoice" and record.key == key
    assert record.outcome is not None and record.outcome.result == {"sent": True, "id": BIG}


def test_stored_failure_is_replayed_as_failure(acme: idemgate.Client) -> None:
    key = mint_key()
    b = acme.begin("invoice", key, {"n": 1})
    acme.complete("invoice", key, b.lease, {"error": "declined"}, failed=True)
    again = acme.begin("invoice", key, {"n": 1})
    assert again.replayed
    assert again.outcome == idemgate.Outcome("failed", {"error": "declined"})


def test_key_reuse_with_other_arguments_is_refused(acme: idemgate.Client) -> None:
    key = mint_key()
    b = acme.begin("invoice", key, {"amount": 10})
    acme.complete("invoice", key, b.lease, "ok")
    with pytest.raises(KeyReused) as e:
        acme.begin("invoice", key, {"amount": 11})
    assert e.value.status == 422
    assert e.value.type == "https://idemgate.dev/problems/key-reused"
    # the same key under another tool is another record
    assert acme.begin("mail", key, {"amount": 11}).execute


def test_in_flight_duplicate_gets_409_with_retry_after(acme: idemgate.Client) -> None:
    key = mint_key()
    first = acme.begin("invoice", key, {"x": 1})
    assert first.execute
    with pytest.raises(InFlight) as e:
        acme.begin("invoice", key, {"x": 1})
    assert e.value.status == 409
    assert e.value.retry_after is not None and e.value.retry_after >= 0
    acme.complete("invoice", key, first.lease, {"done": 1})
    assert acme.begin("invoice", key, {"x": 1}).outcome.result == {"done": 1}


def test_release_frees_the_key(acme: idemgate.Client) -> None:
    key = mint_key()
    b = acme.begin("invoice", key, {"x": 1})
    assert acme.release("invoice", key, b.lease, "card service said no before charging") == "not_applied"
    assert acme.record("invoice", key) is None
    assert acme.begin("invoice", key, {"x": 1}).execute


def test_unknown_after_ambiguous_then_resolve(acme: idemgate.Client) -> None:
    key = mint_key()
    b = acme.begin("invoice", key, {"x": 1})
    assert acme.ambiguous("invoice", key, b.lease, "timeout after sending") == "unknown"

    with pytest.raises(OutcomeUnknown) as e:
        acme.begin("invoice", key, {"x": 1})
    assert e.value.status == 409
    assert isinstance(e.value.fence, int)
    assert e.value.since
    record = acme.record("invoice", key)
    assert record is not None and record.state == "unknown" and record.since is not None
    # Why, from the store, and the key the upstream would have got.
    assert record.reason == "timeout after sending"
    assert record.downstream_key is not None and len(record.downstream_key) == 64
    assert [s["what"] for s in record.history] == ["reserved", "became_unknown"]
    # A duplicate is told the reason too.
    assert "timeout after sending" in (e.value.detail or "")
    assert key in {r.key for r in acme.records(state="unknown", tool="invoice", limit=1000)}

    # it did not happen: release, and the next call runs
    acme.resolve("invoice", key, e.value.fence, "release")
    again = acme.begin("invoice", key, {"x": 1})
    assert again.execute

    # the old lease is a zombie now
    with pytest.raises(LeaseLost) as lost:
        acme.complete("invoice", key, b.lease, "late")
    assert lost.value.status == 409
    acme.ambiguous("invoice", key, again.lease, "lost again")

    # it did happen: store the outcome, duplicates replay it
    with pytest.raises(OutcomeUnknown) as e2:
        acme.begin("invoice", key, {"x": 1})
    after = acme.resolve("invoice", key, e2.value.fence, "completed", result={"found": "in the ledger"})
    assert after is not None and after.state == "completed"
    replay = acme.begin("invoice", key, {"x": 1})
    assert replay.replayed and replay.outcome.result == {"found": "in the ledger"}
    # a completed record is not resolvable
    with pytest.raises(idemgate.NotResolvable) as nr:
        acme.resolve("invoice", key, e2.value.fence, "release")
    assert nr.value.status == 409 and nr.value.state == "completed"


def test_heartbeat_extends_the_lease(acme: idemgate.Client) -> None:
    key = mint_key()
    b = acme.begin("short_lease", key, {})
    until = acme.heartbeat("short_lease", key, b.lease)
    assert until is not None and until >= b.lease_until
    acme.complete("short_lease", key, b.lease, 1)
    with pytest.raises(LeaseLost):
        acme.heartbeat("short_lease", key, b.lease)


def test_tenant_isolation(acme: idemgate.Client, globex: idemgate.Client) -> None:
    key = mint_key()
    args = {"to": "ops@example.com", "subject": "hello"}
    a = acme.begin("mail", key, args)
    g = globex.begin("mail", key, args)
    assert a.execute and g.execute, "same key and payload under two tenants are two records"
    acme.complete("mail", key, a.lease, {"tenant": "acme"})
    globex.complete("mail", key, g.lease, {"tenant": "globex"})
    assert acme.begin("mail", key, args).outcome.result == {"tenant": "acme"}
    assert globex.begin("mail", key, args).outcome.result == {"tenant": "globex"}
    assert acme.record("mail", key).tenant == "acme"
    assert globex.record("mail", key).tenant == "globex"
    assert all(r.tenant == "acme" for r in acme.records(tool="mail", limit=1000))
    assert all(r.tenant == "globex" for r in globex.records(tool="mail", limit=1000))
    # a lease of one tenant is no lease for the other
    b = acme.begin("mail", mint_key(), args)
    with pytest.raises(idemgate.IdemgateError):
        globex.complete("mail", b.key, b.lease, "stolen")


def test_wrong_or_missing_token_is_401(gateway) -> None:
    for token in ("nope", ""):
        with pytest.raises(Unauthorized) as e:
            gateway.client(token=token).begin("invoice", mint_key(), {})
        assert e.value.status == 401


def test_write_without_key_is_refused(acme: idemgate.Client) -> None:
    with pytest.raises(KeyRequired) as e:
        acme.begin("invoice", None, {"x": 1})
    assert e.value.status == 400


def test_records_filter_by_state(acme: idemgate.Client) -> None:
    key = mint_key()
    b = acme.begin("mail", key, {})
    in_flight = acme.records(state="in_flight", tool="mail", limit=1000)
    assert key in {r.key for r in in_flight}
    assert all(r.state == "in_flight" and r.lease_until is not None for r in in_flight)
    acme.complete("mail", key, b.lease, None)
    completed = acme.records(state="completed", tool="mail", limit=1000)
    assert key in {r.key for r in completed}
    assert key not in {r.key for r in acme.records(state="in_flight", tool="mail", limit=1000)}
