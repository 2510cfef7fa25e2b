"""tool-add: format, operand sizes, disjoint seeded splits, the typed prompt's record, the grade."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.data.records import PromptRecord
from glassrl.data.tasks import add, tool_add


def test_format_and_operand_sizes():
    records = tool_add.records("test", 0, 200)
    for i, r in enumerate(records):
        a, b = r.metadata["a"], r.metadata["b"]
        assert r.prompt == f"{a}+{b}=?" and r.answer == str(a + b) and r.source == f"task:tool-add/test#{i}"
        assert r.metadata == {"a": a, "b": b, "sum": a + b, "task": "tool-add", "tools": ["calculator"]}
        assert 100 <= a <= 9999 and 100 <= b <= 9999
    digits = {len(str(r.metadata["a"])) for r in records}
    assert digits == {3, 4}
    assert len({(r.metadata["a"], r.metadata["b"]) for r in records}) == 200  # no repeats


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_splits_are_disjoint_and_seeded(seed):
    train = {(r.metadata["a"], r.metadata["b"]) for r in tool_add.records("train", seed, 2000)}
    test = {(r.metadata["a"], r.metadata["b"]) for r in tool_add.records("test", seed, 500)}
    assert not train & test
    assert all(tool_add.split_of(a, b, seed) == "test" for a, b in test)
    assert tool_add.records("test", seed, 20) == tool_add.records("test", seed, 20)
    assert tool_add.records("test", seed, 20) != tool_add.records("test", seed + 1, 20)


def test_record_for_prompt_is_this_tasks_form_only():
    r = tool_add.record_for_prompt("4821+975=?")
    assert (r.prompt, r.answer, r.metadata["sum"]) == ("4821+975=?", "5796", 5796)
    assert tool_add.record_for_prompt("4821+975=") is None and add.record_for_prompt("4821+975=?") is None


@pytest.mark.parametrize(
    ("answer", "grade"),
    [("5796", 1.0), ("The sum is 5796.", 1.0), ("５７９６", 1.0), ("5795", 0.0), ("", 0.0), ("4821+975", 0.0)],
)
def test_grade_reads_the_last_number(answer, grade):
    record = PromptRecord("4821+975=?", "5796", {"sum": 5796})
    assert tool_add.grade(answer, record) == grade
