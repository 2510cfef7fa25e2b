"""CombinedReward and the registry: weighted sums, each source on its own, failures named."""

from __future__ import annotations

import textwrap

import pytest

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards import (
    REWARD_SOURCES,
    ArithVerifyVerifier,
    CombinedReward,
    ExactMatchVerifier,
    NumericVerifier,
    RewardRequest,
    RewardResult,
    RewardSource,
    build_combined,
    build_reward_source,
)
from helpers import FixedResults

RECORD = PromptRecord(
    "请问1+1=2？", "是的，等于2！", {"a": 1, "b": 1, "c": 2, "sum": 2, "is_true": True, "lang": "zh"}, "t#0"
)


def req(response: str) -> RewardRequest:
    return RewardRequest(str(RECORD.prompt), response, RECORD)


def test_weighted_sum_and_each_source_reported():
    combined = CombinedReward([(ExactMatchVerifier(), 1.0), (NumericVerifier(), 0.5)])
    exact, numeric_only, wrong = combined.score([req("是的，等于2！"), req("等于2"), req("3")])
    assert (exact.score, numeric_only.score, wrong.score) == (1.5, 0.5, 0.0)
    assert exact.details["sources"]["exact_match"].score == 1.0 and exact.details["sources"]["numeric"].score == 1.0
    assert numeric_only.details["sources"]["exact_match"].score == 0.0
    assert exact.details["weights"] == {"exact_match": 1.0, "numeric": 0.5}
    assert numeric_only.details["scores"] == {"exact_match": 0.0, "numeric": 1.0}


def test_a_failed_component_fails_the_combination_naming_it():
    stub = FixedResults(
        {"a": RewardResult.ok(1.0), "b": RewardResult.timeout("slow"), "c": RewardResult.error("broken")}
    )
    ok, timeout, error = CombinedReward([(NumericVerifier(), 1.0), (stub, 2.0)]).score([req("a"), req("b"), req("c")])
    assert ok.status == "ok" and ok.score == 2.0
    assert (timeout.status, timeout.score, timeout.message) == ("timeout", None, "stub: slow")
    assert (error.status, error.score, error.message) == ("error", None, "stub: broken")
    assert error.details["sources"]["numeric"].score == 0.0  # the healthy component is still reported
    assert error.details["scores"] == {"numeric": 0.0, "stub": None}


def test_process_rewards_are_weighted_and_merged_by_offset():
    steps_a = FixedResults({"是的，等于2！": RewardResult.ok(1.0, [(3, 1.0), (7, 1.0)])})
    steps_b = FixedResults({"是的，等于2！": RewardResult.ok(0.0, [(7, -1.0)])})
    (result,) = CombinedReward([(steps_a, 2.0), (steps_b, 0.5)]).score([req("是的，等于2！")])
    assert result.process_rewards == ((3, 2.0), (7, 1.5))
    assert set(result.details["sources"]) == {"stub", "stub:2"}  # repeated names get a suffix


def test_combination_misconfigured():
    with pytest.raises(GlassrlError, match="no sources"):
        CombinedReward([])
    with pytest.raises(GlassrlError, match="not a reward source"):
        CombinedReward([(object(), 1.0)])
    with pytest.raises(GlassrlError, match="weight"):
        CombinedReward([(NumericVerifier(), float("inf"))])


def test_registry_builds_every_name_it_lists():
    assert set(REWARD_SOURCES) == {
        "exact_match",
        "numeric",
        "arith_verify",
        "math",
        "rubric",
        "research_rubric",
        "reward_model",
        "judge",
        "majority_vote",
        "user_function",
        "teacher",
    }
    source = build_reward_source("arith_verify", partial_credit=True)
    assert isinstance(source, ArithVerifyVerifier) and isinstance(source, RewardSource) and source.partial_credit


def test_registry_errors_name_the_problem():
    with pytest.raises(GlassrlError, match="unknown reward source 'nope'; valid: exact_match, numeric, arith_verify"):
        build_reward_source("nope")
    with pytest.raises(GlassrlError, match="reward source 'numeric': unknown argument 'tolerance'"):
        build_reward_source("numeric", tolerance=0.1)
    with pytest.raises(GlassrlError, match="reward source 'user_function': missing argument 'spec'"):
        build_reward_source("user_function")


def test_rubric_and_combination_from_config(tmp_path, monkeypatch):
    (tmp_path / "glassrl_test_rubric_rules.py").write_text(
        textwrap.dedent(
            """
            def has_number(prompt, response, answer, metadata):
                return float(any(ch.isdigit() for ch in response))

            def cites(prompt, response, answer, metadata):
                return float("\\\\cite{" in response)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rules = "glassrl_test_rubric_rules"
    rubric = build_reward_source(
        "rubric",
        criteria=[
            {"name": "accuracy", "weight": 1.0, "source": {"name": "user_function", "spec": f"{rules}:has_number"}},
            {"name": "format", "weight": 0.5, "source": {"name": "user_function", "spec": f"{rules}:cites"}},
        ],
    )
    (result,) = rubric.score([req("营收 115 亿美元 \\cite{q1}")])
    assert result.score == 1.5 and result.details["criteria"] == {"accuracy": 1.0, "format": 1.0}
    with pytest.raises(GlassrlError, match=r"rubric criteria\[0\]: expected keys name, weight, source"):
        build_reward_source("rubric", criteria=[{"name": "x", "weight": 1.0}])
    with pytest.raises(GlassrlError, match=r"criteria\[0\].weight: expected a number"):
        build_reward_source("rubric", criteria=[{"name": "x", "weight": "high", "source": {"name": "numeric"}}])

    combined = build_combined(
        [{"name": "exact_match"}, {"name": "arith_verify", "weight": 2.0, "partial_credit": True}]
    )
    (result,) = combined.score([req("是的，等于3！")])
    assert result.score == 0.0 * 1.0 + 2.0 * 0.5
    with pytest.raises(GlassrlError, match=r"rewards\[0\]"):
        build_combined([{"weight": 1.0}])


def test_a_label_names_the_source_in_the_metrics():
    """label: reward/accuracy/mean, not reward/exact_match:2/mean (TRL names a reward by its function)."""
    from glassrl.rl.metrics import reward_metrics

    combined = build_combined(
        [
            {"name": "exact_match", "label": "accuracy"},
            {"name": "exact_match", "weight": 0.5},
            {"name": "numeric", "label": "format", "weight": 0.25},
        ]
    )
    results = combined.score([req("是的，等于2！"), req("等于2")])
    assert results[0].details["weights"] == {"accuracy": 1.0, "exact_match": 0.5, "format": 0.25}
    metrics = reward_metrics(results)
    assert metrics["reward/accuracy/mean"] == 0.5 and metrics["reward/format/mean"] == 1.0
    assert "reward/exact_match/mean" in metrics and not any("exact_match:2" in key for key in metrics)
    for labels, bad in ((["x", "x"], "'x'"), (["a/b", None], "'a/b'"), (["exact_match", None], "'exact_match'")):
        with pytest.raises(GlassrlError, match=f"label.*{bad}|labelled {bad}"):
            CombinedReward([(ExactMatchVerifier(), 1.0), (ExactMatchVerifier(), 1.0)], labels)
