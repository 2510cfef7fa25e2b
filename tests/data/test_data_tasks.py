"""The bundled tasks: exact formats, determinism, disjoint splits, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.data.tasks import DELTAS, MAX_OPERAND, TASKS, load_task, sft_pairs
from glassrl.errors import GlassrlError


def test_arith_verify_formats_are_exact():
    """Each record re-derived from its metadata, by the formats the verifiers depend on."""
    for i, r in enumerate(load_task("arith-verify", "train", size=400)):
        m = r.metadata
        a, b, c, s = m["a"], m["b"], m["c"], m["sum"]
        assert s == a + b and m["is_true"] == (c == s) and m["task"] == "arith-verify"
        assert 0 <= a <= MAX_OPERAND and 0 <= b <= MAX_OPERAND and c >= 0
        assert m["is_true"] or c - s in DELTAS or s - c in DELTAS
        if m["lang"] == "zh":
            assert r.prompt == f"请问{a}+{b}={c}？"
            assert r.answer == ("是的" if c == s else "不是") + f"，等于{s}！"
        else:
            assert m["lang"] == "en"
            assert r.prompt == f"Is {a}+{b}={c}?"
            assert r.answer == ("Yes" if c == s else "No") + f", it equals {s}!"
        assert r.source == f"task:arith-verify/train#{i}"


def test_arith_verify_is_balanced_and_bilingual():
    records = load_task("arith-verify", "train")
    true_share = sum(r.metadata["is_true"] for r in records) / len(records)
    zh_share = sum(r.metadata["lang"] == "zh" for r in records) / len(records)
    assert 0.45 < true_share < 0.55 and 0.45 < zh_share < 0.55
    assert {r.metadata["c"] - r.metadata["sum"] for r in records if not r.metadata["is_true"]} == set(DELTAS)


def test_add_format():
    for i, r in enumerate(load_task("add", "test", size=50)):
        a, b = r.metadata["a"], r.metadata["b"]
        assert r.prompt == f"{a}+{b}=" and r.answer == str(a + b)
        assert r.metadata == {"a": a, "b": b, "sum": a + b, "task": "add"}
        assert r.source == f"task:add/test#{i}"


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(sorted(TASKS)))
def test_deterministic_given_seed(seed, name):
    assert load_task(name, "train", seed=seed, size=50) == load_task(name, "train", seed=seed, size=50)
    assert load_task(name, "test", seed=seed, size=50) != load_task(name, "test", seed=seed + 1, size=50)


@pytest.mark.parametrize("seed", [0, 1])
def test_splits_disjoint_across_both_tasks(seed):
    """No test operand pair occurs in any train split, so neither task leaks test sums."""
    train = {(r.metadata["a"], r.metadata["b"]) for name in TASKS for r in load_task(name, "train", seed=seed)}
    test_records = [r for name in TASKS for r in load_task(name, "test", seed=seed)]
    assert not train & {(r.metadata["a"], r.metadata["b"]) for r in test_records}
    keys = lambda rs: {(r.metadata["a"], r.metadata["b"], r.metadata["c"], r.metadata["lang"]) for r in rs}  # noqa: E731
    assert not keys(load_task("arith-verify", "train", seed=seed)) & keys(load_task("arith-verify", "test", seed=seed))


def test_splits_cover_all_pairs_and_cycle_evenly():
    """20 test pairs and 80 train pairs; 500 test records visit each test pair 25 times."""
    from collections import Counter

    test = Counter((r.metadata["a"], r.metadata["b"]) for r in load_task("arith-verify", "test"))
    train = {(r.metadata["a"], r.metadata["b"]) for r in load_task("add", "train")}
    assert len(test) == 20 and set(test.values()) == {25} and len(train) == 80
    assert len(set(test) | train) == (MAX_OPERAND + 1) ** 2
    assert len(load_task("add", "train")) == 8000


def test_sft_pairs_are_prompt_and_answer():
    records = load_task("arith-verify", "test")
    assert sft_pairs("arith-verify", "test") == [(r.prompt, r.answer) for r in records]


@pytest.mark.parametrize(
    ("args", "message"),
    [(("nope", "train"), "valid tasks: arith-verify, add"), (("add", "dev"), "valid splits: train, test")],
)
def test_unknown_name_or_split_lists_valid(args, message):
    with pytest.raises(GlassrlError, match=message):
        load_task(*args)
