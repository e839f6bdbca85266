"""Benchmark of the in-process engine (``idemgate.Engine``) and of the Python peers of issue 10
(aws-lambda-powertools, exactly-once, agent-once, idempotent-tools), same run, same stores:

- ``fresh``: unique keys, one thread, a counting side effect;
- ``replay``: one key repeated, one thread;
- ``storm``: 16 threads released by a barrier over the same 200 keys, counting executions per key
  (0 double executions is the guarantee) and what the losers got;
- ``storm, a barrier per key``: the same 16 threads meet at a barrier before *every* key, so each
  key has one winner and 15 callers that find it in flight and wait; besides the counts, how long
  after the winner's answer each loser got its own (p50, p99, max) and how many keys had a loser
  later than 15 ms: a wake-up lost between a look and a wait shows there as a polling interval;
- ``decorator fresh`` and ``decorator replay``: ``fresh`` and ``replay`` through each library's own
  decorator, as an application writes it (idemgate's ``@idempotent`` as its README shows, with a
  ``key=`` function and the default arguments; exactly-once's ``@once``, Powertools'
  ``@idempotent_function``, agent-once's ``@Once.tool``, idempotent-tools' ``@idempotent``).

Each workload runs ``--rounds`` times (default 5) per library and store, the libraries taking
turns round by round; the table shows the median calls/s, the min–max, and idemgate's ratio to
the best peer on that row (medians). Stores:
``memory``, a temporary SQLite file, and PostgreSQL / Redis when ``IDEMGATE_TEST_POSTGRES_URL`` /
``IDEMGATE_TEST_REDIS_URL`` are set. Fresh keys each round, records kept 2 minutes where the
library can expire them; the peers' PostgreSQL tables live in a schema of this run, dropped at
the end, and idempotent-tools' Redis records (which never expire) are deleted by key at the end.
Run it with scripts/bench-python (a release build, the pinned peers, in target/bench-venv).

Each library is driven the way its README shows, with the closest equivalent of idemgate's
settings: an explicit key per call, the arguments fingerprinted where the library can, and a
duplicate of a call in flight waiting for its result (up to 30 s) where the library can wait.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import urllib.parse
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idemgate import Engine, Policy, idempotent, mint_key

# The side effect of the call in progress on this thread (the peers' decorated functions read it).
_tl = threading.local()


def _effect(*_: Any, **__: Any) -> Any:
    return _tl.effect()


# A call: (tool, key, args, effect) -> the value (stored or fresh); raises on a refusal.
Call = Callable[[str, str, dict[str, Any], Callable[[], Any]], Any]


@dataclass
class Subject:
    """One library on one store."""

    library: str
    call: Call
    close: Callable[[], None] = lambda: None
    note: str = ""
    # The same call made through the library's own decorator (None: it has none).
    decorated: Call | None = None


@dataclass
class Unsupported:
    library: str
    why: str


# ---- the workloads ----------------------------------------------------------------------------


def fresh(call: Call, n: int) -> tuple[float, str]:
    runs = [0]

    def effect() -> dict[str, int]:
        runs[0] += 1
        return {"n": runs[0]}

    prefix = mint_key()
    start = time.perf_counter()
    for i in range(n):
        _tl.effect = effect
        call("bench_fresh", f"{prefix}-{i}", {"k": i}, effect)
    took = time.perf_counter() - start
    assert runs[0] == n, runs
    return n / took, ""


def replay(call: Call, n: int) -> tuple[float, str]:
    runs = [0]

    def effect() -> dict[str, int]:
        runs[0] += 1
        return {"n": runs[0]}

    key = mint_key()
    _tl.effect = effect
    first = call("bench_replay", key, {"k": 1}, effect)
    start = time.perf_counter()
    for _ in range(n):
        value = call("bench_replay", key, {"k": 1}, effect)
    took = time.perf_counter() - start
    assert runs[0] == 1, runs
    assert value == first, (value, first)
    return n / took, ""


def storm(call: Call, keys: int = 200, threads: int = 16) -> tuple[float, Storm]:
    prefix = mint_key()
    names = [f"{prefix}-{i}" for i in range(keys)]
    executions: Counter[str] = Counter()
    answers: Counter[str] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def racer() -> None:
        barrier.wait()
        for name in names:
            ran = [False]

            def effect(name: str = name, ran: list[bool] = ran) -> int:
                ran[0] = True
                with lock:
                    executions[name] += 1
                return 1

            _tl.effect = effect
            try:
                call("bench_storm", name, {"k": name}, effect)
                kind = "executed" if ran[0] else "replayed"
            except Exception as e:  # noqa: BLE001 - what a loser got is the measurement
                kind = type(e).__name__
            with lock:
                answers[kind] += 1

    pool = [threading.Thread(target=racer) for _ in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    took = time.perf_counter() - start
    doubles = sum(c - 1 for c in executions.values() if c > 1)
    missing = keys - len(executions)
    return keys * threads / took, Storm(doubles, missing, answers)


def storm_per_key(call: Call, keys: int = 200, threads: int = 16) -> tuple[float, Storm]:
    """As :func:`storm`, with a barrier before every key; measures the losers' lateness."""
    prefix = mint_key()
    names = [f"{prefix}-{i}" for i in range(keys)]
    executions: Counter[str] = Counter()
    answers: Counter[str] = Counter()
    # Per key, when each caller got its answer and whether it ran the effect.
    ends: list[list[tuple[float, bool]]] = [[] for _ in names]
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def racer() -> None:
        for i, name in enumerate(names):
            ran = [False]

            def effect(name: str = name, ran: list[bool] = ran) -> int:
                ran[0] = True
                with lock:
                    executions[name] += 1
                return 1

            _tl.effect = effect
            barrier.wait()
            try:
                call("bench_storm_per_key", name, {"k": name}, effect)
                kind = "executed" if ran[0] else "replayed"
            except Exception as e:  # noqa: BLE001 - what a loser got is the measurement
                kind = type(e).__name__
            end = time.perf_counter()
            with lock:
                answers[kind] += 1
                ends[i].append((end, ran[0]))

    pool = [threading.Thread(target=racer) for _ in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    took = time.perf_counter() - start
    late: list[float] = []
    slow_keys = 0
    for key_ends in ends:
        winner = [end for end, ran in key_ends if ran]
        if len(winner) != 1:
            continue  # counted as a double execution or a key never run
        lateness = [max(0.0, end - winner[0]) for end, ran in key_ends if not ran]
        late += lateness
        slow_keys += any(x > 0.015 for x in lateness)
    doubles = sum(c - 1 for c in executions.values() if c > 1)
    missing = keys - len(executions)
    return keys * threads / took, Storm(doubles, missing, answers, late, slow_keys)


@dataclass
class Storm:
    """What one storm round counted."""

    doubles: int
    missing: int
    answers: Counter[str]
    # With a barrier per key: how late after the winner each loser was answered (seconds), and
    # the keys with a loser later than 15 ms.
    late: list[float] = field(default_factory=list)
    slow_keys: int = 0


def lateness_note(rounds: list[Storm]) -> str:
    """The losers' lateness over all rounds, and the slow keys per round."""
    late = sorted(x for r in rounds for x in r.late)
    if not late:
        return ""

    def ms(q: float) -> str:
        return f"{late[min(len(late) - 1, int(q * len(late)))] * 1000:.1f}"

    slow = [r.slow_keys for r in rounds]
    return (
        f"losers answered after the winner: p50 {ms(0.5)} ms, p99 {ms(0.99)} ms, "
        f"max {late[-1] * 1000:.1f} ms; keys with a loser > 15 ms: {min(slow)}–{max(slow)} per round"
    )


def storm_note(rounds: list[Storm]) -> str:
    """Double executions and keys never run per round, and what the calls got over all rounds."""

    def span(values: list[int]) -> str:
        lo, hi = min(values), max(values)
        return f"{lo}" if lo == hi else f"{lo}–{hi}"

    total: Counter[str] = Counter()
    for r in rounds:
        total.update(r.answers)
    got = ", ".join(f"{k} {v}" for k, v in sorted(total.items()))
    late = lateness_note(rounds)
    return (
        f"double executions {span([r.doubles for r in rounds])} per round, keys never run "
        f"{span([r.missing for r in rounds])}; the {len(rounds)} rounds' calls: {got}"
        + (f"; {late}" if late else "")
    )


# ---- the libraries ----------------------------------------------------------------------------


@dataclass
class Stores:
    """Where each store is, for this run."""

    tmp: Path
    postgres: str | None
    redis: str | None
    run: str = field(default_factory=lambda: mint_key().replace("-", "_")[:24].lower())
    # More idemgate rows on SQLite at durability=normal, one per write-ahead log bound (`4MiB`).
    wal_limits: list[str] = field(default_factory=list)

    @property
    def pg_schema(self) -> str:
        return f"idemgate_bench_{self.run}"

    def pg_dsn(self) -> str:
        """The PostgreSQL URL with this run's schema first on the search path."""
        assert self.postgres
        url = self.postgres.replace("postgres://", "postgresql://", 1)
        sep = "&" if "?" in url else "?"
        return url + sep + "options=" + urllib.parse.quote(f"-csearch_path={self.pg_schema}")


def idemgate_subject(store: str, s: Stores) -> Subject | Unsupported:
    url = {
        "memory": "memory:",
        "SQLite": f"sqlite://{s.tmp / 'idemgate.db'}",
        "PostgreSQL": s.postgres,
        "Redis": s.redis and s.redis + ("&" if "?" in s.redis else "?") + "allow_volatile=true",
    }[store]
    # Records kept 2 minutes: the shared servers are not left holding thousands of them.
    engine = Engine.open(
        url, tenant=f"bench-{s.run}", journal=str(s.tmp / f"journal-{store}"), default=Policy(ttl=120)
    )

    def call(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
        return engine.call(tool, key, args, effect, wait=30).value

    return Subject("idemgate", call, decorated=idemgate_decorated(engine))


def idemgate_decorated(engine: Engine) -> Call:
    """Calls through ``@idempotent``, one decorated function per tool, as the README writes it."""
    tools: dict[str, Callable[..., Any]] = {}

    def call(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
        fn = tools.get(tool)
        if fn is None:

            @idempotent(engine, tool, key=lambda key, args: key, wait=30)
            def body(key: str, args: dict[str, Any]) -> Any:
                return _tl.effect()

            fn = tools[tool] = body
        return fn(key, args)

    return call


def idemgate_normal_subject(store: str, s: Stores, wal_limit: str | None = None) -> Subject | Unsupported:
    """idemgate on SQLite at the durability exactly-once runs at (synchronous=NORMAL), with the
    store's default ``wal_limit`` or the one given."""
    name = "idemgate (durability=normal" + (f", wal_limit={wal_limit})" if wal_limit else ")")
    if store != "SQLite":
        return Unsupported(name, "an option of the SQLite store only")
    file = f"idemgate-normal-{wal_limit}.db" if wal_limit else "idemgate-normal.db"
    engine = Engine.open(
        f"sqlite://{s.tmp / file}?durability=normal" + (f"&wal_limit={wal_limit}" if wal_limit else ""),
        tenant=f"bench-{s.run}",
        journal=str(s.tmp / f"journal-{file}"),
        default=Policy(ttl=120),
    )

    def call(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
        return engine.call(tool, key, args, effect, wait=30).value

    return Subject(
        name,
        call,
        decorated=idemgate_decorated(engine),
        note="synchronous=NORMAL, as exactly-once: a power cut may lose the last commits",
    )


def powertools_subject(store: str, s: Stores) -> Subject | Unsupported:
    if store != "Redis":
        return Unsupported("aws-lambda-powertools", "no such store (DynamoDB or Redis/Valkey only)")
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    # No payload validation: in 3.37.0 the Redis layer's _update_record drops the validation
    # hash, so with payload_validation_jmespath every replay raises IdempotencyValidationError.
    config = IdempotencyConfig(
        event_key_jmespath="key", raise_on_no_idempotency_key=True, expires_after_seconds=120
    )
    tools: dict[str, Callable[..., Any]] = {}

    def call(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
        fn = tools.get(tool)
        if fn is None:

            def body(data: dict[str, Any]) -> Any:
                return _tl.effect()

            body.__name__ = tool
            fn = tools[tool] = idempotent_function(
                body,
                data_keyword_argument="data",
                # One layer per function: a layer is configured by the first function using it.
                persistence_store=RedisCachePersistenceLayer(url=s.redis),
                config=config,
                key_prefix=f"{s.run}-{tool}",
            )
        return fn(data={"key": key, "args": args})

    return Subject(
        "aws-lambda-powertools",
        call,
        decorated=call,  # its decorator already
        note="a duplicate in flight raises IdempotencyAlreadyInProgressError (no waiting); "
        "payload validation off (3.37.0: its Redis layer drops the payload hash, so every replay "
        "would be refused)",
    )


def exactly_once_subject(store: str, s: Stores) -> Subject | Unsupported:
    from exactly_once import Store, once, wait

    if store == "memory":
        st = Store.memory()
    elif store == "SQLite":
        st = Store.sqlite(str(s.tmp / "exactly-once.db"))
    elif store == "PostgreSQL":
        st = Store.postgres(s.pg_dsn())
    else:
        st = Store.redis(s.redis, prefix=f"eo-bench-{s.run}:", committed_ttl=120)
    guarded = once(
        st,
        key=lambda tool, key, args: f"{tool}:{key}",
        fingerprint=lambda tool, key, args: args,
        policy=wait(timeout=30),
    )(_effect)

    def call(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
        return guarded(tool, key, args)

    note = {
        "memory": "",
        "SQLite": "WAL with synchronous=NORMAL: a power cut may lose the last commits (idemgate: FULL)",
        "PostgreSQL": "SERIALIZABLE transactions",
        "Redis": "",
    }[store]
    return Subject(
        "exactly-once", call, close=getattr(st, "close", lambda: None), note=note, decorated=call
    )


def agent_once_subject(store: str, s: Stores) -> Subject | Unsupported:
    if store in ("memory", "Redis"):
        return Unsupported("agent-once", "no such store (SQLite or PostgreSQL only)")
    from once import Once

    if store == "SQLite":
        o = Once(str(s.tmp / "agent-once.db"), wait=30)
    else:
        from once.postgres import PostgresStore

        o = Once(store=PostgresStore(s.pg_dsn()), wait=30)

    def tool_fn(k: Any) -> Any:
        return _tl.effect()

    def call(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
        return o.execute(tool_fn, key=f"{tool}:{key}", tool_name=tool, **args)

    tools: dict[str, Callable[..., Any]] = {}

    def decorated(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
        fn = tools.get(tool)
        if fn is None:

            def body(k: Any, idempotency_key: str | None = None) -> Any:
                return _tl.effect()

            fn = tools[tool] = o.tool(name=tool)(body)
        # The caller's key, as its README passes one: used as the record's key.
        return fn(idempotency_key=f"{tool}:{key}", **args)

    return Subject(
        "agent-once", call, close=getattr(o.store, "close", lambda: None), decorated=decorated
    )


def idempotent_tools_subject(store: str, s: Stores) -> Subject | Unsupported:
    if store in ("memory", "PostgreSQL"):
        return Unsupported("idempotent-tools", "no such store (SQLite or Redis only)")
    from idempotent_tools import idempotent

    close = lambda: None  # noqa: E731
    if store == "SQLite":
        from idempotent_tools.backends.sqlite_backend import SQLiteBackend

        backend: Any = SQLiteBackend(str(s.tmp / "idempotent-tools.db"))
    else:
        import redis

        from idempotent_tools.backends.redis_backend import RedisBackend

        prefix = f"it-bench-{s.run}:"
        client = redis.Redis.from_url(s.redis, decode_responses=True)
        backend = RedisBackend(prefix=prefix, client=client)
        used: set[str] = set()

        def close() -> None:
            # Its records never expire: delete this run's, by key (no SCAN of a shared server).
            keys = [prefix + k for k in used]
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])

    guarded = idempotent(backend=backend, on_duplicate="block", poll_interval=0.01, poll_timeout=30)(
        _effect
    )

    def call(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
        k = f"{tool}:{key}"
        if store == "Redis":
            used.add(k)
        return guarded(args, idempotency_key=k)

    return Subject(
        "idempotent-tools",
        call,
        close=close,
        decorated=call,  # its decorator already
        note="no argument fingerprint"
        + ("; a read-then-write claim (not atomic), as its README says" if store == "Redis" else ""),
    )


# ---- the floors: the store's own client doing a fresh call's writes, nothing more ------------------


def floor_subject(store: str, s: Stores) -> Subject | Unsupported:
    """What the store costs a fresh call with no idempotency library at all: on Redis two round
    trips of redis-py (a ``SET NX`` that claims, a ``SET XX`` that stores the result); on SQLite
    Python's sqlite3 running the engine's own two statements (its ``INSERT`` of the in-flight row,
    its ``UPDATE`` to completed) on the engine's own schema and indexes, in WAL at
    ``synchronous=NORMAL``, each statement its own transaction. A replay costs one read. Nothing
    is checked, so it is a bound, not a peer: the ratio column leaves it out, and idemgate's rows
    say how far they are from it."""
    if store == "Redis":
        import json

        import redis

        client = redis.Redis.from_url(s.redis)
        prefix = f"floor-bench-{s.run}:"

        def call(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
            name = f"{prefix}{tool}:{key}"
            if not client.set(name, b"in_flight", nx=True, px=120_000):
                return json.loads(client.get(name))
            value = effect()
            client.set(name, json.dumps(value), xx=True, px=120_000)
            return value

        return Subject(FLOOR, call, close=client.close, decorated=call)
    if store == "SQLite":
        import json
        import sqlite3

        # The engine's schema, made by the engine, then left to sqlite3.
        path = s.tmp / "floor.db"
        Engine.open(f"sqlite://{path}?durability=normal", journal=str(s.tmp / "journal-floor")).close()
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        fingerprint, token = bytes(32), bytes(16)

        def call(tool: str, key: str, args: dict[str, Any], effect: Callable[[], Any]) -> Any:
            now = int(time.time() * 1000)
            try:
                db.execute(
                    "INSERT INTO idemgate_record (tenant, tool, key, fingerprint, fence, token, "
                    "created_at, state, lease_until) VALUES ('floor', ?, ?, ?, 1, ?, ?, 0, ?)",
                    (tool, key, fingerprint, token, now, now + 60_000),
                )
            except sqlite3.IntegrityError:
                row = db.execute(
                    "SELECT outcome_body FROM idemgate_record WHERE tenant = 'floor' AND tool = ? "
                    "AND key = ?",
                    (tool, key),
                ).fetchone()
                return json.loads(row[0])
            value = effect()
            db.execute(
                "UPDATE idemgate_record SET state = 1, lease_until = NULL, completed_at = ?, "
                "expires_at = ?, retain_until = ?, outcome_kind = 0, outcome_body = ? "
                "WHERE tenant = 'floor' AND tool = ? AND key = ?",
                (now, now + 120_000, now + 120_000, json.dumps(value).encode(), tool, key),
            )
            return value

        return Subject(FLOOR, call, close=db.close, decorated=call, note="synchronous=NORMAL")
    return Unsupported(FLOOR, "measured on Redis and SQLite only")


FLOOR = "floor: the store's client alone"


LIBRARIES: list[Callable[[str, Stores], Subject | Unsupported]] = [
    idemgate_subject,
    idemgate_normal_subject,
    powertools_subject,
    exactly_once_subject,
    agent_once_subject,
    idempotent_tools_subject,
    floor_subject,
]


def subjects(store: str, s: Stores, peers: bool) -> Iterator[Subject | Unsupported]:
    for make in LIBRARIES if peers else [*LIBRARIES[:2], floor_subject]:
        try:
            yield make(store, s)
        except Exception as e:  # noqa: BLE001 - a peer that does not start is reported, not fatal
            yield Unsupported(make.__name__.removesuffix("_subject").replace("_", "-"), f"{type(e).__name__}: {e}")
        if make is idemgate_normal_subject:
            for limit in s.wal_limits:
                yield idemgate_normal_subject(store, s, limit)


@contextmanager
def postgres_schema(s: Stores) -> Iterator[None]:
    """This run's schema for the peers' tables, dropped at the end (idemgate uses its own)."""
    if not s.postgres:
        yield
        return
    import psycopg

    with psycopg.connect(s.postgres.replace("postgres://", "postgresql://", 1), autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{s.pg_schema}"')
    try:
        yield
    finally:
        with psycopg.connect(s.postgres.replace("postgres://", "postgresql://", 1), autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{s.pg_schema}" CASCADE')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=2000, help="calls per fresh/replay round")
    ap.add_argument("--only", help="run only stores whose name contains this")
    ap.add_argument("--no-peers", action="store_true", help="idemgate only")
    ap.add_argument("--workload", help="run only workloads whose name contains this")
    ap.add_argument(
        "--wal-limit",
        action="append",
        default=[],
        help="also idemgate on SQLite at durability=normal with this wal_limit (4MiB; repeatable)",
    )
    ap.add_argument(
        "--load",
        type=int,
        default=0,
        help="run this many busy processes beside the bench for the whole run (a loaded machine, "
        "reproduced: each spins one core), stopped at the end",
    )
    args = ap.parse_args()
    with busy(args.load):
        run_all(args)


@contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` processes that each spin a core until the block ends."""
    import subprocess
    import sys

    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()  # by its Popen handle: only this child, never a pid read back
            p.wait()


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min: {five:.1f})"


def run_all(args: argparse.Namespace) -> None:
    # Powertools warns on every call outside Lambda (no remaining-time context) and about its
    # layer's rename; neither changes what is measured.
    warnings.simplefilter("ignore")
    # (name, the workload, whether it calls through the library's decorator)
    workloads: list[tuple[str, Callable[[Call], tuple[float, Any]], bool]] = [
        ("fresh", lambda c: fresh(c, args.n), False),
        ("replay", lambda c: replay(c, args.n), False),
        ("storm 16x200", storm, False),
        ("storm 16x200, a barrier per key", storm_per_key, False),
        ("decorator fresh", lambda c: fresh(c, args.n), True),
        ("decorator replay", lambda c: replay(c, args.n), True),
    ]
    workloads = [w for w in workloads if not args.workload or args.workload in w[0]]
    stores = ["memory", "SQLite"]
    postgres = os.environ.get("IDEMGATE_TEST_POSTGRES_URL") or None
    redis = os.environ.get("IDEMGATE_TEST_REDIS_URL") or None
    stores += ["PostgreSQL"] if postgres else []
    stores += ["Redis"] if redis else []
    stores = [x for x in stores if not args.only or args.only.lower() in x.lower()]
    print(
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} cores, {load_note()}"
        + (f", {args.load} busy processes beside" if args.load else "")
        + "\n"
    )
    print(
        f"| store | workload | library | calls/s, median of {args.rounds} (min–max) "
        "| idemgate ÷ best peer | notes |"
    )
    print("|---|---|---|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        s = Stores(Path(tmp), postgres, redis, wal_limits=args.wal_limit)
        with postgres_schema(s) if not args.no_peers else _nothing():
            for store in stores:
                subs = list(subjects(store, s, not args.no_peers))
                for workload, run, through_decorator in workloads:
                    medians: dict[str, float] = {}
                    rows = []
                    # The libraries take turns round by round, so that a change in the machine's
                    # load during the run falls on all of them alike.
                    calls: dict[str, Call] = {}
                    failed: dict[str, str] = {}
                    results: dict[str, list[tuple[float, Any]]] = {}
                    # The floor checks nothing, so a storm's racing callers would read each
                    # other's unfinished writes: it stands beside fresh calls and replays only.
                    in_storm = workload.startswith("storm")
                    for sub in subs:
                        if isinstance(sub, Subject) and not (in_storm and sub.library == FLOOR):
                            call = sub.decorated if through_decorator else sub.call
                            if call is not None:
                                calls[sub.library] = call
                                results[sub.library] = []
                    for _ in range(args.rounds):
                        for library, call in calls.items():
                            if library in failed:
                                continue
                            try:
                                results[library].append(run(call))
                            except Exception as e:  # noqa: BLE001 - reported in the table
                                failed[library] = f"{type(e).__name__}: {e}"[:200]
                    for sub in subs:
                        if isinstance(sub, Unsupported):
                            if sub.library.startswith("idemgate ("):
                                continue  # a variant of a store this row is not
                            rows.append((sub.library, "—", sub.why))
                            continue
                        if sub.library == FLOOR and in_storm:
                            continue
                        if sub.library not in calls:
                            rows.append((sub.library, "—", "no decorator"))
                            continue
                        if sub.library in failed:
                            rows.append((sub.library, "failed", failed[sub.library]))
                            continue
                        rates = [r for r, _ in results[sub.library]]
                        storms = [n for _, n in results[sub.library] if isinstance(n, Storm)]
                        notes = [storm_note(storms)] if storms else []
                        notes += sorted({n for _, n in results[sub.library] if n and isinstance(n, str)})
                        notes += [sub.note] if sub.note else []
                        medians[sub.library] = statistics.median(rates)
                        rows.append(
                            (
                                sub.library,
                                f"{statistics.median(rates):,.0f} ({min(rates):,.0f}–{max(rates):,.0f})",
                                "; ".join(notes),
                            )
                        )
                    peers = [
                        v for k, v in medians.items() if not k.startswith("idemgate") and k != FLOOR
                    ]

                    def ratio(library: str) -> str:
                        if library not in medians or not library.startswith("idemgate") or not peers:
                            return ""
                        r = medians[library] / max(peers)
                        return f"{r:.1f}×" if r >= 1 else f"{r:.2f}×"

                    for library, rate, note in rows:
                        shown = ratio(library)
                        if library.startswith("idemgate") and library in medians and FLOOR in medians:
                            of_floor = f"{medians[library] / medians[FLOOR]:.2f}× the floor"
                            note = f"{of_floor}; {note}" if note else of_floor
                        print(f"| {store} | {workload} | {library} | {rate} | {shown} | {note} |", flush=True)
                for sub in subs:
                    if isinstance(sub, Subject):
                        sub.close()
                print(f"|  |  | ({store} done: {load_note()}) |  |  |  |", flush=True)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


if __name__ == "__main__":
    main()
