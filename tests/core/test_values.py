"""The stored value range (core/values.py): what is refused at the API and how task output is
bounded — checked against BSON itself, so "within the range" means "MongoDB can store it"."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import bson
import msgspec
import pytest

from core.errors import InvalidRequest
from core.model import ExecutionStatus, StatusEvent
from core.values import (
    MAX_DEPTH,
    MAX_ERROR_CHARS,
    MAX_INT,
    MAX_PARAMETERS_BYTES,
    MAX_RESULT_BYTES,
    MIN_INT,
    _first_problem,
    check_parameters,
    storable_error,
    storable_event,
    storable_result,
    value_problem,
)

T0 = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def bson_storable(value: Any) -> bool:
    """Whether a document holding ``value`` one level down encodes as BSON (client side)."""
    try:
        bson.encode({"v": value})
    except (bson.errors.InvalidDocument, OverflowError, UnicodeEncodeError):
        return False
    return True


OUTSIDE = [
    pytest.param({"n": 2**63}, "parameters.n", id="int-above-int64"),
    pytest.param({"n": MIN_INT - 1}, "parameters.n", id="int-below-int64"),
    pytest.param({"a": [1, {"b": 2**64}]}, "parameters.a[1].b", id="nested-int"),
    pytest.param({"a": {"k\x00y": 1}}, "parameters.a.k\\u0000y", id="nul-in-key"),
    pytest.param({"s": "\ud800"}, "parameters.s", id="lone-surrogate"),
    pytest.param({"f": float("nan")}, "parameters.f", id="nan"),
    pytest.param({"d": nested(MAX_DEPTH)}, "parameters.d" + "[0]" * (MAX_DEPTH - 1), id="depth"),
]


@pytest.mark.parametrize(("parameters", "field"), OUTSIDE)
def test_parameters_outside_the_range_are_refused_naming_the_field(
    parameters: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_parameters(parameters)
    assert [e.field for e in info.value.errors] == [field]


def test_the_range_is_what_bson_can_hold() -> None:
    """Every refused example really is unstorable in BSON or beyond a documented bound, and the
    values at the edges are accepted and encode."""
    for p in OUTSIDE:
        (parameters, _), name = p.values, p.id
        if name not in ("depth", "nan"):  # bounds of our own: MongoDB's 100 levels, JSON's NaN
            assert not bson_storable(parameters), name
    edge = {
        "max": MAX_INT,
        "min": MIN_INT,
        "$dollar": {"a.b": "dots and dollars nest fine on MongoDB 5.0+"},
        "deep": nested(MAX_DEPTH - 1),
        "text": "ünïcødé \U0001f600 \x00 in a value is fine",
    }
    assert value_problem(edge, "parameters") is None
    check_parameters(edge)
    assert bson_storable(edge)


SCALARS = [None, True, 0, MAX_INT, MIN_INT, 2**63, -(2**63) - 1, 1.5, float("nan"), "x",
           "\udcff", "ü", (1, 2)]  # fmt: skip
KEYS = ["a", "b.c", "$d", "k\x00", "\ud800", "ü"]


def random_value(rng: random.Random, budget: list[int], depth: int = 0) -> Any:
    """A random JSON-ish value of at most ``budget[0]`` nodes, now and then outside the range
    (nested too deeply, beyond 64 bits, NUL or a lone surrogate, NaN, not JSON)."""
    budget[0] -= 1
    roll = rng.random()
    if budget[0] > 0 and roll < 0.45:
        return [random_value(rng, budget, depth + 1) for _ in range(rng.randint(0, 2))]
    if budget[0] > 0 and roll < 0.9:
        keys = rng.choices(KEYS, weights=[20, 5, 5, 1, 1, 5], k=2)
        return {k: random_value(rng, budget, depth + 1) for k in keys}
    return rng.choices(SCALARS, weights=[3, 3, 3, 3, 3, 1, 1, 3, 1, 3, 1, 3, 1])[0]


@pytest.mark.parametrize("seed", range(200))
def test_the_fast_check_and_the_field_naming_walk_agree(seed: int) -> None:
    rng = random.Random(seed)
    value: Any = random_value(rng, [120])
    for _ in range(rng.choice([0, 0, 27, 29, 30, 31])):  # near the depth bound, now and then
        value = [value]
    value = {"p": value}
    assert (value_problem(value, "parameters") is None) == (_first_problem(value, "x") is None)


def test_parameters_are_bounded_in_size() -> None:
    check_parameters({"s": "x" * (MAX_PARAMETERS_BYTES - 16)})
    with pytest.raises(InvalidRequest) as info:
        check_parameters({"s": "x" * MAX_PARAMETERS_BYTES})
    assert info.value.errors[0].field == "parameters"


def test_a_result_within_the_range_is_kept_as_it_is() -> None:
    result = {"rows": [1, 2.5, "x", None, True], "n": MAX_INT, "nested": {"$a": {"b.c": []}}}
    assert storable_result(result) == result


def test_a_result_outside_the_range_is_stringified_and_bounded() -> None:
    got = storable_result(
        {
            "big": 2**64,
            "small": -(2**70),
            "k\x00": "\ud800x",
            "nan": float("inf"),
            "deep": nested(MAX_DEPTH + 5),
            "when": T0,
            3: (1, 2),
        }
    )
    assert got["big"] == str(2**64) and got["small"] == str(-(2**70))
    assert got["k\ufffd"] == "\\ud800x"
    assert got["nan"] is None
    assert got["when"] == "2026-06-01T08:00:00Z"
    assert got["3"] == [1, 2]
    inner = got["deep"]
    for _ in range(MAX_DEPTH - 1):
        inner = inner[0]
    assert inner == "[[[[[[1]]]]]]"
    assert bson_storable(got) and value_problem(got, "result") is None
    assert storable_result("x" * MAX_RESULT_BYTES) == {
        "truncated": True,
        "bytes": MAX_RESULT_BYTES + 2,
    }
    assert storable_result(object())["unencodable"].startswith("<object object at")
    assert set(storable_result(nested(5000))) == {"unencodable"}  # deeper than Python recurses


def test_an_error_is_valid_text_and_bounded() -> None:
    assert storable_error(None) is None
    assert storable_error("bad \udcff byte") == "bad \\udcff byte"
    assert storable_error("e" * (MAX_ERROR_CHARS + 10)) == "e" * MAX_ERROR_CHARS


def test_an_event_is_replaced_only_when_it_must_be() -> None:
    plain = StatusEvent(
        execution_id="j:1",
        job_id="j",
        owner="alice",
        partition=1,
        task_id="t",
        status=ExecutionStatus.FAILED,
        attempt=1,
        at=T0,
        scheduled_for=T0,
        error="boom",
    )
    assert storable_event(plain) is plain
    poisoned = msgspec.structs.replace(plain, result={"n": 2**64}, error="\ud800")
    fixed = storable_event(poisoned)
    assert (fixed.result, fixed.error) == ({"n": str(2**64)}, "\\ud800")
    assert msgspec.json.decode(msgspec.json.encode(fixed), type=StatusEvent) == fixed
