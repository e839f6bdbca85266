"""Benchmark of the in-process engine (``idemgate.Engine``), as issue 10 §3 defines the workloads:

- ``fresh``: unique keys, one thread, a counting side effect;
- ``replay``: one key repeated, one thread;
- ``storm``: 16 threads released by a barrier over the same 200 keys, counting executions per key
  (0 double executions is the guarantee) and what the losers got.

Each workload runs ``--rounds`` times (default 5) per store; the table shows the median calls/s and
the min–max. Stores: ``memory:``, a temporary SQLite file, and PostgreSQL / Redis when
``IDEMGATE_TEST_POSTGRES_URL`` / ``IDEMGATE_TEST_REDIS_URL`` are set (fresh keys each round, so
shared servers need no cleaning). Run it with a release build of the package (scripts/bench-python).

Not here yet: the Python peers of the issue (aws-lambda-powertools, exactly-once, agent-once,
idempotent-tools) in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from idemgate import Engine, IdemgateError, Policy, mint_key


def fresh(engine: Engine, n: int) -> tuple[float, str]:
    runs = [0]

    def effect() -> dict[str, int]:
        runs[0] += 1
        return {"n": runs[0]}

    prefix = mint_key()
    start = time.perf_counter()
    for i in range(n):
        engine.call("bench_fresh", f"{prefix}-{i}", {"i": i}, effect)
    took = time.perf_counter() - start
    assert runs[0] == n, runs
    return n / took, ""


def replay(engine: Engine, n: int) -> tuple[float, str]:
    runs = [0]

    def effect() -> dict[str, int]:
        runs[0] += 1
        return {"n": runs[0]}

    key = mint_key()
    engine.call("bench_replay", key, {"k": 1}, effect)
    start = time.perf_counter()
    for _ in range(n):
        engine.call("bench_replay", key, {"k": 1}, effect)
    took = time.perf_counter() - start
    assert runs[0] == 1, runs
    return n / took, ""


def storm(engine: Engine, keys: int = 200, threads: int = 16) -> tuple[float, str]:
    prefix = mint_key()
    names = [f"{prefix}-{i}" for i in range(keys)]
    executions: Counter[str] = Counter()
    answers: Counter[str] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def racer() -> None:
        barrier.wait()
        for name in names:

            def effect(name: str = name) -> int:
                with lock:
                    executions[name] += 1
                return 1

            try:
                r = engine.call("bench_storm", name, {"k": name}, effect, wait=30)
                kind = r.verdict
            except IdemgateError as e:
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
    note = f"double executions {doubles}, keys never run {missing}; " + ", ".join(
        f"{k} {v}" for k, v in sorted(answers.items())
    )
    return keys * threads / took, note


def stores(tmp: Path) -> list[tuple[str, str]]:
    out = [("memory", "memory:"), ("SQLite", f"sqlite://{tmp / 'bench.db'}")]
    if os.environ.get("IDEMGATE_TEST_POSTGRES_URL"):
        out.append(("PostgreSQL", os.environ["IDEMGATE_TEST_POSTGRES_URL"]))
    if os.environ.get("IDEMGATE_TEST_REDIS_URL"):
        url = os.environ["IDEMGATE_TEST_REDIS_URL"]
        out.append(("Redis", url + ("&" if "?" in url else "?") + "allow_volatile=true"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=2000, help="calls per fresh/replay round")
    ap.add_argument("--only", help="run only stores whose name contains this")
    args = ap.parse_args()
    workloads: list[tuple[str, Callable[[Engine], tuple[float, str]]]] = [
        ("fresh", lambda e: fresh(e, args.n)),
        ("replay", lambda e: replay(e, args.n)),
        ("storm 16x200", storm),
    ]
    print("| store | workload | calls/s, median of %d (min–max) | notes |" % args.rounds)
    print("|---|---|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, url in stores(Path(tmp)):
            if args.only and args.only.lower() not in name.lower():
                continue
            # Records kept 2 minutes: the shared servers are not left holding thousands of them
            # (Redis expires them itself; a full SCAN of a big Redis slows other suites).
            engine = Engine.open(
                url,
                tenant="bench",
                journal=str(Path(tmp) / f"journal-{name}"),
                default=Policy(ttl=120),
            )
            for workload, run in workloads:
                results = [run(engine) for _ in range(args.rounds)]
                rates = [r for r, _ in results]
                notes = {n for _, n in results if n}
                print(
                    f"| {name} | {workload} | {statistics.median(rates):,.0f} "
                    f"({min(rates):,.0f}–{max(rates):,.0f}) | {'; '.join(sorted(notes))} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
