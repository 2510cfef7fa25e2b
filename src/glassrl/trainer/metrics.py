"""Metric helpers of a training step: pure functions of tensors, returning Python floats.

Unlike ``glassrl.algos`` this module reads values back to the host (``.item()`` /
``.tolist()``): its outputs go to the logs. Shapes: ``x``, ``values``, ``returns``,
``logprobs`` and ``mask`` (B, T); ``mask`` is bool, True = the token counts. Every
statistic is global over the valid tokens of the batch. A statistic of no valid
token (or a ratio with a zero denominator) is NaN, never a made-up 0; the sinks
write NaN as null (JSONL) or skip it (TensorBoard). Formulas: docs/metrics.md.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager

import torch

from glassrl.algos.masked import masked_mean


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


def masked_fraction(flags: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of valid positions where the bool ``flags`` hold: |flags ∧ mask| / |mask|.

    For the clip diagnostics of the policy losses (``clipped_low``, ``clipped_high``,
    ``dual_clipped``) and of the value loss (``clipped``): the share of valid tokens
    whose clipped branch is active, as verl's ``pg_clipfrac`` (a masked mean of the
    indicator). NaN with no valid position.
    """
    return masked_mean(flags.to(torch.float64), mask).item()


def approx_kl(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """How far an update moved the policy: KL(π_old ‖ π_θ) estimated on the sampled tokens.

    k3 = (r − 1) − log r with r = π_θ / π_old, masked mean over valid tokens (B, T).
    Unbiased for KL(π_old ‖ π_θ) because the tokens were drawn from π_old, and ≥ 0 per
    token (Schulman 2020, "Approximating KL divergence", k3; the ``approx_kl`` of
    CleanRL's ppo.py). Not clamped, unlike the KL penalty (algos/kl.py): a diagnostic
    should show a large step, not hide it.
    """
    log_ratio = (logprobs.detach() - old_logprobs.detach()).double()
    return masked_mean(torch.expm1(log_ratio) - log_ratio, mask).item()


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
