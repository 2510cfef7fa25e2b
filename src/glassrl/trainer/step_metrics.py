"""The metrics of one step, from its Experience (keys and formulas: docs/metrics.md).

Task accuracy (``task/accuracy``) is :func:`accuracy` of the verdicts of
glassrl.trainer.evaluation.correct, the rule ``eval/accuracy`` uses: bundled-task records
by the task's verifier (``TASK_VERIFIERS[metadata["task"]]``, scored 1.0), other records by
the configured reward (a source's own verdict, else the reward reaching
``logging.eval_threshold``); responses nothing can judge are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from glassrl.algos.rollout_is import logprob_mismatch
from glassrl.data.tasks import research
from glassrl.rewards.base import RewardRequest, RewardResult, RewardSource
from glassrl.rewards.research import research_rubric
from glassrl.rewards.verifiers import ArithVerifyVerifier, NumericVerifier
from glassrl.rollout.base import masked_token_lists
from glassrl.trainer.experience import Experience
from glassrl.trainer.metrics import distinct_n, explained_variance, masked_stats


class FullMarks:
    """1.0 when ``source`` (a rubric) gives its full ``total`` points, else 0.0: the verdict of a
    task judged by a weighted rubric (research: 1 + 1 + 0.5 = 2.5 points)."""

    def __init__(self, source: RewardSource, total: float) -> None:
        self.source, self.total = source, total

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        return [
            RewardResult.ok(float(math.isclose(r.score, self.total))) if r.is_ok else r
            for r in self.source.score(requests)
        ]


# Bundled task (PromptRecord.metadata["task"]) -> the verifier whose score 1.0 means correct.
TASK_VERIFIERS = {
    "arith-verify": ArithVerifyVerifier(),
    "add": NumericVerifier(),
    "tool-add": NumericVerifier(),  # the final answer's last number is a+b (metadata["sum"])
    "research": FullMarks(research_rubric(), sum(weight for _, weight, _ in research.CRITERIA)),
}


def accuracy(flags: Sequence[bool | None]) -> float:
    """Fraction of the judged responses that are correct; NaN when none is judged."""
    judged = [f for f in flags if f is not None]
    return sum(judged) / len(judged) if judged else math.nan


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    t = torch.tensor(values, dtype=torch.float64)
    return t.mean().item(), (t.std().item() if len(values) > 1 else math.nan)


def reward_metrics(results: Sequence[RewardResult]) -> dict[str, float]:
    """reward/…: combined and per-source scores of the non-failed responses, failure counts."""
    metrics: dict[str, float] = {}
    per_source: dict[str, list[float]] = {}
    for result in results:
        for label, own in result.details.get("sources", {}).items():
            if own.is_ok:
                per_source.setdefault(label, []).append(own.score)
    for label, scores in per_source.items():
        metrics[f"reward/{label}/mean"], metrics[f"reward/{label}/std"] = _mean_std(scores)
    metrics["reward/mean"], metrics["reward/std"] = _mean_std([r.score for r in results if r.is_ok])
    metrics["reward/failures/timeout"] = sum(r.status == "timeout" for r in results)
    metrics["reward/failures/error"] = sum(r.status == "error" for r in results)
    metrics["reward/failure_rate"] = (metrics["reward/failures/timeout"] + metrics["reward/failures/error"]) / len(
        results
    )
    return metrics


def gold_metrics(gold: RewardSource, requests: Sequence[RewardRequest], results: Sequence[RewardResult]) -> dict:
    """reward/proxy and reward/gold over the responses that both the trained reward (``results``)
    and the gold source (scored here, on ``requests``) scored ``ok``: the proxy score the policy
    is trained on, before shaping, and the gold score it stands for (Gao et al. 2022, "Scaling
    Laws for Reward Model Overoptimization": the gold reward model plays the human). NaN when
    no response has both."""
    gold_results = gold.score(requests)
    pairs = [(r.score, g.score) for r, g in zip(results, gold_results, strict=True) if r.is_ok and g.is_ok]
    proxy, gold_scores = [p for p, _ in pairs], [g for _, g in pairs]
    return {
        "reward/proxy": sum(proxy) / len(pairs) if pairs else math.nan,
        "reward/gold": sum(gold_scores) / len(pairs) if pairs else math.nan,
    }


def response_metrics(exp: Experience) -> dict[str, float]:
    """response/…: lengths (EOS included), truncation rate, Distinct-1/2 of the token ids; for
    multi-turn batches also the turn, tool and environment-reward metrics (:func:`turn_metrics`)."""
    rollout = exp.rollout
    lengths = rollout.lengths.float()
    tokens = masked_token_lists(rollout.response_ids, rollout.response_mask)
    return {
        "response/length/mean": lengths.mean().item(),
        "response/length/max": lengths.max().item(),
        "response/length/min": lengths.min().item(),
        "response/truncation_rate": sum(r in TRUNCATED for r in rollout.finish_reasons) / len(rollout),
        "response/distinct_1": distinct_n(tokens, 1),
        "response/distinct_2": distinct_n(tokens, 2),
        **(turn_metrics(rollout) if rollout.turns is not None else {}),
    }


# Finish reasons of a response that did not end on its own: the token budget, or the turn limit
# (it still called a tool in its last turn allowed).
TRUNCATED = ("length", "turn_limit")
# A tool call's status (glassrl.rollout.agent.tools.ToolResult); each has a tool/calls/<status> rate.
CALL_STATUSES = ("ok", "error", "timeout")


def tool_use(turns: Sequence) -> tuple[bool, bool]:
    """(called a tool, some call ran: status ok) of one multi-turn response's turns."""
    calls = [c for t in turns for c in t.tool_calls]
    return bool(calls), any(c.get("status") == "ok" for c in calls)


def turn_metrics(rollout) -> dict[str, float]:
    """Multi-turn batches (docs/metrics.md): response/turns/mean, response/observation_tokens/mean,
    tool/… from each turn's tool-call records, reward/env/<part>/mean from the environment's reward parts."""
    turns = rollout.turns
    B = len(turns)
    statuses = [c.get("status") for response in turns for t in response for c in t.tool_calls]
    used = [tool_use(response) for response in turns]
    observed = (rollout.response_context_mask & ~rollout.response_mask).sum(-1).float()  # (B,)
    metrics = {
        "response/turns/mean": sum(len(t) for t in turns) / B,
        "response/observation_tokens/mean": observed.mean().item(),
        "tool/calls/mean": len(statuses) / B,
        "tool/call_rate": sum(called for called, _ in used) / B,
        "tool/valid_call_rate": sum(valid for _, valid in used) / B,
    }
    for status in CALL_STATUSES:
        metrics[f"tool/calls/{status}"] = statuses.count(status) / len(statuses) if statuses else math.nan
    parts = sorted({name for response in turns for t in response for name in t.reward_parts})
    for name in parts:
        totals = [sum(t.reward_parts.get(name, 0.0) for t in response) for response in turns]
        metrics[f"reward/env/{name}/mean"] = sum(totals) / B
    return metrics


def sequence_kl(kl: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over the responses with a valid token of Σ_i kl[b, i] over their valid tokens (B, T):
    the sequence-level KL(π ‖ π_ref) of Gao et al. 2022, whose square root is their x axis. NaN
    when no response has a valid token."""
    rows = mask.any(-1)  # (B,)
    per_response = torch.where(mask, kl, 0.0).sum(-1)[rows]  # (K,)
    return per_response.mean().item() if len(per_response) else math.nan


def tensor_metrics(exp: Experience) -> dict[str, float]:
    """kl/…, actor/entropy, critic/… of phase 3, advantage/… and returns/… of phase 5, and
    rollout/… (the train/rollout mismatch) when the rollout engine kept its log-probs."""
    mask = exp.response_mask
    metrics = {"actor/entropy": masked_stats(exp.entropy, mask)["mean"]}
    if exp.kl is not None:
        metrics["kl/mean"] = masked_stats(exp.kl, mask)["mean"]
        metrics["kl/sequence"] = sequence_kl(exp.kl, mask)
        metrics["kl/beta"] = exp.beta
    metrics.update({f"advantage/{k}": v for k, v in masked_stats(exp.advantages, mask).items()})
    if exp.values is not None:
        returns = masked_stats(exp.returns, mask)
        metrics["returns/mean"], metrics["returns/std"] = returns["mean"], returns["std"]
        metrics["critic/values/mean"] = masked_stats(exp.values, mask)["mean"]
        metrics["critic/explained_variance"] = explained_variance(exp.values, exp.returns, mask)
    if exp.rollout.rollout_logprobs is not None:  # the train/rollout mismatch (glassrl.algos.rollout_is)
        mean, biggest = logprob_mismatch(exp.logprobs, exp.rollout.rollout_logprobs, mask)
        metrics["rollout/logprob_diff_mean"], metrics["rollout/logprob_diff_max"] = mean.item(), biggest.item()
    return metrics
