"""The @idempotent decorator against a real gateway."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import idemgate
from idemgate import (
    Failed,
    KeyReused,
    NotApplied,
    OutcomeUnknown,
    PayloadTooLarge,
    derive_key,
    idempotent,
    mint_key,
)


def test_runs_once_across_retries(acme: idemgate.Client) -> None:
    runs: list[int] = []

    @idempotent(acme, "mail", key=lambda run_id, step, to: derive_key(run_id, step))
    def send(run_id: str, step: int, to: str) -> dict:
        runs.append(step)
        return {"sent_to": to, "message_id": f"m-{len(runs)}"}

    run = mint_key()
    first = send(run, 1, "a@example.com")
    assert first == {"sent_to": "a@example.com", "message_id": "m-1"}
    for _ in range(3):  # the agent runtime retries
        assert send(run, 1, "a@example.com") == first
    assert runs == [1]
    # another step is another action
    assert send(run, 2, "a@example.com")["message_id"] == "m-2"
    assert runs == [1, 2]
    # same step, other arguments: key reuse, nothing runs
    with pytest.raises(KeyReused):
        send(run, 1, "b@example.com")
    assert runs == [1, 2]


def test_racing_threads_run_once(acme: idemgate.Client) -> None:
    runs: list[float] = []
    lock = threading.Lock()
    key = mint_key()

    @idempotent(acme, "mail", key=lambda n: key)
    def slow(n: int) -> int:
        with lock:
            runs.append(time.monotonic())
        time.sleep(0.5)
        return n * 2

    results: list[object] = []

    def go() -> None:
        try:
            results.append(slow(21))
        except Exception as e:  # noqa: BLE001
            results.append(e)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [42, 42, 42, 42]
    assert len(runs) == 1


def test_not_applied_releases_the_key(acme: idemgate.Client) -> None:
    attempts: list[int] = []
    key = mint_key()

    @idempotent(acme, "mail", key=lambda: key)
    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise NotApplied("SMTP server refused the connection; nothing sent")
        return "sent"

    with pytest.raises(NotApplied):
        flaky()
    assert acme.record("mail", key) is None, "the key is free again"
    assert flaky() == "sent"
    assert flaky() == "sent"
    assert len(attempts) == 2


def test_other_exceptions_make_the_outcome_unknown(acme: idemgate.Client) -> None:
    attempts: list[int] = []
    key = mint_key()

    @idempotent(acme, "mail", key=lambda: key)
    def timeout() -> str:
        attempts.append(1)
        raise TimeoutError("no answer after sending")

    with pytest.raises(TimeoutError):
        timeout()
    with pytest.raises(OutcomeUnknown) as e:
        timeout()
    assert len(attempts) == 1, "never silently re-run"
    record = acme.record("mail", key)
    assert record is not None and record.state == "unknown"
    assert e.value.fence == record.fence


def test_failed_is_stored_and_replayed(acme: idemgate.Client) -> None:
    attempts: list[int] = []
    key = mint_key()

    @idempotent(acme, "mail", key=lambda: key)
    def declined() -> str:
        attempts.append(1)
        raise Failed({"error": "mailbox does not exist"})

    with pytest.raises(Failed) as first:
        declined()
    assert first.value.replayed is False
    with pytest.raises(Failed) as again:
        declined()
    assert again.value.replayed is True
    assert again.value.result == {"error": "mailbox does not exist"}
    assert len(attempts) == 1


def test_heartbeat_keeps_a_long_call_alive(acme: idemgate.Client) -> None:
    # short_lease has a 1 s lease: without heartbeats the record would turn unknown mid-call.
    # The call lasts until the record was seen past that lease's end, however late the peek is.
    key = mint_key()
    runs: list[int] = []
    seen_during: list[str] = []
    peeked = threading.Event()

    @idempotent(acme, "short_lease", key=lambda: key)
    def long_call() -> str:
        runs.append(1)
        assert peeked.wait(30), "the peek never came"
        return "finished"

    def peek() -> None:
        try:
            time.sleep(1.8)  # a lower bound: past the 1 s lease, however loaded the machine
            r = acme.record("short_lease", key)
            seen_during.append(r.state if r else "absent")
        finally:
            peeked.set()

    t = threading.Thread(target=peek)
    t.start()
    assert long_call() == "finished"
    t.join()
    assert seen_during == ["in_flight"]
    assert long_call() == "finished"
    assert runs == [1]


def test_explicit_heartbeat_interval_and_custom_args(acme: idemgate.Client) -> None:
    key = mint_key()
    runs: list[int] = []

    @idempotent(
        acme,
        "short_lease",
        key=lambda order, note: key,
        args=lambda order, note: {"order": order},  # the note is not part of the action
        heartbeat_every=0.2,
    )
    def charge(order: int, note: str) -> int:
        runs.append(order)
        time.sleep(1.5)
        return order

    assert charge(7, "first try") == 7
    assert charge(7, "retry with another note") == 7
    assert runs == [7]


def test_in_flight_is_raised_after_the_wait(acme: idemgate.Client) -> None:
    key = mint_key()
    holder = acme.begin("mail", key, {"args": [], "kwargs": {}})
    assert holder.execute

    @idempotent(acme, "mail", key=lambda: key, wait_in_flight=0.5)
    def never() -> None:
        raise AssertionError("must not run while another call holds the key")

    with pytest.raises(idemgate.InFlight):
        never()
    acme.complete("mail", key, holder.lease, "done elsewhere")
    assert never() == "done elsewhere"


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


# Return values the client cannot send as JSON: json raises TypeError (an object), ValueError
# (NaN and the infinities, which json.dumps writes by default but the gateway refuses; a cycle), a
# UnicodeEncodeError (a lone surrogate) or RecursionError (nesting past the interpreter's limit).
NOT_JSON: dict[str, Any] = {
    "object": object,
    "nan": lambda: float("nan"),
    "inf": lambda: float("inf"),
    "nested -inf": lambda: {"total": [1.5, float("-inf")]},
    "cycle": cycle,
    "lone surrogate": lambda: "\ud800",
    "too deep": lambda: nested(5000),
}


@pytest.mark.parametrize("make", NOT_JSON.values(), ids=NOT_JSON.keys())
def test_a_result_json_cannot_hold_makes_the_record_unknown_at_once(
    acme: idemgate.Client, make: Any
) -> None:
    # The function ran, so the record must say unknown now: not stay in flight for the lease (a
    # retry waited for it and got InFlight or the gateway's timeout), and not be released.
    attempts: list[int] = []
    key = mint_key()

    @idempotent(acme, "mail", key=lambda: key, wait_in_flight=0)
    def compute() -> Any:
        attempts.append(1)
        return make()

    with pytest.raises(TypeError, match="cannot be stored as JSON.*the record is now unknown"):
        compute()
    record = acme.record("mail", key)
    assert record is not None and record.state == "unknown", record
    assert len(attempts) == 1


def test_a_nan_result_is_never_run_again(acme: idemgate.Client) -> None:
    attempts: list[int] = []
    key = mint_key()

    @idempotent(acme, "mail", key=lambda: key, wait_in_flight=0)
    def measure() -> float:
        attempts.append(1)
        return float("nan")

    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        measure()
    # The gateway watches a record it first finds unknown for its settle window (2 s here).
    with pytest.raises(OutcomeUnknown):
        measure()
    assert len(attempts) == 1


def test_a_failure_whose_result_is_not_json_is_stored_as_its_repr(acme: idemgate.Client) -> None:
    key = mint_key()

    @idempotent(acme, "mail", key=lambda: key, wait_in_flight=0)
    def overflow() -> None:
        raise Failed({"ratio": float("inf")})

    with pytest.raises(Failed) as first:
        overflow()
    assert not first.value.replayed
    with pytest.raises(Failed) as again:
        overflow()
    assert again.value.replayed and again.value.result == "{'ratio': inf}"


class RefusingClient(idemgate.Client):
    """A client whose gateway refuses every outcome as too large (a 413 on ``complete``)."""

    def complete(self, tool: str, key: str, lease: str, result: Any, failed: bool = False) -> Any:
        raise PayloadTooLarge("413 Payload too large", status=413)


@pytest.mark.parametrize("outcome", ["result", "failure"])
def test_an_outcome_the_gateway_refuses_makes_the_record_unknown(
    gateway: Any, outcome: str
) -> None:
    client = RefusingClient(gateway.url, "acme-token-0123456789", timeout=30)
    key = mint_key()

    @idempotent(client, "mail", key=lambda: key, wait_in_flight=0)
    def send() -> str:
        if outcome == "failure":
            raise Failed("x" * 100)
        return "x" * 100

    with pytest.raises(PayloadTooLarge) as e:
        send()
    assert "the record is now unknown" in "".join(getattr(e.value, "__notes__", []))
    record = client.record("mail", key)
    assert record is not None and record.state == "unknown", record
