"""The math source: GSM8K's ``#### 72`` and MATH's ``\\boxed{}`` answers, checked by math-verify."""

from __future__ import annotations

import pytest

from glassrl.data.records import PromptRecord
from glassrl.rewards import MathVerifier, RewardRequest
from glassrl.rewards.math_answer import final_answer_text

GSM8K = PromptRecord(
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72",
    {},
    "gsm8k.jsonl:1",
)
MATH = PromptRecord(
    "What is $\\frac{2}{4}$ in lowest terms?", "So the answer is $\\boxed{\\frac{1}{2}}$.", {}, "math#0"
)
VERL = PromptRecord("1+1?", None, {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "2"}}, "train#0")


def scores(record: PromptRecord, responses: list[str], **kwargs) -> list[float | None]:
    results = MathVerifier(**kwargs).score([RewardRequest(str(record.prompt), r, record) for r in responses])
    assert all(r.status == "ok" for r in results), results
    return [r.score for r in results]


@pytest.mark.parametrize(
    "text, expected",
    [("reasoning\n#### 72", "72"), ("#### 1 #### 2", "2"), (r"\boxed{3}", r"\boxed{3}"), ("####", "")],
)
def test_final_answer_text(text, expected):
    assert final_answer_text(text) == expected


def test_gsm8k_answers():
    responses = [
        "48/2 = 24, 48 + 24 = 72\n#### 72",  # GSM8K's own format
        "The answer is $\\boxed{72}$.",
        "#### 72.0",
        "#### 1,072",
        "#### 71",
        "I cannot tell.",
        "",
    ]
    assert scores(GSM8K, responses) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_math_answers_agree_mathematically():
    responses = ["$\\boxed{0.5}$", "\\boxed{1/2}", "\\boxed{\\frac{2}{4}}", "\\boxed{2}", "the answer is 1/3"]
    assert scores(MATH, responses) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_verl_layout_ground_truth_and_details():
    (result,) = MathVerifier().score([RewardRequest("1+1?", "so #### 2", VERL)])
    assert (result.score, result.details) == (1.0, {"reference": "2", "answer": "2", "correct": True})


def test_missing_or_unreadable_reference_is_an_error_naming_the_record():
    no_answer = PromptRecord("q", None, {}, "data.jsonl:9")
    unreadable = PromptRecord("q", "banana", {}, "data.jsonl:10")
    missing, bad = MathVerifier().score(
        [RewardRequest("q", "#### 1", no_answer), RewardRequest("q", "#### 1", unreadable)]
    )
    assert missing.status == "error" and missing.message.startswith("data.jsonl:9: no reference answer")
    assert (
        bad.status == "error" and "data.jsonl:10: math-verify finds no answer in the reference 'banana'" in bad.message
    )


def test_out_of_time_is_a_timeout():
    # 1 µs cannot hold a round trip to the worker: the check is killed, not waited for.
    (result,) = MathVerifier(timeout_s=1e-6).score([RewardRequest("q", "#### 72", GSM8K)])
    assert result.status == "timeout" and result.score is None and result.message.startswith("math: no result after")
