"""The plain form that crosses back from a reward worker: finite scores, JSON-able details."""

from __future__ import annotations

import datetime
import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.rewards import RewardResult
from glassrl.rewards.plain import finite_number, plain, plain_result, result_from_plain


@pytest.mark.parametrize(
    "value, expected",
    [(1, 1.0), (True, 1.0), (0.25, 0.25), (Fraction(1, 4), 0.25), (np.float32(0.5), 0.5), (np.int64(3), 3.0)]
    + [(torch.tensor(2.0), 2.0), (np.array([1.5]), 1.5)],
)
def test_finite_number_accepts_numbers(value, expected):
    assert finite_number(value) == expected and type(finite_number(value)) is float


@pytest.mark.parametrize(
    "value, message",
    [
        (10**400, "score must be a finite number, got an integer of 1329 bits (beyond a float's range)"),
        (float("nan"), "score must be a finite number, got nan"),
        (-math.inf, "score must be a finite number, got -inf"),
        (np.float64("inf"), "score must be a finite number, got inf"),
        ("0.5", "score must be a number, got str '0.5'"),
        (None, "score must be a number, got NoneType None"),
        (np.array([1.0, 2.0]), "score must be a number, got ndarray array([1., 2.])"),
        (Fraction(10**400, 3), "score must be a finite number, got Fraction("),
    ],
)
def test_finite_number_refuses_with_one_line(value, message):
    with pytest.raises(ValueError) as info:
        finite_number(value)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_plain_table():
    class Shouty:
        def __str__(self):
            return "LOUD"

    value = {
        "date": datetime.datetime(2025, 3, 4, 5, 6),
        "set": {3, 1, 2},
        "nan": float("nan"),
        "big": 2**70,
        7: b"caf\xc3\xa9",
        "array": np.arange(3),
        "nested": ((1, 2), [np.float32(0.5)]),
        "obj": Shouty(),
    }
    assert plain(value) == {
        "date": "2025-03-04T05:06:00",
        "set": [1, 2, 3],
        "nan": None,
        "big": "<integer of 71 bits>",
        "7": "café",
        "array": [0, 1, 2],
        "nested": [[1, 2], [0.5]],
        "obj": "LOUD",
    }


def test_a_user_object_whose_str_raises_is_still_plain():
    class Hostile:
        def __str__(self):
            raise RuntimeError("no")

        def __repr__(self):
            raise RuntimeError("no")

    assert plain({"x": Hostile()}) == {"x": "<Hostile>"}


def test_plain_result_and_back():
    reply = plain_result({"score": np.float64(0.5), "process_rewards": [(2, 1)], "why": {"a"}}, response_chars=3)
    assert reply == {"status": "ok", "score": 0.5, "process_rewards": [[2, 1.0]], "details": {"why": ["a"]}}
    assert result_from_plain(json.loads(json.dumps(reply)), "src") == RewardResult.ok(0.5, [(2, 1.0)], {"why": ["a"]})
    assert plain_result(10**400, 3)["message"].startswith("score must be a finite number")
    assert result_from_plain({"status": "error", "message": "boom"}, "src") == RewardResult.error("src: boom")
    assert (
        result_from_plain({"status": "ok", "score": "x"}, "src").message
        == "src: malformed result from the reward worker"
    )


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.dates(),
    st.fractions(),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.frozensets(st.integers(), max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers()), inner, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(_values)
def test_plain_is_always_strict_json(value):
    text = json.dumps(plain(value), allow_nan=False)
    assert plain(json.loads(text)) == json.loads(text)  # plain data stays as it is


@settings(max_examples=200, deadline=None)
@given(st.one_of(_values, st.integers()))
def test_finite_number_returns_a_finite_float_or_says_why(value):
    try:
        number = finite_number(value)
    except ValueError as err:
        assert str(err).startswith("score must be")
    else:
        assert isinstance(number, float) and math.isfinite(number)
