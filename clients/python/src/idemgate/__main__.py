"""The ``idemgate`` command, installed on PATH by ``pip install idemgate`` (and runnable as
``python -m idemgate``): the same command line as the binary cargo builds (``exec``, ``keys``,
``serve``, ``mcp``), run in-process by the package's native module."""

from __future__ import annotations

import signal
import sys

from . import _native


def main() -> None:
    """Runs ``idemgate`` with this process's arguments and exits with its exit code."""
    # The command handles its own signals (a gateway drains on SIGTERM, the MCP proxy stops its
    # server on SIGINT): give SIGINT back its default first, so that Python's handler, which only
    # sets a flag nobody reads while the command runs, does not swallow Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    argv = ["idemgate", *sys.argv[1:]]
    sys.exit(_native.run_command(argv))


if __name__ == "__main__":
    main()
