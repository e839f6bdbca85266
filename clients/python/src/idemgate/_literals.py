"""The strings the engine and the gateway accept for the options the package types, as literal
unions (the Node package's ``.d.ts`` has the same): a type checker refuses a misspelt one before
the native module does (``ValueError``). Exported by :mod:`idemgate`."""

from __future__ import annotations

from typing import Literal, TypeAlias

__all__ = ["Mode", "OnUnknown", "RecordState", "Resolution", "ToolKind"]

#: A tool's kind (``Policy.kind``): ``"write"`` (gated, the default), ``"read"`` or
#: ``"natural_idempotent"`` (run without a record).
ToolKind: TypeAlias = Literal["write", "read", "natural_idempotent"]

#: What a call finding its record unknown does (``Policy.on_unknown``): ``"block"`` (raise
#: ``OutcomeUnknown``, the default), ``"retry"`` (run again) or ``"verify"`` (ask the tool's
#: verifier).
OnUnknown: TypeAlias = Literal["block", "retry", "verify"]

#: Whether the gate acts (``Policy.mode``): ``"enforce"`` (the default) or ``"observe"``, shadow
#: mode: every call runs, and what enforce mode would have done is recorded in the history of
#: the record a call duplicates.
Mode: TypeAlias = Literal["enforce", "observe"]

#: A record's state, as ``records(state=...)`` filters them: ``"expired"`` is a completed record
#: past its ttl, within its tombstone.
RecordState: TypeAlias = Literal["in_flight", "completed", "unknown", "expired"]

#: How an operator resolves an unknown record: ``"completed"`` (with the result the side effect
#: had) or ``"release"`` (it did not happen: the next call runs).
Resolution: TypeAlias = Literal["completed", "release"]
