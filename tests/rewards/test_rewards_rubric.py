"""Rubric: Σ w_i·s_i, the reference's 2.5 example, failures named by criterion."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards import Criterion, RewardRequest, RewardResult, RubricSource
from helpers import FixedResults

# dialogue-agentic-rl-rubric-reward.md, part 2: the three rubric lines and their weights.
PROMPT = "帮我总结 Google 2025年的财报，重点关注 Cloud 业务的营收。"
GOOD = "根据 Alphabet 发布的 **2025年第一季度财报** \\cite{abc-q1}，Google Cloud 营收达到 115 亿美元。"
RUMOUR = "Google 2025 全年营收 5 万亿美元 \\cite{tech-gossip}。"


def has_revenue_number(request: RewardRequest) -> float:
    """准确性: 是否包含了具体的营收数字？"""
    return float(bool(re.search(r"\d+(\.\d+)?\s*(亿|万亿|billion|B\b)", request.response)))


def separates_quarter_from_year(request: RewardRequest) -> float:
    """时间正确性: the full-year report is not out; name the quarter, never state a full-year figure."""
    names_quarter = "第一季度" in request.response or "Q1" in request.response
    return float(names_quarter and "全年" not in request.response)


def uses_cite(request: RewardRequest) -> float:
    """引用规范: 是否使用了 \\cite{} 格式？"""
    return float(bool(re.search(r"\\cite\{[^}]+\}", request.response)))


REFERENCE_RUBRIC = [
    Criterion("accuracy", 1.0, has_revenue_number),
    Criterion("temporal", 1.0, separates_quarter_from_year),
    Criterion("citation", 0.5, uses_cite),
]


def req(response: str) -> RewardRequest:
    return RewardRequest(PROMPT, response, PromptRecord(PROMPT, None, {}, "t#0"))


def test_reference_example_scores_2_5():
    (result,) = RubricSource(REFERENCE_RUBRIC).score([req(GOOD)])
    # R = 1.0·1.0 + 1.0·1.0 + 0.5·1.0
    assert result.status == "ok" and result.score == 2.5
    assert result.details["criteria"] == {"accuracy": 1.0, "temporal": 1.0, "citation": 1.0}
    assert result.details["weights"] == {"accuracy": 1.0, "temporal": 1.0, "citation": 0.5}


def test_reference_counter_example():
    # The rumour report fails only the temporal line: 1.0·1 + 1.0·0 + 0.5·1 = 1.5. (The reference
    # says "R = 0.5, perhaps only the format points", which would also need accuracy to fail; its
    # own accuracy line only asks for a specific revenue number, which "5 万亿" is.)
    (result,) = RubricSource(REFERENCE_RUBRIC).score([req(RUMOUR)])
    assert result.score == 1.5 and result.details["criteria"]["temporal"] == 0.0


def test_a_source_can_judge_a_criterion_and_its_failures_name_the_criterion():
    judge = FixedResults(  # stands in for a judge model
        {
            "a": RewardResult.ok(0.8),
            "b": RewardResult.timeout("judge took too long"),
            "c": RewardResult.error("no score"),
        }
    )
    source = RubricSource(
        [Criterion("helpful", 0.5, judge), Criterion("short", 2.0, lambda r: float(len(r.response) < 5))]
    )
    ok, timeout, error = source.score([req("a"), req("b"), req("c")])
    assert ok.status == "ok" and ok.score == pytest.approx(0.5 * 0.8 + 2.0 * 1.0)
    assert timeout.status == "timeout" and timeout.score is None
    assert timeout.message == "criterion 'helpful': judge took too long"
    assert error.status == "error" and error.message == "criterion 'helpful': no score"
    assert error.details["criteria"] == {"helpful": None, "short": 1.0}


def test_rule_failures_are_errors_not_zero():
    def raises(request):
        raise KeyError("field")

    (broken,) = RubricSource([Criterion("ok", 1.0, lambda r: 1.0), Criterion("broken", 1.0, raises)]).score([req("x")])
    assert broken.status == "error" and broken.message == "criterion 'broken': rule raised KeyError: 'field'"
    (outside,) = RubricSource([Criterion("big", 1.0, lambda r: 1.5)]).score([req("x")])
    assert outside.status == "error" and "outside [0, 1]" in outside.message


@pytest.mark.parametrize(
    "criteria, fragment",
    [
        ([], "empty"),
        ([Criterion("a", 1.0, uses_cite), Criterion("a", 2.0, uses_cite)], "used twice"),
        ([Criterion("a", math.nan, uses_cite)], "weight"),
        ([Criterion("a", 1.0, "not a judge")], "rule"),
    ],
)
def test_misconfigured_rubric(criteria, fragment):
    with pytest.raises(GlassrlError, match=fragment):
        RubricSource(criteria)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(0, 1)), min_size=1, max_size=6))
def test_total_is_the_weighted_sum(lines):
    criteria = [Criterion(f"c{i}", w, lambda r, s=s: s) for i, (w, s) in enumerate(lines)]
    (result,) = RubricSource(criteria).score([req("x")])
    assert result.score == pytest.approx(math.fsum(w * s for w, s in lines), abs=1e-12)
