"""The bundled preference set (arith-verify) and JSONL preference files."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.data.preferences import (
    BUNDLED,
    REJECTION_KINDS,
    _wrong_answer,
    load_labelled,
    load_preference_file,
    load_preferences,
    preference_pairs,
)
from glassrl.data.records import LabelledResponse, PreferencePair, PromptRecord
from glassrl.data.tasks import load_task
from glassrl.data.tasks.arith_verify import DELTAS
from glassrl.errors import GlassrlError

ANSWER = {
    "zh": re.compile(r"(是的|不是)，等于(\d+)！"),
    "en": re.compile(r"(Yes|No), it equals (\d+)!"),
}
TRUE_WORD = {"是的", "Yes"}


def _parse(text: str) -> tuple[bool, int]:
    """(verdict, sum) of an arith-verify answer in either language."""
    for pattern in ANSWER.values():
        match = pattern.fullmatch(text)
        if match:
            return match.group(1) in TRUE_WORD, int(match.group(2))
    raise AssertionError(f"not an arith-verify answer: {text!r}")


class FirstChoice:
    """A stand-in rng whose choice is always the first candidate: makes _wrong_answer checkable by hand."""

    @staticmethod
    def choice(seq):
        return seq[0]


# --- tier 1: hand-made cases -------------------------------------------------------------

EN_FALSE = PromptRecord(
    "Is 3+4=8?", "No, it equals 7!", {"a": 3, "b": 4, "c": 8, "sum": 7, "is_true": False, "lang": "en"}
)
ZH_TRUE = PromptRecord(
    "请问9+9=18？", "是的，等于18！", {"a": 9, "b": 9, "c": 18, "sum": 18, "is_true": True, "lang": "zh"}
)


@pytest.mark.parametrize(
    "record, flip, wrong_sum, expected",
    [
        (EN_FALSE, True, False, "Yes, it equals 7!"),
        # 7 + DELTAS (-10, -2, -1, 1, 2, 10) without the negative one: [5, 6, 8, 9, 17]; the first is 5
        (EN_FALSE, False, True, "No, it equals 5!"),
        (EN_FALSE, True, True, "Yes, it equals 5!"),
        # 18 + DELTAS: [8, 16, 17, 19, 20, 28]; the first is 8
        (ZH_TRUE, True, False, "不是，等于18！"),
        (ZH_TRUE, False, True, "是的，等于8！"),
        (ZH_TRUE, True, True, "不是，等于8！"),
    ],
)
def test_wrong_answer_by_hand(record, flip, wrong_sum, expected):
    assert _wrong_answer(record, flip=flip, wrong_sum=wrong_sum, rng=FirstChoice()) == expected


def test_margin_counts_the_mistakes_of_each_kind():
    assert REJECTION_KINDS == {
        "wrong-verdict": (True, False, 1.0),
        "wrong-sum": (False, True, 1.0),
        "both-wrong": (True, True, 2.0),
    }


# --- the bundled set ---------------------------------------------------------------------


def test_deterministic():
    assert preference_pairs("train", size=200) == preference_pairs("train", size=200)
    assert preference_pairs("test", seed=3, size=50) == preference_pairs("test", seed=3, size=50)
    assert preference_pairs("train", seed=0, size=50) != preference_pairs("train", seed=1, size=50)


def test_splits_disjoint():
    train, test = preference_pairs("train"), preference_pairs("test")
    assert len(train) == 8000 and len(test) == 500
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    # not even the operands (a, b) are shared: the held-out pairs ask about unseen sums
    operands = lambda pairs: {tuple(map(int, re.findall(r"\d+", p.prompt)[:2])) for p in pairs}  # noqa: E731
    assert not operands(train) & operands(test)


def test_chosen_is_the_reference_and_rejected_is_wrong():
    pairs = preference_pairs("test")
    records = load_task("arith-verify", "test")
    kinds = set()
    for pair, record in zip(pairs, records, strict=True):
        assert pair.prompt == record.prompt and pair.chosen == record.answer
        kinds.add(pair.source.rsplit("(", 1)[1].rstrip(")"))
    assert kinds == set(REJECTION_KINDS)


@settings(max_examples=30, deadline=None)
@given(split=st.sampled_from(["train", "test"]), seed=st.integers(0, 5), size=st.integers(1, 40))
def test_margin_is_the_number_of_mistakes(split, seed, size):
    for pair, record in zip(
        preference_pairs(split, seed=seed, size=size),
        load_task("arith-verify", split, seed=seed, size=size),
        strict=True,
    ):
        verdict, total = _parse(pair.rejected)
        meta = record.metadata
        mistakes = (verdict != meta["is_true"]) + (total != meta["sum"])
        assert mistakes >= 1 and pair.margin == float(mistakes)
        assert total >= 0 and total - meta["sum"] in (0, *DELTAS)
        assert _parse(pair.chosen) == (meta["is_true"], meta["sum"])


def test_spec_strings():
    assert load_preferences(BUNDLED) == preference_pairs("train")
    assert load_preferences(BUNDLED + "/test") == preference_pairs("test")
    with pytest.raises(GlassrlError, match="unknown preference task 'task:nope'.*arith-verify-preferences"):
        load_preferences("task:nope")
    with pytest.raises(GlassrlError, match="unknown split 'dev'"):
        load_preferences(BUNDLED + "/dev")


# --- JSONL files -------------------------------------------------------------------------


def _write(tmp_path, lines: list[str]):
    path = tmp_path / "prefs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_file(tmp_path):
    path = _write(
        tmp_path,
        [
            json.dumps({"prompt": "Is 1+1=2?", "chosen": "Yes, it equals 2!", "rejected": "No, it equals 2!"}),
            "",
            json.dumps({"prompt": "p", "chosen": "c", "rejected": "r", "margin": 2, "extra": "ignored"}),
        ],
    )
    assert load_preference_file(path) == [
        PreferencePair("Is 1+1=2?", "Yes, it equals 2!", "No, it equals 2!", None, f"{path}:1"),
        PreferencePair("p", "c", "r", 2.0, f"{path}:3"),
    ]
    assert load_preferences(str(path)) == load_preference_file(path)


GOOD = json.dumps({"prompt": "p", "chosen": "c", "rejected": "r"})


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", r":2: not valid JSON"),
        ("[1, 2]", r":2: expected a JSON object"),
        (json.dumps({"prompt": "p", "chosen": "c"}), r':2: missing field "rejected"'),
        (json.dumps({"prompt": 1, "chosen": "c", "rejected": "r"}), r':2: field "prompt" must be a string'),
        (
            json.dumps({"prompt": "p", "chosen": "c", "rejected": "r", "margin": "big"}),
            r':2: field "margin" must be a number',
        ),
        (
            json.dumps({"prompt": "p", "chosen": "c", "rejected": "r", "margin": True}),
            r':2: field "margin" must be a number',
        ),
    ],
)
def test_file_errors_name_file_line_and_field(tmp_path, bad, message):
    path = _write(tmp_path, [GOOD, bad])
    with pytest.raises(GlassrlError, match=re.escape(str(path)) + message):
        load_preference_file(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(GlassrlError, match="preference file not found"):
        load_preference_file(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(GlassrlError, match="no preference pairs"):
        load_preference_file(tmp_path / "empty.jsonl")


def test_chat_prompts_and_conversational_responses(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is 1+1=2?"}]
    path = _write(
        tmp_path,
        [
            json.dumps(
                {
                    "prompt": messages,
                    "chosen": [{"role": "assistant", "content": "Yes"}],
                    "rejected": [{"role": "assistant", "content": "No"}],
                }
            )
        ],
    )
    assert load_preference_file(path) == [PreferencePair(tuple(messages), "Yes", "No", None, f"{path}:1")]


def test_trl_implicit_prompt(tmp_path):
    """TRL's implicit-prompt rows (no "prompt": whole conversations) read as the explicit form."""
    opening = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is 1+1=2?"}]
    row = {
        "chosen": [*opening, {"role": "assistant", "content": "Yes"}],
        "rejected": [*opening, {"role": "assistant", "content": "No"}],
    }
    path = _write(tmp_path, [json.dumps(row), json.dumps(row | {"margin": 2})])
    pairs = load_preference_file(path)
    assert pairs[0] == PreferencePair(tuple(opening), "Yes", "No", None, f"{path}:1")
    assert pairs[1].margin == 2.0 and pairs[1].prompt == tuple(opening)
    assert load_labelled(str(path))[0] == LabelledResponse(tuple(opening), "Yes", True, f"{path}:1 chosen")
    with pytest.raises(GlassrlError, match=r':1: missing field "prompt"'):  # nothing shared: no prompt to find
        load_preference_file(_write(tmp_path, [json.dumps({"chosen": row["chosen"], "rejected": row["chosen"][2:]})]))


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            json.dumps({"prompt": [{"role": "user"}], "chosen": "c", "rejected": "r"}),
            r":2: field \"prompt\": message 1 has no 'content'",
        ),
        (
            json.dumps({"prompt": "p", "chosen": [{"role": "user", "content": "c"}], "rejected": "r"}),
            r':2: field "chosen" must be a string or one assistant message',
        ),
    ],
)
def test_chat_errors_name_file_line_and_field(tmp_path, bad, message):
    path = _write(tmp_path, [GOOD, bad])
    with pytest.raises(GlassrlError, match=re.escape(str(path)) + message):
        load_preference_file(path)


