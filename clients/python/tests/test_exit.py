"""A program that used the engine from asyncio on a store with I/O exits cleanly.

The engine's runtime threads hand async answers back into Python. One still doing so when the
interpreter started shutting down aborted the process (``PyGILState_Release``, exit 134) or
crashed it, in about half of the runs of the program below, after every call had been answered.
Each engine is now stopped, its threads waited for, before the interpreter shuts down.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import asyncio, sys
    from idemgate import Engine

    async def main(path):
        engine = Engine.open("sqlite://" + path)

        async def work():
            return {"ok": 1}

        for i in range(20):
            await engine.acall("t", f"k{i}", {"i": i}, work)

    asyncio.run(main(sys.argv[1]))
    """
)


def test_an_async_program_on_sqlite_exits_cleanly_every_time(tmp_path):
    for run in range(8):
        db = tmp_path / f"exit-{run}.db"
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM, str(db)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (run, done.returncode, done.stderr[-2000:])


def test_a_closed_engine_refuses_calls_and_closing_twice_does_nothing(tmp_path):
    from idemgate import Engine

    with Engine.open("sqlite://" + str(tmp_path / "closed.db")) as engine:
        assert engine.call("t", "k", {}, lambda: 1).value == 1
    engine.close()
    try:
        engine.call("t", "k2", {}, lambda: 2)
    except RuntimeError as e:
        assert "closed" in str(e)
    else:
        raise AssertionError("a closed engine ran a call")
