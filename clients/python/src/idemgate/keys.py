"""Idempotency keys: made by the Rust ``IdempotencyKey::derive`` and ``mint`` themselves (the native
module), so they are the same keys every other door makes."""

from __future__ import annotations

from . import _native

MAX_KEY_LEN = 255


def derive_key(run_id: str, step: str | int) -> str:
    """A stable key for one step of one orchestration run: the same ``(run_id, step)`` always
    gives the same key (``run-`` + 32 hex digits), different steps never collide.

    Matches ``IdempotencyKey::derive`` and ``idemgate key derive --run R --step S``: SHA-256 over
    both parts, each prefixed by its UTF-8 length as a big-endian u64.
    """
    return _native.derive_key(run_id, str(step))


def mint_key() -> str:
    """A fresh random key (128 bits): mint it once per logical action, before the first
    attempt, and reuse it on every retry."""
    return _native.mint_key()


def check_key(key: str) -> str:
    """Checks that ``key`` is 1 to 255 visible ASCII characters (``!`` to ``~``)."""
    if not key:
        raise ValueError("idempotency key is empty")
    if len(key) > MAX_KEY_LEN:
        raise ValueError(f"idempotency key is {len(key)} characters long, at most {MAX_KEY_LEN}")
    for i, c in enumerate(key):
        if not ("!" <= c <= "~"):
            raise ValueError(f"idempotency key has {c!r} at position {i}: only '!' to '~'")
    return key
