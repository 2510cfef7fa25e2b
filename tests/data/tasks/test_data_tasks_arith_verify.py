"""arith-verify: exact formats, balance, the grading rule (hand table), the evaluation scores."""

from __future__ import annotations

import pytest

from glassrl.data.records import PromptRecord
from glassrl.data.tasks import load_task
from glassrl.data.tasks.arith_verify import DELTAS, Grade, evaluate, grade, record_for_prompt, reference_answer
from glassrl.data.tasks.splits import MAX_OPERAND


def test_formats_are_exact():
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


def test_is_balanced_and_bilingual():
    records = load_task("arith-verify", "train")
    true_share = sum(r.metadata["is_true"] for r in records) / len(records)
    zh_share = sum(r.metadata["lang"] == "zh" for r in records) / len(records)
    assert 0.45 < true_share < 0.55 and 0.45 < zh_share < 0.55
    assert {r.metadata["c"] - r.metadata["sum"] for r in records if not r.metadata["is_true"]} == set(DELTAS)


def test_reference_answers():
    assert reference_answer(True, 2, "zh") == "是的，等于2！"
    assert reference_answer(False, 7, "zh") == "不是，等于7！"
    assert reference_answer(True, 12, "en") == "Yes, it equals 12!"
    assert reference_answer(False, 0, "en") == "No, it equals 0!"


def test_record_for_a_typed_prompt_beyond_the_digits():
    r = record_for_prompt("Is 12+30=41?")
    assert r.answer == "No, it equals 42!"
    assert r.metadata == {"a": 12, "b": 30, "c": 41, "sum": 42, "is_true": False, "lang": "en", "task": "arith-verify"}
    assert record_for_prompt("请问3+4=7？").answer == "是的，等于7！"
    assert record_for_prompt("3+4=") is None


ZH_TRUE = {"is_true": True, "sum": 7, "lang": "zh"}  # 请问3+4=7？
EN_FALSE = {"is_true": False, "sum": 7, "lang": "en"}  # Is 3+4=8?


@pytest.mark.parametrize(
    ("response", "metadata", "expected"),
    [
        ("是的，等于7！", ZH_TRUE, Grade(True, "zh", "7", True, True, 2)),
        ("是的,等于７!", ZH_TRUE, Grade(True, "zh", "7", True, True, 2)),  # ASCII comma, full-width digit
        ("不是，等于7！", ZH_TRUE, Grade(False, "zh", "7", False, True, 2)),
        ("是的，等于8！", ZH_TRUE, Grade(True, "zh", "8", True, False, 2)),
        ("Yes, it equals 7!", ZH_TRUE, Grade(True, "en", "7", False, True, 3)),  # wrong language
        ("No, it equals 7!", EN_FALSE, Grade(False, "en", "7", True, True, 2)),
        ("no it equals 7", EN_FALSE, Grade(False, "en", "7", True, True, -1)),  # no comma: one span
        ("nothing, 7", EN_FALSE, Grade(None, None, "7", False, True, 7)),
        ("", EN_FALSE, Grade(None, None, None, False, False, -1)),
        ("Yes, it equals 7!", {"is_true": True, "sum": 7}, Grade(True, "en", "7", True, True, 3)),  # no lang
    ],
)
def test_grade_hand_table(response, metadata, expected):
    assert grade(response, metadata) == expected


def test_every_reference_answer_grades_right():
    for r in load_task("arith-verify", "test"):
        g = grade(r.answer, r.metadata)
        assert g.verdict_ok and g.sum_ok


def test_evaluate_scores_exact_verdict_and_format():
    """Hand-made answers: one exact, one right verdict with a wrong sum, one malformed, one unfinished."""
    meta = {"lang": "zh", "is_true": True}
    records = [PromptRecord("请问1+1=2？", "是的，等于2！", meta)] * 4
    answers = [("是的，等于2！", True), ("是的，等于3！", True), ("是的等于2", True), ("是的，等于2！", False)]
    assert evaluate(records, answers) == {"n": 4, "exact": 0.25, "verdict": 1.0, "format": 0.5}
