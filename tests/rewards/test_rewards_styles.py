"""Reward functions ported unchanged: TRL's batched ``fn(prompts, completions, **kwargs)`` and verl's
``compute_score(data_source, solution_str, ground_truth, extra_info)`` on verl-layout data.

Before: the TRL function failed with TypeError (called as fn(prompt, response, answer, metadata))
and verl's ran by positional accident, receiving the prompt as ``data_source``, and scored 0.
The reward files below are written as the frameworks' documentation writes them.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from glassrl.data.datasets import load_prompts
from glassrl.data.records import PromptRecord
from glassrl.rewards import RewardRequest, UserFunctionSource, build_combined
from glassrl.rewards.styles import accepted, detect_style, ground_truth, mismatch, trl_kwargs

# TRL's documentation (GRPOTrainer, "Using a custom reward function"), verbatim in spirit.
TRL_REWARDS = r'''
import re

def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]

def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]

def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]

def batch_size(prompts, completions, **kwargs):
    return [len(completions)] * len(completions)

def sometimes_none(completions, **kwargs):
    return [1.0 if "yes" in c else None for c in completions]

def too_few(completions, **kwargs):
    return [1.0]
'''

# verl's documentation ("Implement Reward Function for Dataset" / custom_reward_function): the
# GSM8K rule of verl/utils/reward_score/gsm8k.py behind the four-argument signature, with the
# data-source dispatch of its default_compute_score.
VERL_REWARDS = r'''
import re

def extract_solution(solution_str):
    solutions = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str)
    if len(solutions) == 0:
        return None
    return solutions[-1].replace(",", "").replace("$", "")

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source != "openai/gsm8k":
        raise NotImplementedError(f"Reward function is not implemented for {data_source=}")
    answer = extract_solution(solution_str)
    if answer is None:
        return 0.0
    return {"score": 1.0 if answer == ground_truth else 0.0, "pred": answer, "index": extra_info["index"]}

def my_reward_fn(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 100

def gsm8k_two_arguments(solution_str, ground_truth):
    return float(extract_solution(solution_str) == ground_truth)
'''


@pytest.fixture
def reward_files(tmp_path):
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    (tmp_path / "verl_rewards.py").write_text(VERL_REWARDS)
    return tmp_path


def requests_for(records: list[PromptRecord], responses: list[str]) -> list[RewardRequest]:
    return [RewardRequest(str(r.prompt), text, r) for r, text in zip(records, responses)]


# ---------------------------------------------------------------- signatures


@pytest.mark.parametrize(
    "parameters, style",
    [
        ([("completions", "POSITIONAL_OR_KEYWORD", False), ("kwargs", "VAR_KEYWORD", False)], "trl"),
        ([("prompts", "POSITIONAL_OR_KEYWORD", False), ("completions", "POSITIONAL_OR_KEYWORD", False)], "trl"),
        ([("data_source", "POSITIONAL_OR_KEYWORD", False), ("solution_str", "POSITIONAL_OR_KEYWORD", False)], "verl"),
        ([("solution_str", "POSITIONAL_OR_KEYWORD", False), ("ground_truth", "POSITIONAL_OR_KEYWORD", False)], "verl"),
        ([(n, "POSITIONAL_OR_KEYWORD", False) for n in ("p", "r", "a", "m")], "glassrl"),
        ([("args", "VAR_POSITIONAL", False)], "glassrl"),
        ([("text", "POSITIONAL_OR_KEYWORD", False)], None),
    ],
)
def test_detect_style_table(parameters, style):
    assert detect_style(parameters) == style


def test_accepted_keywords_and_mismatches():
    kwargs_fn = [("completions", "POSITIONAL_OR_KEYWORD", False), ("kwargs", "VAR_KEYWORD", False)]
    assert accepted(kwargs_fn) is None  # takes any column
    verl_fn = [("solution_str", "POSITIONAL_OR_KEYWORD", False), ("method", "KEYWORD_ONLY", True)]
    assert accepted(verl_fn) == ["solution_str", "method"]
    assert mismatch("verl", verl_fn) is None
    assert "also requires 'answer'" in mismatch("verl", [("answer", "POSITIONAL_OR_KEYWORD", False)])
    assert "positional-only" in mismatch("trl", [("completions", "POSITIONAL_ONLY", False)])


def test_trl_columns_of_a_batch():
    records = [PromptRecord("q1", "1", {"ground_truth": "1", "level": 2}, "t#0"), PromptRecord("q2", None, {}, "t#1")]
    items = [
        {"raw_prompt": r.prompt, "response": f"r{i}", "answer": r.answer, "metadata": r.metadata}
        for i, r in enumerate(records)
    ]
    assert trl_kwargs(items) == {
        "prompts": ["q1", "q2"],
        "completions": ["r0", "r1"],
        "answer": ["1", None],
        "ground_truth": ["1", None],
        "level": [2, None],
    }


# ---------------------------------------------------------------- TRL


def test_trl_reward_function_unchanged(reward_files):
    """Was: TypeError. Standard format: prompts and completions are strings, columns by name."""
    records = [PromptRecord(f"Solve {i}", None, {"ground_truth": str(i)}, f"t#{i}") for i in range(3)]
    batch = requests_for(records, [r"so \boxed{0}", r"\boxed{7}", "no box"])
    source = UserFunctionSource("trl_rewards.py:reward_func", base_dir=str(reward_files))
    assert source.style == "trl"
    assert [(r.status, r.score) for r in source.score(batch)] == [("ok", 1.0), ("ok", 0.0), ("ok", 0.0)]
    (length,) = UserFunctionSource("trl_rewards.py:reward_len", base_dir=str(reward_files)).score(
        requests_for(records[:1], ["x" * 15])
    )
    assert length.score == -5.0


def test_trl_is_called_once_per_batch(reward_files):
    records = [PromptRecord("q", None, {}, f"t#{i}") for i in range(5)]
    source = UserFunctionSource("trl_rewards.py:batch_size", style="trl", base_dir=str(reward_files))
    assert [r.score for r in source.score(requests_for(records, ["a"] * 5))] == [5.0] * 5


def test_trl_conversational_records_get_messages(reward_files):
    messages = ({"role": "user", "content": "Think, then answer."},)
    records = [PromptRecord(messages, None, {}, f"t#{i}") for i in range(2)]
    responses = ["<think>2+2</think><answer>4</answer>", "4"]
    source = UserFunctionSource("trl_rewards.py:format_reward_func", base_dir=str(reward_files))
    assert [r.score for r in source.score(requests_for(records, responses))] == [1.0, 0.0]


def test_trl_failures_are_per_completion_or_the_batch(reward_files):
    records = [PromptRecord("q", None, {}, f"t#{i}") for i in range(2)]
    none = UserFunctionSource("trl_rewards.py:sometimes_none", base_dir=str(reward_files))
    ok, missing = none.score(requests_for(records, ["yes", "no"]))
    assert ok.score == 1.0 and missing.status == "error" and "score must be a number, got NoneType" in missing.message
    few = UserFunctionSource("trl_rewards.py:too_few", base_dir=str(reward_files))
    results = few.score(requests_for(records, ["a", "b"]))
    assert [r.status for r in results] == ["error", "error"]
    assert "returned 1 scores for 2 completions" in results[0].message


# ---------------------------------------------------------------- verl


@pytest.fixture
def verl_parquet(tmp_path):
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {"role": "user", "content": f"{q} Let's think step by step and output the final answer after \"####\"."}
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": solution},
            "extra_info": {"split": "train", "index": i, "answer": f"... #### {solution}", "question": q},
        }
        for i, (q, solution) in enumerate([("Natalia sold 48 clips, then half as many. Total?", "72"), ("1+1?", "2")])
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_verl_compute_score_on_verl_layout_data(reward_files, verl_parquet):
    """Was: the prompt arrived as data_source, and the score was 0. Now every argument is verl's."""
    records = load_prompts(verl_parquet)
    assert records[0].answer is None and records[0].metadata["reward_model"]["ground_truth"] == "72"
    source = UserFunctionSource("verl_rewards.py:compute_score", base_dir=str(reward_files))
    assert source.style == "verl"
    batch = requests_for(records * 2, ["48/2=24, 48+24=72\n#### 72", "#### 2", "#### 70", "I think 2"])
    results = source.score(batch)
    assert [(r.status, r.score) for r in results] == [("ok", 1.0), ("ok", 1.0), ("ok", 0.0), ("ok", 0.0)]
    assert results[0].details == {"pred": "72", "index": 0} and results[1].details["index"] == 1


