"""The metrics of a training step (keys and formulas: docs/metrics.md): helpers of tensors, and
the step's metrics from its Experience.

Metric helpers of a training step: pure functions of tensors, returning Python floats.

Unlike ``glassrl.algos`` this module reads values back to the host (``.item()`` /
``.tolist()``): its outputs go to the logs. Shapes: ``x``, ``values``, ``returns``,
``logprobs`` and ``mask`` (B, T); ``mask`` is bool, True = the token counts. Every
statistic is global over the valid tokens of the batch. A statistic of no valid
token (or a ratio with a zero denominator) is NaN, never a made-up 0; the sinks
write NaN as null (JSONL) or skip it (TensorBoard). Formulas: docs/metrics.md.

The metrics of one step, from its Experience (keys and formulas: docs/metrics.md).

Task accuracy (``task/accuracy``) is :func:`accuracy` of the verdicts of
glassrl.rl.evaluation.correct, the rule ``eval/accuracy`` uses: bundled-task records
by the task's verifier (``TASK_VERIFIERS[metadata["task"]]``, scored 1.0), other records by
the configured reward (a source's own verdict, else the reward reaching
``logging.eval_threshold``); responses nothing can judge are not counted.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager

import torch

from glassrl.agents.metrics import turn_metrics
from glassrl.algos.off_policy import logprob_mismatch
from glassrl.rewards.base import RewardRequest, RewardResult, RewardSource
from glassrl.rl.experience import Experience
from glassrl.rollout.base import masked_token_lists


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var[R − V] / Var[R] over valid tokens (B, T) → float.

    As OpenAI baselines ``explained_variance`` (baselines/common/math_util.py) and
    verl's ``critic/vf_explained_var``: 1 = the critic predicts the returns exactly,
    0 = no better than their mean, < 0 = worse. Both variances use Bessel's
    correction (it cancels in the ratio). NaN when Var[R] = 0 (baselines returns NaN
    there too; verl's +1e-5 in the denominator would report a meaningless number) or
    when fewer than 2 tokens are valid.
    """
    v = torch.masked_select(returns.detach(), mask).double()
    if v.numel() < 2:
        return math.nan
    residual = v - torch.masked_select(values.detach(), mask).double()
    var_returns = v.var()
    if var_returns == 0:
        return math.nan
    return (1.0 - residual.var() / var_returns).item()