def test_labelled_responses_from_pairs_and_unpaired_rows(tmp_path):
    path = _write(
        tmp_path,
        [
            json.dumps({"prompt": "p", "chosen": "c", "rejected": "r"}),
            json.dumps({"prompt": "q", "completion": "good", "label": True}),
            json.dumps({"prompt": "q", "completion": "bad", "label": False}),
        ],
    )
    assert load_labelled(str(path)) == [
        LabelledResponse("p", "c", True, f"{path}:1 chosen"),
        LabelledResponse("p", "r", False, f"{path}:1 rejected"),
        LabelledResponse("q", "good", True, f"{path}:2"),
        LabelledResponse("q", "bad", False, f"{path}:3"),
    ]
    bundled = load_labelled("task:arith-verify-preferences/test")
    pairs = load_preferences("task:arith-verify-preferences/test")
    assert len(bundled) == 2 * len(pairs)
    assert [(e.response, e.desirable) for e in bundled[:2]] == [(pairs[0].chosen, True), (pairs[0].rejected, False)]
    bad = _write(tmp_path, [json.dumps({"prompt": "q", "completion": "x", "label": "yes"})])
    with pytest.raises(GlassrlError, match=re.escape(f"{bad}:1") + ': field "label" must be true or false'):
        load_labelled(str(bad))
