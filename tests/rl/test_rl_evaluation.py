"""Evaluation with the task's reward (glassrl.rl.evaluation): GSM8K-style answers judged by the
configured reward instead of exact match, the verifier's verdict, mean@k and the unbiased pass@k,
per-source and per-metadata breakdowns, and a rollout RNG left as it was."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from glassrl.data.records import PromptRecord
from glassrl.rewards import RewardResult, build_combined
from glassrl.rewards.base import RewardRequest
from glassrl.rl.evaluation import correct, evaluate, pass_at_k, pass_ks, reward_verdict, summarize, verdicts
from glassrl.rollout.base import SamplingParams
from helpers import FixedResults, preset_trainer

GSM8K_ANSWER = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18"


class ScriptedRollout:
    """A rollout worker whose responses come from a table: ``answers[i][j]`` is the j-th response
    to prompt i (a prompt's ids are [i]); its state counts the calls, as an RNG would advance."""

    part_names = ("rollout_rng",)

    def __init__(self, answers: list[list[str]]) -> None:
        self.answers, self.calls, self.batches = answers, 0, []

    def generate(self, prompts, *, n, params, records=None):
        self.calls += 1
        self.batches.append(len(prompts))
        texts = [self.answers[p[0]][j] for p in prompts for j in range(n)]
        return SimpleNamespace(texts=texts, group_index=torch.arange(len(prompts)).repeat_interleave(n), turns=None)

    def state_dict(self):
        return {"rollout_rng": ("json", {"calls": self.calls})}

    def load_state_dict(self, parts):
        self.calls = parts["rollout_rng"]["calls"]


def run(records, answers, reward, *, k=1, threshold=1.0, group_by=None, chunk=8):
    rollout = ScriptedRollout(answers)
    index = {id(r): i for i, r in enumerate(records)}
    metrics = evaluate(
        records,
        lambda batch: [[index[id(r)]] for r in batch],
        rollout=rollout,
        reward=reward,
        tokenizer=None,
        params=SamplingParams(16, greedy=k == 1),
        k=k,
        threshold=threshold,
        group_by=group_by,
        chunk=chunk,
    )
    return metrics, rollout


def test_a_gsm8k_answer_is_judged_by_the_reward_not_by_exact_match():
    """Issue 13: '… #### 18' against the reference '… #### 18' scored 0 forever under exact match,
    in eval/accuracy and in task/accuracy (:func:`correct`, the same rule)."""
    record = PromptRecord("Janet's ducks lay 16 eggs per day. ...", answer=GSM8K_ANSWER, source="gsm8k.jsonl:1")
    response = "She sells 16 - 3 - 4 = 9 eggs, for 9 * 2 = 18 dollars.\n#### 18"
    requests = [RewardRequest(record.prompt, text, record) for text in (response, "#### 17")]
    numeric = build_combined([{"name": "numeric"}])
    assert correct(requests, numeric.score(requests), 1.0) == [True, False]
    metrics, _ = run([record], [[response]], numeric)
    assert metrics["eval/accuracy"] == 1.0
    assert metrics["eval/reward/mean"] == 1.0 and metrics["eval/reward/numeric/mean"] == 1.0
    wrong, _ = run([record], [["#### 17"]], build_combined([{"name": "numeric"}]))
    assert wrong["eval/accuracy"] == 0.0


def ok(score, **details):
    return RewardResult.ok(score, details=details)


def combined(**sources):
    return RewardResult.ok(sum(r.score for r in sources.values()), details={"sources": sources})


@pytest.mark.parametrize(
    "result, threshold, expected",
    [
        (ok(1.0), 1.0, True),  # a 0/1 rule at full marks
        (ok(0.9), 1.0, False),
        (ok(0.9), 0.5, True),
        (ok(0.0, correct=True), 1.0, True),  # a verifier's verdict wins over the threshold
        (ok(1.0, correct=False), 1.0, False),
        (combined(math=ok(1.0, correct=True), format=ok(0.1)), 5.0, True),  # the shaping source has no say
        (combined(math=ok(1.0, correct=True), other=ok(0.0, correct=False)), 0.0, False),  # every verdict counts
        (combined(a=ok(0.5), b=ok(0.5)), 1.0, True),  # no verdict: the combined score against the threshold
        (RewardResult.error("no reference"), 0.0, False),  # a failure is never correct
        (RewardResult.timeout("slow"), 0.0, False),
    ],
)
def test_reward_verdict(result, threshold, expected):
    assert reward_verdict(result, threshold) is expected


def test_task_accuracy_leaves_out_what_nothing_can_judge():
    """No task, no answer, no source verdict (a majority vote on unlabelled prompts, TTRL): None,
    not the threshold; a source's own verdict judges even without an answer."""
    unlabelled = PromptRecord("Is 2+2=4?", source="u.jsonl:1")
    requests = [RewardRequest(unlabelled.prompt, "yes", unlabelled)] * 3
    results = [RewardResult.ok(1.0), ok(0.0, correct=True), RewardResult.error("boom")]
    assert correct(requests, results, 1.0) == [None, True, None]
    assert verdicts(requests, results, 1.0) == [True, True, False]  # eval/accuracy judges them all


def test_a_bundled_task_keeps_its_verifier_whatever_the_reward_says():
    record = PromptRecord(
        "请问3+4=7？",
        "是的，等于7！",
        {"a": 3, "b": 4, "c": 7, "sum": 7, "is_true": True, "lang": "zh", "task": "arith-verify"},
    )
    zero = FixedResults({"是的，等于7！": RewardResult.ok(0.0), "不是，等于7！": RewardResult.ok(1.0)})
    requests = [RewardRequest(record.prompt, text, record) for text in ("是的，等于7！", "不是，等于7！")]
    assert verdicts(requests, zero.score(requests), 1.0) == [True, False]
    assert correct(requests, zero.score(requests), 1.0) == [True, False]  # task/accuracy as always


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),  # pass@1 = c/n
        (5, 2, 2, 0.7),  # 1 − C(3,2)/C(5,2) = 1 − 3/10
        (4, 1, 2, 0.5),  # 1 − C(3,2)/C(4,2) = 1 − 3/6
        (5, 2, 4, 1.0),  # n − c < k: every k-subset holds a correct sample
        (6, 0, 3, 0.0),
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_table(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_the_binomial_formula(args):
    n, c, k = args
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="n=3, c=4, k=1"):
        pass_at_k(3, 4, 1)


