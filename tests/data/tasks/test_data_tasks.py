"""The task registry: the one task:NAME/SPLIT parser, the shared train/test cut, determinism, errors."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.data.records import PromptRecord
from glassrl.data.tasks import TASKS, TaskRef, held_out_split, load_task, parse_task, record_for_prompt, sft_pairs
from glassrl.data.tasks.splits import MAX_OPERAND
from glassrl.errors import GlassrlError


@pytest.mark.parametrize(
    ("spec", "split", "expected"),
    [
        ("task:add", "train", TaskRef("add", "train")),
        ("task:add", "test", TaskRef("add", "test")),
        ("task:add/test", "train", TaskRef("add", "test")),
        ("task:arith-verify/train", "test", TaskRef("arith-verify", "train")),
        ("task:add/", "train", TaskRef("add", "train")),
        ("task:arith-verify-preferences/test", "train", TaskRef("arith-verify-preferences", "test")),
        ("data/task:add.jsonl", "train", None),
        ("prompts.jsonl", "train", None),
    ],
)
def test_parse_task(spec, split, expected):
    assert parse_task(spec, split=split) == expected


def test_task_ref_prints_as_the_spec_it_was_parsed_from():
    assert str(TaskRef("add", "test")) == "task:add/test"
    assert parse_task(str(TaskRef("arith-verify", "train"))) == TaskRef("arith-verify", "train")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("task:add", "task:add/test"),
        ("task:add/train", "task:add/test"),
        ("task:x/test", "task:x/test"),
        ("a.jsonl", None),
    ],
)
def test_held_out_split(spec, expected):
    assert held_out_split(spec) == expected


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
    test = Counter((r.metadata["a"], r.metadata["b"]) for r in load_task("arith-verify", "test"))
    train = {(r.metadata["a"], r.metadata["b"]) for r in load_task("add", "train")}
    assert len(test) == 20 and set(test.values()) == {25} and len(train) == 80
    assert len(set(test) | train) == (MAX_OPERAND + 1) ** 2
    assert len(load_task("add", "train")) == 8000


def test_sft_pairs_are_prompt_and_answer():
    records = load_task("arith-verify", "test")
    assert sft_pairs("arith-verify", "test") == [(r.prompt, r.answer) for r in records]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_record_for_prompt_gives_each_record_back(name):
    """A typed prompt of a task's form gets the record the task generated for it (source aside)."""
    for r in load_task(name, "test", size=40):
        found = record_for_prompt(r.prompt)
        assert found == PromptRecord(r.prompt, r.answer, r.metadata, repr(r.prompt))


@pytest.mark.parametrize("text", ["请问1+1=2", "Is 1+1=2？", "1+1", "hello", "", "1+1=2"])
def test_record_for_prompt_of_no_task_form_is_none(text):
    assert record_for_prompt(text) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [(("nope", "train"), "valid tasks: arith-verify, add"), (("add", "dev"), "valid splits: train, test")],
)
def test_unknown_name_or_split_lists_valid(args, message):
    with pytest.raises(GlassrlError, match=message):
        load_task(*args)