def test_verl_functions_taking_fewer_arguments(reward_files, verl_parquet):
    records = load_prompts(verl_parquet)
    (length,) = UserFunctionSource("verl_rewards.py:my_reward_fn", base_dir=str(reward_files)).score(
        requests_for(records[:1], ["x" * 50])
    )
    assert length.score == 0.5
    two = UserFunctionSource("verl_rewards.py:gsm8k_two_arguments", base_dir=str(reward_files))
    assert [r.score for r in two.score(requests_for(records, ["#### 72", "#### 3"]))] == [1.0, 0.0]


def test_verl_data_source_missing_is_the_functions_error_not_a_zero(reward_files):
    record = PromptRecord("1+1?", "2", {}, "plain.jsonl:1")  # no data_source; the answer is the ground truth
    (result,) = UserFunctionSource("verl_rewards.py:compute_score", base_dir=str(reward_files)).score(
        requests_for([record], ["#### 2"])
    )
    assert result.status == "error" and "NotImplementedError" in result.message and "data_source=None" in result.message


def test_from_a_config_with_the_configs_directory(reward_files, verl_parquet):
    combined = build_combined(
        [{"name": "user_function", "spec": "verl_rewards.py:compute_score", "style": "verl"}, {"name": "math"}],
        base_dir=reward_files,
    )
    records = load_prompts(verl_parquet)
    results = combined.score(requests_for(records, ["#### 72", "#### 3"]))
    assert [r.score for r in results] == [2.0, 0.0]
    assert results[0].details["scores"] == {"user_function": 1.0, "math": 1.0}
    assert json.loads(json.dumps(results[0].details["scores"])) == results[0].details["scores"]  # plain data


@pytest.mark.parametrize(
    "metadata, answer, expected",
    [
        ({"reward_model": {"style": "rule", "ground_truth": "72"}}, "ignored", "72"),
        ({"reward_model.ground_truth": 72}, None, "72"),  # picked by a dotted metadata key
        ({"reward_model": {"style": "model"}}, "5", "5"),
        ({}, None, None),
    ],
)
def test_ground_truth_where_verl_and_glassrl_keep_it(metadata, answer, expected):
    assert ground_truth(PromptRecord("q", answer, metadata, "t#0")) == expected
