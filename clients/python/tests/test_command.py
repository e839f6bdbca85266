"""The ``idemgate`` command a ``pip install`` puts on PATH: the command line of the binary, run
in-process by the native module, with its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from idemgate import mint_key


def idemgate_script() -> Path:
    """The script pip installed beside this interpreter (the venv's ``bin/idemgate``)."""
    script = Path(sys.executable).parent / "idemgate"
    assert script.exists(), f"{script} is missing: pip install ./clients/python puts it there"
    return script


def run(*args: str, store: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--store", f"sqlite://{store}"] if store else []
    return subprocess.run(
        [str(idemgate_script()), *args[:1], *extra, *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_installed_command_runs_a_command_once_per_key(tmp_path: Path) -> None:
    db, marker, key = tmp_path / "idemgate.db", tmp_path / "ran", mint_key()
    cmd = ["exec", "--key", key, "--", "sh", "-c", f"echo run >> '{marker}'; echo sent; exit 3"]
    first = run(*cmd, store=db)
    assert first.returncode == 3, first.stderr
    assert first.stdout == "sent\n"
    again = run(*cmd, store=db)
    assert again.returncode == 3 and again.stdout == "sent\n", again.stderr
    assert "replayed" in again.stderr, again.stderr
    assert marker.read_text() == "run\n", "the command ran once"
    listed = run("keys", "list", "--json", store=db)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["key"]["key"], r["state"]) for r in rows] == [(key, "completed")]


def test_the_installed_command_teaches_and_refuses_bad_input() -> None:
    helped = run("--help")
    assert helped.returncode == 0 and "exec" in helped.stdout and "mcp" in helped.stdout
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("idemgate "), version.stdout
    wrong = run("exec", "--", "true")  # no --key
    assert wrong.returncode == 2 and "--key" in wrong.stderr, wrong.stderr
    as_module = subprocess.run(
        [sys.executable, "-m", "idemgate", "--version"], capture_output=True, text=True, timeout=60
    )
    assert as_module.returncode == 0 and as_module.stdout == version.stdout


SERVER = """
import sys
from pathlib import Path
from fastmcp import FastMCP

server = FastMCP("mailer")

@server.tool
def send_mail(to: str) -> str:
    with open(sys.argv[1], "a") as sent:
        sent.write(to + "\\n")
    return f"sent to {to}"

server.run()
"""


def test_the_installed_command_is_the_mcp_proxy_a_configuration_names(tmp_path: Path) -> None:
    """``"command": "idemgate", "args": ["mcp", "--", ...]`` as an MCP client's configuration
    has it, after a pip install: a re-sent call with the same key runs the tool once."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    (tmp_path / "server.py").write_text(SERVER)
    sent = tmp_path / "sent"
    params = StdioServerParameters(
        command=str(idemgate_script()),
        args=["mcp", "--store", f"sqlite://{tmp_path / 'idemgate.db'}", "--",
              sys.executable, str(tmp_path / "server.py"), str(sent)],
    )

    async def session() -> list[str]:
        texts = []
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                for _ in range(2):
                    result = await client.call_tool(
                        "send_mail", {"to": "a@example.com", "idempotency_key": "mail-1"}
                    )
                    assert not result.is_error, result
                    texts.append(" ".join(c.text for c in result.content if c.type == "text"))
        return texts

    first, again = anyio.run(session)
    assert "sent to a@example.com" in first and "sent to a@example.com" in again
    assert "not repeated" in again, again
    assert sent.read_text() == "a@example.com\n", "the tool ran once"
