"""Keys: derive_key matches the Rust implementation (via the binary), mint_key is fresh."""

from __future__ import annotations

import subprocess

import pytest

from conftest import idemgate_bin
from idemgate import check_key, derive_key, mint_key

CASES = [
    ("R", "S"),
    ("run-1", "call-7"),
    ("ab", "c"),
    ("a", "bc"),
    ("2f1c7d0e-agent-run", "3"),
    ("ünïcødé-run", "stép-🙂"),
    ("x" * 300, "tool_call_0001"),
]


@pytest.mark.parametrize(("run", "step"), CASES)
def test_derive_key_matches_the_binary(run: str, step: str) -> None:
    out = subprocess.run(
        [str(idemgate_bin()), "key", "derive", "--run", run, "--step", step],
        check=True,
        capture_output=True,
        text=True,
    )
    assert derive_key(run, step) == out.stdout.strip()


def test_derived_keys_are_stable_distinct_and_valid() -> None:
    assert derive_key("run-1", "call-7") == derive_key("run-1", "call-7")
    assert derive_key("run-1", "call-7") != derive_key("run-1", "call-8")
    assert derive_key("ab", "c") != derive_key("a", "bc")
    assert derive_key("r", 3) == derive_key("r", "3")
    k = derive_key("r", "s")
    assert k.startswith("run-") and len(k) == 4 + 32
    check_key(k)


def test_minted_keys_are_fresh_and_valid() -> None:
    keys = {mint_key() for _ in range(1000)}
    assert len(keys) == 1000
    for k in list(keys)[:10]:
        assert k.startswith("key-") and len(k) == 4 + 32
        check_key(k)


def test_check_key_limits() -> None:
    check_key("order-42:attempt")
    check_key("k" * 255)
    for bad in ("", "a b", "k" * 256, "héllo"):
        with pytest.raises(ValueError):
            check_key(bad)
