"""Verifiers: hand-checked tables, the bundled tasks' own answers, invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.data.records import PromptRecord
from glassrl.data.tasks import load_task
from glassrl.rewards import ArithVerifyVerifier, ExactMatchVerifier, NumericVerifier, RewardRequest, RewardSource
from glassrl.rewards.verifiers import extract_last_number, normalize_text


def arith_record(a: int, b: int, c: int, lang: str = "zh") -> PromptRecord:
    metadata = {"a": a, "b": b, "c": c, "sum": a + b, "is_true": c == a + b, "lang": lang}
    prompt = f"请问{a}+{b}={c}？" if lang == "zh" else f"Is {a}+{b}={c}?"
    return PromptRecord(prompt, reference_answer(a, b, c, lang), metadata, "test#0")


def reference_answer(a: int, b: int, c: int, lang: str) -> str:
    if lang == "zh":
        return f"{'是的' if c == a + b else '不是'}，等于{a + b}！"
    return f"{'Yes' if c == a + b else 'No'}, it equals {a + b}!"


def req(record: PromptRecord, response: str) -> RewardRequest:
    return RewardRequest(str(record.prompt), response, record)


def scores(source, record, responses):
    results = source.score([req(record, r) for r in responses])
    assert all(r.status == "ok" for r in results), results
    return [r.score for r in results]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("是的，等于2！", "2"),
        ("3-5", "5"),
        ("x = -4", "-4"),
        ("２０", "20"),
        ("2.0", "2"),
        ("1.5 or 2.25", "2.25"),
        ("none", None),
    ],
)
def test_extract_last_number(text, expected):
    assert extract_last_number(text) == expected


def test_normalize_text_maps_full_width_and_collapses_spaces():
    assert normalize_text("  是的，等于２！ \n") == "是的,等于2!"
    assert normalize_text("Yes,   it  equals 2!") == "Yes, it equals 2!"


def test_every_verifier_is_a_reward_source():
    for source in (ExactMatchVerifier(), NumericVerifier(), ArithVerifyVerifier()):
        assert isinstance(source, RewardSource)


def test_exact_match_table():
    record = arith_record(1, 1, 2)
    responses = ["是的，等于2！", "是的,等于2!", " 是的，等于２！ ", "是的，等于3！", ""]
    assert scores(ExactMatchVerifier(), record, responses) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_exact_match_without_answer_is_an_error_not_zero():
    record = PromptRecord("1+1=", None, {}, "data.jsonl:4")
    (result,) = ExactMatchVerifier().score([req(record, "2")])
    assert result.status == "error" and result.score is None
    assert "data.jsonl:4" in result.message


def test_numeric_table():
    add = PromptRecord("2+3=", "5", {"a": 2, "b": 3, "sum": 5}, "t#0")
    assert scores(NumericVerifier(), add, ["5", "the answer is 5.", "4", "5.0", "", "2+3=5", "5 or 6"]) == [
        1,
        1,
        0,
        1,
        0,
        1,
        0,
    ]
    # Without metadata "sum" the reference is the last number of the answer.
    answer_only = PromptRecord("q", "it is -12", {}, "t#1")
    assert scores(NumericVerifier(), answer_only, ["-12", "12"]) == [1.0, 0.0]


def test_numeric_without_reference_is_an_error():
    (result,) = NumericVerifier().score([req(PromptRecord("q", "no number", {}, "t#2"), "3")])
    assert result.status == "error" and "t#2" in result.message


def test_arith_verify_table():
    true_zh, false_en = arith_record(1, 1, 2, "zh"), arith_record(3, 4, 8, "en")
    plain, partial = ArithVerifyVerifier(), ArithVerifyVerifier(partial_credit=True)
    responses_zh = ["是的，等于2！", "不是，等于2！", "是的，等于3！", "不是，等于3！", "hello", "是的等于2"]
    assert scores(plain, true_zh, responses_zh) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert scores(partial, true_zh, responses_zh) == [1.0, 0.0, 0.5, 0.0, 0.0, 1.0]
    responses_en = ["No, it equals 7!", "no, it equals 7", "Yes, it equals 7!", "No, it equals 8!", "Nope, 7"]
    assert scores(plain, false_en, responses_en) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert scores(partial, false_en, responses_en) == [1.0, 1.0, 0.0, 0.5, 0.0]


def test_arith_verify_requires_the_question_language():
    """Right verdict and sum in the other language score 0 (language consistency); without
    metadata "lang" either language is accepted."""
    true_zh, false_en = arith_record(1, 1, 2, "zh"), arith_record(3, 4, 8, "en")
    plain, partial = ArithVerifyVerifier(), ArithVerifyVerifier(partial_credit=True)
    assert scores(plain, true_zh, ["是的，等于2！", "Yes, it equals 2!"]) == [1.0, 0.0]
    assert scores(plain, false_en, ["No, it equals 7!", "不是，等于7！"]) == [1.0, 0.0]
    assert scores(partial, false_en, ["不是，等于7！"]) == [0.0]  # the wrong language earns no partial credit
    (result,) = plain.score([req(false_en, "不是，等于7！")])
    assert (
        result.details["language"] == "zh" and result.details["verdict"] is False and not result.details["verdict_ok"]
    )
    no_lang = PromptRecord("3+4=7?", "Yes, it equals 7!", {"is_true": True, "sum": 7}, "x#2")
    assert scores(plain, no_lang, ["Yes, it equals 7!", "是的，等于7！"]) == [1.0, 1.0]


def test_arith_verify_process_rewards_sit_on_step_ends():
    source = ArithVerifyVerifier(process_rewards=True)
    record = arith_record(1, 1, 2)
    responses = ["是的，等于2！", "是的，等于3！", "不是，等于2！", "是的等于2", "是的，", ""]
    results = source.score([req(record, r) for r in responses])
    # "是的，" ends at character 3 (the comma is the verdict step's last character); the response has 7.
    assert [r.process_rewards for r in results] == [
        ((3, 1.0), (7, 1.0)),
        ((3, 1.0), (7, 0.0)),
        ((3, 0.0), (7, 1.0)),
        ((5, 1.0),),  # no comma: one step carrying the outcome
        ((3, 0.0),),  # nothing after the comma: one step
        (),  # empty response: no step to place a reward on
    ]
    (english,) = source.score([req(arith_record(3, 4, 8, "en"), "No, it equals 7!")])
    assert english.process_rewards == ((3, 1.0), (16, 1.0))


def test_arith_verify_without_metadata_is_an_error():
    (result,) = ArithVerifyVerifier().score([req(PromptRecord("q", "a", {"sum": 2}, "x#1"), "是的，等于2！")])
    assert result.status == "error" and "is_true" in result.message


def test_bundled_tasks_reference_answers_score_one():
    verify = load_task("arith-verify", "test", size=40)
    add = load_task("add", "test", size=20)
    assert {r.metadata["lang"] for r in verify} == {"zh", "en"} and {r.metadata["is_true"] for r in verify} == {
        True,
        False,
    }
    for source, records in [
        (ExactMatchVerifier(), verify + add),
        (NumericVerifier(), verify + add),
        (ArithVerifyVerifier(process_rewards=True), verify),
    ]:
        results = source.score([req(r, r.answer) for r in records])
        assert [r.score for r in results] == [1.0] * len(records), source.name


@settings(max_examples=50, deadline=None)
@given(
    a=st.integers(0, 99),
    b=st.integers(0, 99),
    delta=st.sampled_from([0, 0, -10, -2, -1, 1, 2, 10]),
    lang=st.sampled_from(["zh", "en"]),
    slip=st.integers(1, 9),
)
def test_arith_verify_invariants(a, b, delta, lang, slip):
    record = arith_record(a, b, max(a + b + delta, 0), lang)
    right = record.answer
    # The answer to the opposite question: the verdict flipped, the sum kept.
    other = reference_answer(a, b, a + b + 1 if record.metadata["is_true"] else a + b, lang)
    wrong_sum = right.replace(str(a + b), str(a + b + slip))
    source = ArithVerifyVerifier(partial_credit=True, process_rewards=True)
    r_right, r_other, r_wrong = source.score([req(record, t) for t in (right, other, wrong_sum)])
    assert (r_right.score, r_other.score, r_wrong.score) == (1.0, 0.0, 0.5)
    for result, text in ((r_right, right), (r_other, other), (r_wrong, wrong_sum)):
        ends = [end for end, _ in result.process_rewards]
        assert ends == sorted(set(ends)) and 0 < ends[0] and ends[-1] == len(text)
