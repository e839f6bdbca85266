"""Benchmark of the HTTP clients' connections: replayed ``begin`` calls per second against a real
``idemgate serve`` (memory store), with the keep-alive ``Client``, the same ``Client`` forced to
open a new connection per call (as before keep-alive), and the ``AsyncClient``; medians of
``--rounds`` (default 5) with min–max, one run.

Usage: python clients/python/bench/bench_http.py path/to/idemgate [--rounds 5] [-n 500]
(a release build of the binary for numbers that measure the client rather than the gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from idemgate import AsyncClient, Client, mint_key

TOKEN = "bench-token-0123456789"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        sha = hashlib.sha256(TOKEN.encode()).hexdigest()
        (tmp / "c.toml").write_text(
            f'[server]\nlisten = "127.0.0.1:{port}"\nstore = "memory:"\n'
            f'[[tenants]]\nid = "bench"\ntoken_sha256 = "{sha}"\n[tools.t]\nlease = "10s"\n'
        )
        proc = subprocess.Popen(
            [args.binary, "serve", "--config", str(tmp / "c.toml")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ, XDG_DATA_HOME=str(tmp)),
        )
        try:
            run(f"http://127.0.0.1:{port}", proc, args.rounds, args.n)
        finally:
            proc.terminate()
            proc.wait()


def run(url: str, proc: subprocess.Popen[bytes], rounds: int, n: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the gateway did not start") from None
            time.sleep(0.05)
    client = Client(url, TOKEN)
    key = mint_key()
    b = client.begin("t", key, {})
    client.complete("t", key, b.lease, 1)

    def sync(reconnect: bool) -> float:
        start = time.perf_counter()
        for _ in range(n):
            assert client.begin("t", key, {}).replayed
            if reconnect:
                client.close()
        return n / (time.perf_counter() - start)

    async def asynchronous() -> float:
        async with AsyncClient(url, TOKEN) as ac:
            start = time.perf_counter()
            for _ in range(n):
                assert (await ac.begin("t", key, {})).replayed
            return n / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"Client (keep-alive)": [], "Client, a new connection per call": [], "AsyncClient": []}
    for _ in range(rounds):
        rates["Client (keep-alive)"].append(sync(False))
        rates["Client, a new connection per call"].append(sync(True))
        rates["AsyncClient"].append(asyncio.run(asynchronous()))
    base = statistics.median(rates["Client, a new connection per call"])
    print(f"| client | replayed begins/s, median of {rounds} (min–max) | ÷ new connection per call |")
    print("|---|---:|---:|")
    for name, v in rates.items():
        m = statistics.median(v)
        print(f"| {name} | {m:,.0f} ({min(v):,.0f}–{max(v):,.0f}) | {m / base:.2f}× |")


if __name__ == "__main__":
    main()
