"""One line, never a traceback (issue 15): reward arguments of the wrong type in a config, and
rewards that return 10**400, NaN or inf, each end as one clear line naming the source."""

from __future__ import annotations

import pytest

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards import Criterion, RewardRequest, RewardResult, RubricSource, build_combined

REWARDS = """
def huge(prompt, response, answer, metadata):
    return 10**400

def nan(prompt, response, answer, metadata):
    return float("nan")

def inf_step(prompt, response, answer, metadata):
    return {"score": 1.0, "process_rewards": [[1, float("-inf")]]}

def trl_huge(completions, **kwargs):
    return [10**400 for _ in completions]
"""


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"name": "user_function", "spec": 3},
            "reward source 'user_function': argument 'spec' must be a string, got int 3",
        ),
        (
            {"name": "user_function", "spec": "m:f", "timeout_s": "fast"},
            "reward source 'user_function': argument 'timeout_s' must be a number, got str 'fast'",
        ),
        (
            {"name": "user_function", "spec": "m:f", "style": "TRL"},
            "argument 'style' must be one of 'auto', 'glassrl', 'trl', 'verl', got str 'TRL'",
        ),
        (
            {"name": "user_function", "spec": "m:f", "memory_limit_mb": 1.5},
            "argument 'memory_limit_mb' must be an integer or null, got float 1.5",
        ),
        ({"name": "arith_verify", "partial_credit": "yes"}, "argument 'partial_credit' must be true or false"),
        (
            {"name": "math", "timeout_s": None},
            "reward source 'math': argument 'timeout_s' must be a number, got NoneType",
        ),
        ({"name": "judge", "model_path": "m", "question_template": "{response}", "max_new_tokens": 2.5}, "an integer"),
        ({"name": "rubric", "criteria": "all of them"}, "argument 'criteria' must be a list, got str"),
        (
            {"name": "majority_vote", "extract_answer": 3},
            "argument 'extract_answer' must be a function or a string or null, got int 3",
        ),
    ],
)
def test_wrong_argument_types_are_one_line_naming_source_and_argument(spec, message):
    """Was: a TypeError traceback from inside the constructor (``'>' not supported between str and int``)."""
    with pytest.raises(GlassrlError) as info:
        build_combined([spec])
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.fixture
def rewards_dir(tmp_path):
    (tmp_path / "rewards.py").write_text(REWARDS)
    return tmp_path


@pytest.mark.parametrize(
    "function, message",
    [
        ("huge", "user_function: rewards.py:huge: score must be a finite number, got an integer of 1329 bits"),
        ("nan", "user_function: rewards.py:nan: score must be a finite number, got nan"),
        ("inf_step", "user_function: rewards.py:inf_step: process reward at 1 must be a finite number, got -inf"),
        ("trl_huge", "user_function: rewards.py:trl_huge: score must be a finite number, got an integer of 1329 bits"),
    ],
)
def test_a_score_no_float_can_hold_is_an_error_result_naming_the_source(rewards_dir, function, message):
    """Was: OverflowError from float(10**400) in the trainer."""
    combined = build_combined([{"name": "user_function", "spec": f"rewards.py:{function}"}], base_dir=rewards_dir)
    (result,) = combined.score([RewardRequest("p", "response", PromptRecord("p", "a", {}, "t#0"))])
    assert (result.status, result.score) == ("error", None)
    assert result.message.startswith(message) and "\n" not in result.message


def test_in_process_sources_refuse_10_to_the_400_as_well():
    assert RewardResult.ok(10**400).message == "score is not a finite number: an integer beyond a float's range"
    assert RewardResult.ok(1.0, [(1, float("nan"))]).message == "a process reward is not a finite number: nan"
    (result,) = RubricSource([Criterion("size", 1.0, lambda request: 10**400)]).score(
        [RewardRequest("p", "r", PromptRecord("p"))]
    )
    assert result.status == "error" and result.message.startswith("criterion 'size': rule raised OverflowError")