def masked_stats(x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """{"mean", "std", "min", "max"} of ``x`` over valid positions (any shape) → floats.

    ``std`` is unbiased (Bessel), NaN with one valid value; all four are NaN with none.
    One host transfer for the four.
    """
    v = torch.masked_select(x.detach(), mask).double()
    if v.numel() == 0:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
    std = v.std() if v.numel() > 1 else torch.tensor(math.nan, dtype=v.dtype, device=v.device)
    mean, std, lo, hi = torch.stack([v.mean(), std, v.min(), v.max()]).tolist()
    return {"mean": mean, "std": std, "min": lo, "max": hi}


def distinct_n(sequences: Sequence[Sequence[Hashable]], n: int) -> float:
    """Distinct-n of a batch: unique n-grams / total n-grams, pooled over all sequences.

    Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation
    Models" (NAACL), distinct-1 / distinct-2: "the number of distinct unigrams and bigrams
    in generated responses ... scaled by total number of generated tokens". This scales by
    the number of n-grams instead (Σ max(len − n + 1, 0)), so that the value lies in (0, 1]
    for every n; the two agree for n = 1. The units are the items of
    each sequence: token ids for lists of ids (what the trainer passes: response tokens),
    characters for strings. NaN when no sequence has n items.
    """
    if n < 1:
        raise ValueError(f"distinct_n: n must be >= 1, got {n}")
    grams: Counter = Counter()
    for seq in sequences:
        items = list(seq)
        grams.update(tuple(items[i : i + n]) for i in range(len(items) - n + 1))
    total = sum(grams.values())
    return len(grams) / total if total else math.nan


class PhaseTimer:
    """Wall time and token counts per named phase of a step.

        timer = PhaseTimer()
        with timer.phase("generate"):
            batch = rollout(...)
            timer.add_tokens("generate", int(batch.response_mask.sum()))
        timer.metrics()   # {"perf/generate_s": 1.8, "perf/generate_tokens_per_s": 142.2}
        timer.reset()     # before the next step

    Time accumulates over repeated entries of a phase. On CUDA the device is
    synchronised at both ends of a phase, since kernels run asynchronously and would
    otherwise be charged to whichever phase next waits for them (PyTorch docs, "CUDA
    semantics: asynchronous execution").
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._seconds: dict[str, float] = defaultdict(float)
        self._tokens: dict[str, int] = defaultdict(int)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` block as phase ``name`` (a ``phase/<name>`` range in a torch.profiler
        trace: ``glassrl train --profile``)."""
        _sync_cuda()
        start = self._clock()
        try:
            with torch.profiler.record_function(f"phase/{name}"):
                yield
        finally:
            _sync_cuda()
            self._seconds[name] += self._clock() - start

    def add_tokens(self, name: str, tokens: int) -> None:
        """Count ``tokens`` processed by phase ``name`` (for its tokens/s)."""
        self._tokens[name] += int(tokens)

    def metrics(self) -> dict[str, float]:
        """``perf/<phase>_s`` for every timed phase, ``perf/<phase>_tokens_per_s`` for those
        with tokens (NaN if such a phase took no measurable time)."""
        out: dict[str, float] = {}
        for name, seconds in self._seconds.items():
            out[f"perf/{name}_s"] = seconds
            if self._tokens.get(name):
                out[f"perf/{name}_tokens_per_s"] = self._tokens[name] / seconds if seconds > 0 else math.nan
        return out

    def reset(self) -> None:
        self._seconds.clear()
        self._tokens.clear()


def _sync_cuda() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


# ---------------------------------------------------------------- the step's metrics


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
    metrics.update({f"reward/{key}/mean": value for key, value in criterion_means(results).items()})
    metrics["reward/mean"], metrics["reward/std"] = _mean_std([r.score for r in results if r.is_ok])
    metrics["reward/failures/timeout"] = sum(r.status == "timeout" for r in results)
    metrics["reward/failures/error"] = sum(r.status == "error" for r in results)
    metrics["reward/failure_rate"] = (metrics["reward/failures/timeout"] + metrics["reward/failures/error"]) / len(
        results
    )
    return metrics


def criterion_means(results: Sequence[RewardResult]) -> dict[str, float]:
    """{"<source>/<criterion>": the mean score s_i of the criterion} for every rubric source of the
    combined results (``details["sources"][label].details["criteria"]``), over the responses it
    scored ``ok``: a 0/1 criterion's pass rate."""
    scores: dict[str, list[float]] = {}
    for result in results:
        for label, own in result.details.get("sources", {}).items():
            if own.is_ok:
                for name, value in own.details.get("criteria", {}).items():
                    scores.setdefault(f"{label}/{name}", []).append(value)
    return {key: sum(values) / len(values) for key, values in scores.items()}


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
    if exp.teacher_logprobs is not None:  # on-policy distillation: the student's reverse KL from the teacher
        metrics["teacher/reverse_kl"] = sequence_kl(exp.logprobs - exp.teacher_logprobs, mask)
        metrics["teacher/logprob/mean"] = masked_stats(exp.teacher_logprobs, mask)["mean"]
    metrics.update({f"advantage/{k}": v for k, v in masked_stats(exp.advantages, mask).items()})
    if exp.values is not None:
        returns = masked_stats(exp.returns, mask)
        metrics["returns/mean"], metrics["returns/std"] = returns["mean"], returns["std"]
        metrics["critic/values/mean"] = masked_stats(exp.values, mask)["mean"]
        metrics["critic/explained_variance"] = explained_variance(exp.values, exp.returns, mask)
    if exp.rollout.rollout_logprobs is not None:  # the train/rollout mismatch (glassrl.algos.off_policy)
        mean, biggest = logprob_mismatch(exp.logprobs, exp.rollout.rollout_logprobs, mask)
        metrics["rollout/logprob_diff_mean"], metrics["rollout/logprob_diff_max"] = mean.item(), biggest.item()
        if bool(mask.any()):  # the tail the mean hides: 1 % of the tokens lie further out (docs/debugging.md)
            diff = (exp.logprobs - exp.rollout.rollout_logprobs.to(exp.logprobs.device))[mask].abs()  # (N,)
            metrics["rollout/logprob_diff_p99"] = torch.quantile(diff.double(), 0.99).item()
    return {**metrics, **off_policy_metrics(exp)}


def off_policy_metrics(exp: Experience) -> dict[str, float]:
    """rollout/staleness… over the step's training tokens (asynchronous training: how many actor
    updates each lags), and what algo.off_policy did to them: the share of tokens it dropped, the
    share it cut at its cap, its weights' mean and max."""
    mask, metrics = exp.response_mask, {}
    if exp.staleness is not None and bool(mask.any()):
        lags = exp.staleness[mask]  # (N,) long
        metrics["rollout/staleness"] = lags.double().mean().item()
        metrics["rollout/staleness_max"] = int(lags.max())
        counts = torch.bincount(lags.clamp(min=0).cpu())
        for k, count in enumerate(counts.tolist()):
            metrics[f"rollout/staleness_share/{k}"] = count / len(lags)
    c = exp.correction
    if c is not None:
        tokens = max(int(mask.sum()), 1)
        metrics["rollout/masked_share"] = int((mask & ~c.keep).sum()) / tokens
        metrics["actor/rollout_is_clip_frac"] = int(c.cut.sum()) / tokens
        kept = c.weights[c.keep]
        metrics["rollout/is_weight_mean"] = kept.double().mean().item() if len(kept) else math.nan
        metrics["rollout/is_weight_max"] = kept.max().item() if len(kept) else math.nan
    return metrics
