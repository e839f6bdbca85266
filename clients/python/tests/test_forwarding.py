"""Forwarded tools: the gateway calls the upstream at most once per key and replays its answer."""

from __future__ import annotations

import re
import threading
from datetime import datetime

import pytest

import idemgate
from idemgate import OutcomeUnknown, mint_key

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def test_forwarded_call_executes_once_then_replays(acme: idemgate.Client, upstream) -> None:
    key = mint_key()
    args = {"order": 1234, "amount": "19.99"}
    first = acme.call("charge", key, args)
    assert first.ok and first.status == 200
    assert first.executed and first.replayed is False
    assert first.rule == "explicit"
    assert isinstance(first.executed_at, datetime) and isinstance(first.expires_at, datetime)
    assert "json" in (first.content_type or "")
    body = first.json()
    assert body["charged"] == args

    # the downstream key: 64 hex digits, not the raw key
    downstream = body["downstream_key"]
    assert HEX64.match(downstream), downstream
    assert key not in downstream
    seen = [c for c in upstream.seen("/charge") if c.headers.get("idempotency-key") == downstream]
    assert len(seen) == 1
    assert seen[0].body == args
    assert seen[0].headers.get("content-type", "").startswith("application/json")

    second = acme.call("charge", key, args)
    assert second.replayed is True and not second.executed
    assert second.status == 200 and second.body == first.body
    assert second.executed_at == first.executed_at
    assert upstream.count("/charge", downstream) == 1


def test_racing_duplicates_run_the_upstream_once(acme: idemgate.Client, upstream) -> None:
    key = mint_key()
    args = {"order": "race"}
    answers: list[idemgate.CallResult] = []
    errors: list[Exception] = []

    def go() -> None:
        try:
            answers.append(acme.call("slow_charge", key, args))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(answers) == 4
    assert sum(1 for a in answers if a.executed) == 1
    assert len({a.body for a in answers}) == 1
    downstream = [c for c in upstream.seen("/slow") if c.body == args]
    assert len(downstream) == 1
    assert HEX64.match(downstream[0].headers["idempotency-key"])


def test_upstream_4xx_is_a_stored_failure(acme: idemgate.Client, upstream) -> None:
    key = mint_key()
    before = upstream.count("/decline")
    first = acme.call("decline", key, {"card": "4000"})
    assert first.status == 422 and not first.ok and first.executed
    assert first.json()["error"] == "card declined"
    again = acme.call("decline", key, {"card": "4000"})
    assert again.status == 422 and again.replayed is True and again.body == first.body
    assert upstream.count("/decline") == before + 1


def test_upstream_5xx_is_outcome_unknown(acme: idemgate.Client, upstream) -> None:
    key = mint_key()
    before = upstream.count("/boom")
    with pytest.raises(OutcomeUnknown) as e:
        acme.call("boom", key, {"x": 1})
    assert e.value.status == 409
    with pytest.raises(OutcomeUnknown) as e2:
        acme.call("boom", key, {"x": 1})
    assert isinstance(e2.value.fence, int)
    assert upstream.count("/boom") == before + 1, "never silently re-run"
    record = acme.record("boom", key)
    assert record is not None and record.state == "unknown"


def test_reads_pass_through_without_a_key(acme: idemgate.Client, upstream) -> None:
    before = upstream.count("/lookup")
    a = acme.call("lookup", None, {"q": "x"})
    b = acme.call("lookup", None, {"q": "x"})
    assert a.ok and b.ok
    assert a.pass_through and b.pass_through
    assert upstream.count("/lookup") == before + 2


def test_two_tenants_same_key_both_forward(acme: idemgate.Client, globex: idemgate.Client, upstream) -> None:
    key = mint_key()
    args = {"order": "same-for-both"}
    a = acme.call("charge", key, args)
    g = globex.call("charge", key, args)
    assert a.executed and g.executed
    ka, kg = a.json()["downstream_key"], g.json()["downstream_key"]
    assert ka != kg, "downstream keys are per tenant"
    assert acme.call("charge", key, args).body == a.body
    assert globex.call("charge", key, args).body == g.body
    assert upstream.count("/charge", ka) == 1 and upstream.count("/charge", kg) == 1
