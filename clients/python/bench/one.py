"""One library's fresh calls, once, for a tool that counts what a process does (``strace -f -c``
for fsyncs, a server's statement log for round trips, ``valgrind --tool=callgrind``): the same
subjects as ``bench.py``, with nothing else in the process.

    python one.py --store SQLite --library "idemgate (durability=normal)" -n 2000 --decorator
    python one.py --store SQLite --wal-limit 4MiB --library "idemgate (durability=normal, wal_limit=4MiB)" -n 2000

Run it twice with two ``-n`` and take the difference, so that opening the store and creating its
tables are not counted. PostgreSQL and Redis are read from ``IDEMGATE_TEST_POSTGRES_URL`` and
``IDEMGATE_TEST_REDIS_URL``, as in ``bench.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import bench  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--store", required=True, help="memory, SQLite, PostgreSQL or Redis"
    )
    ap.add_argument(
        "--library", required=True, help="a row's library name, as bench.py prints it"
    )
    ap.add_argument("-n", type=int, default=2000, help="fresh calls")
    ap.add_argument(
        "--decorator", action="store_true", help="through the library's own decorator"
    )
    ap.add_argument("--wal-limit", action="append", default=[], help="as bench.py's")
    args = ap.parse_args()
    postgres = os.environ.get("IDEMGATE_TEST_POSTGRES_URL") or None
    redis = os.environ.get("IDEMGATE_TEST_REDIS_URL") or None
    with tempfile.TemporaryDirectory() as tmp:
        s = bench.Stores(Path(tmp), postgres, redis, wal_limits=args.wal_limit)
        with (
            bench.postgres_schema(s) if args.store == "PostgreSQL" else bench._nothing()
        ):
            everyone = list(bench.subjects(args.store, s, True))
            subs = [x for x in everyone if x.library == args.library]
            if not subs or not isinstance(subs[0], bench.Subject):
                sys.exit(f"no library {args.library!r} on {args.store}: {subs}")
            call = subs[0].decorated if args.decorator else subs[0].call
            assert call is not None, "no decorator"
            rate, _ = bench.fresh(call, args.n)
            print(
                f"{args.library} on {args.store}: {args.n} fresh calls, {rate:,.0f}/s"
            )
            for sub in everyone:
                if isinstance(sub, bench.Subject):
                    sub.close()


if __name__ == "__main__":
    main()