def test_pass_ks():
    assert pass_ks(1) == [] and pass_ks(2) == [1, 2] and pass_ks(5) == [1, 2, 4, 5] and pass_ks(8) == [1, 2, 4, 8]


def test_summarize_hand_table_with_a_dotted_group_key():
    records = [
        PromptRecord("p0", metadata={"extra_info": {"level": "easy"}}),
        PromptRecord("p1", metadata={"extra_info": {"level": "Hard"}}),
        PromptRecord("p2", metadata={}),  # no level: in the total only
    ]
    flags = [[True, True, False, False], [False, False, False, True], [False] * 4]
    results = [[combined(numeric=ok(float(f))) for f in row] for row in flags]
    results[2][0] = RewardResult.error("numeric: no reference", {"sources": {"numeric": RewardResult.error("x")}})
    metrics = summarize(records, flags, results, "extra_info.level")
    assert metrics == pytest.approx(
        {
            "eval/accuracy": (2 / 4 + 1 / 4 + 0) / 3,  # mean@4
            "eval/pass_at_1": (2 / 4 + 1 / 4 + 0) / 3,
            "eval/pass_at_2": ((1 - 1 / 6) + (1 - 3 / 6) + 0) / 3,  # 1 − C(4−c, 2)/C(4, 2)
            "eval/pass_at_4": (1 + 1 + 0) / 3,
            "eval/reward/mean": 3 / 11,  # 11 scored responses, 3 of them 1.0
            "eval/reward/numeric/mean": 3 / 11,
            "eval/reward/failure_rate": 1 / 12,
            "eval/accuracy/easy": 0.5,
            "eval/accuracy/hard": 0.25,
        }
    )


def test_k_responses_per_prompt_in_chunks_and_the_rollout_state_restored():
    records = [PromptRecord(f"q{i}", answer=str(i)) for i in range(5)]
    answers = [[str(i) if j < i else "x" for j in range(4)] for i in range(5)]  # prompt i: i right of 4 (capped)
    metrics, rollout = run(records, answers, build_combined([{"name": "numeric"}]), k=4, chunk=8)
    assert rollout.batches == [2, 2, 1]  # chunk // k = 2 prompts per call
    assert rollout.calls == 0  # evaluation put the sampling state back
    assert metrics["eval/accuracy"] == pytest.approx((0 + 1 / 4 + 2 / 4 + 3 / 4 + 1) / 5)
    assert metrics["eval/pass_at_4"] == pytest.approx(4 / 5)


@pytest.mark.slow
def test_sampled_evaluation_is_documented_and_leaves_training_unchanged(fast, tmp_path):
    """eval_k = 4 samples at evaluation, yet the run trains exactly as one that never evaluates."""
    from glassrl.report.metrics_doc import undocumented

    def rows(out):
        return [json.loads(line) for line in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]

    def training(out):
        return [{k: v for k, v in r.items() if not k.startswith(("perf/", "eval/"))} for r in rows(out) if r["step"]]

    preset_trainer("grpo", [*fast, "output_dir=" + str(tmp_path / "k4"), "logging.eval_k=4"]).train()
    preset_trainer("grpo", [*fast, "output_dir=" + str(tmp_path / "none"), "data.eval_size=0"]).train()
    evaluated = rows("k4")
    assert [r["step"] for r in evaluated] == [0, 1, 2]
    assert {"eval/accuracy", "eval/pass_at_1", "eval/pass_at_2", "eval/pass_at_4", "eval/reward/mean"} <= set(
        evaluated[0]
    )
    assert undocumented({k for r in evaluated for k in r if k != "step"}) == []
    assert training("k4") == training("none")
