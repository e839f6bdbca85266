"""The arguments' fingerprint: the engine reads plain Python values directly, and must give exactly
the fingerprint (or the error) of their JSON text ``json.dumps(args, default=repr)``, which is what
the package fingerprinted before and what every other door computes from the same JSON."""

from __future__ import annotations

import enum
import json
import random
from collections import OrderedDict
from typing import Any

import pytest

from idemgate import _native


class Str(str):
    pass


class Color(enum.IntEnum):
    RED = 1


class Thing:
    def __repr__(self) -> str:
        return "Thing()"


def by_text(value: Any) -> str:
    return _native.fingerprint(json.dumps(value, default=repr))


PLAIN = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**63,  # beyond i64, within u64
    2**64 - 1,
    0.0,
    -0.0,
    1.0,
    2.5,
    1e16,
    1e-7,
    123456789.125,
    5e-324,
    1.7976931348623157e308,
    "",
    "plain",
    'quote " backslash \\ slash /',
    "\x00\x01\x1f\x7f controls\n\t\r\b\f",
    "é ü 日本 \U0001f600",
    [],
    (),
    {},
    [1, "a", None, [2, [3, {}]]],
    (1, (2, 3)),
    {"b": 1, "a": 2, "": 0, "B": 3},
    {"\U0001f600": 1, "\uffff": 2, "z": 3},  # UTF-16 order puts the emoji first
    {"args": [{"k": 1}, 2.0], "kwargs": {"call_id": "c-1", "nested": {"x": [1.5, -0.0]}}},
]

# Values the direct reading leaves to the JSON text: each must still give that text's answer.
OTHER = [
    2**64,
    -(2**64) - 1,
    10**40,
    Str("sub"),
    {Str("k"): 1},
    OrderedDict(b=1, a=2),
    Color.RED,
    {1: "int key", "2": "str key"},
    {True: 1, None: 2, 1.5: 3},
    {"set": {1, 2}},
    {"obj": Thing()},
    [[[[[[[[[[1]]]]]]]]]],
]


@pytest.mark.parametrize("value", PLAIN + OTHER, ids=repr)
def test_a_value_has_the_fingerprint_of_its_json_text(value: Any) -> None:
    assert _native.fingerprint_args(value) == by_text(value)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [127, 128, 129, 200])
def test_nesting_at_and_beyond_the_limit_answers_as_the_text_does(depth: int) -> None:
    value = nested(depth)
    try:
        expected: Any = by_text(value)
    except ValueError as e:
        expected = type(e)
    if isinstance(expected, str):
        assert _native.fingerprint_args(value) == expected
    else:
        with pytest.raises(expected):
            _native.fingerprint_args(value)


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), [1, -float("inf")], {"a": "\ud800"}, {"\udfff": 1}],
    ids=repr,
)
def test_what_the_text_refuses_is_refused(value: Any) -> None:
    with pytest.raises(ValueError):
        by_text(value)
    with pytest.raises(ValueError):
        _native.fingerprint_args(value)


def test_a_circular_value_raises_what_json_dumps_raises() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        json.dumps(loop, default=repr)
    with pytest.raises(ValueError, match="Circular reference"):
        _native.fingerprint_args(loop)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["none", "bool", "int", "bigint", "float", "str"]
    if depth < 4:
        kinds += ["list", "tuple", "dict"] * 2
    kind = rng.choice(kinds)
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.randint(-(2**64), 2**64)
    if kind == "bigint":
        return rng.choice([-1, 1]) * rng.randint(2**64, 2**200)
    if kind == "float":
        return rng.choice(
            [
                rng.uniform(-1e6, 1e6),
                rng.random() * 10 ** rng.randint(-320, 308),
                float(rng.randint(-(2**60), 2**60)),
                -0.0,
            ]
        )
    if kind == "str":
        alphabet = "aZ09 \"\\/\x00\x1f\x7fé日\U0001f600\uffff"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "tuple":
        return tuple(random_value(rng, depth + 1) for _ in range(rng.randint(0, 4)))
    # Mostly str keys; now and then another scalar, which JSON writes as a string.
    return {
        random_value(rng, 4) if rng.random() < 0.1 else str(random_value(rng, 4)): random_value(
            rng, depth + 1
        )
        for _ in range(rng.randint(0, 4))
    }


def test_random_values_have_the_fingerprint_of_their_json_text() -> None:
    rng = random.Random(20261203)
    compared = 0
    for _ in range(3000):
        value = random_value(rng)
        try:
            expected = by_text(value)
        except (TypeError, ValueError) as e:
            with pytest.raises(type(e)):
                _native.fingerprint_args(value)
            continue
        assert _native.fingerprint_args(value) == expected, value
        compared += 1
    assert compared > 2000
