"""Refusals of the in-process engine: the kit's problem document (its facts as members, its
words for a person as the message and for a model as ``for_model``), as every door has it."""

from __future__ import annotations

from pathlib import Path

import pytest

from idemgate import Engine, KeyReused, mint_key
from idemgate.errors import PROBLEM_PREFIX, NotResolvable


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine.open(f"sqlite://{tmp_path / 'idem.db'}", tenant="local")


def test_a_reused_key_says_so_to_a_person_and_a_model_with_its_facts(engine: Engine) -> None:
    key = mint_key()
    engine.call("charge", key, {"amount": 1}, lambda: 1)
    with pytest.raises(KeyReused) as e:
        engine.call("charge", key, {"amount": 2}, lambda: 1)
    refused = e.value
    assert refused.type == f"{PROBLEM_PREFIX}key-reused" and refused.status == 422
    assert "different arguments" in str(refused) and key in str(refused), str(refused)
    assert refused.for_model is not None and "other arguments" in refused.for_model
    assert refused.problem["key"] == key
    assert refused.problem["rule"] == "explicit"
    assert refused.problem["first_seen"]


def test_a_record_in_another_state_says_its_state_and_fence(engine: Engine) -> None:
    key = mint_key()
    engine.call("charge", key, None, lambda: 1)
    record = engine.record("charge", key)
    assert record is not None
    with pytest.raises(NotResolvable) as e:
        engine.resolve("charge", key, record["fence"], "release")
    assert e.value.state == "completed" and e.value.fence == record["fence"]
    assert e.value.for_model is not None and "Nothing was changed" in e.value.for_model
