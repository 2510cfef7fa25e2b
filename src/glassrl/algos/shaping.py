"""Reward shaping and group filters: overlong penalty, running reward
normalisation, TTRL majority vote, DAPO dynamic-sampling filter.

Shapes: B batch (responses). ``group_index`` (B,) long says which prompt each
response answers; ids need not be contiguous or sorted.
"""

from __future__ import annotations

from collections import Counter

import torch


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache_length: int) -> torch.Tensor:
    """DAPO soft overlong punishment R_length(y) per response (B,) float.

    Yu et al. 2025, DAPO, eq. 13: 0 while |y| ≤ L_max − L_cache, then
    ((L_max − L_cache) − |y|) / L_cache, falling linearly to −1 at
    |y| = L_max, and −1 beyond. Added to the task score.

    lengths: (B,) long, response lengths |y| in tokens.
    max_length: L_max; cache_length: L_cache, 0 < L_cache ≤ L_max.
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"overlong_penalty: cache_length (L_cache) = {cache_length} must satisfy "
            f"0 < L_cache <= max_length (L_max) = {max_length}"
        )
    soft_start = max_length - cache_length
    ramp = (soft_start - lengths.to(torch.float32)) / cache_length  # eq. 13, middle case
    penalty = torch.where(lengths <= soft_start, torch.zeros_like(ramp), ramp)
    return torch.where(lengths > max_length, torch.full_like(ramp, -1.0), penalty)


class RunningRewardNormalizer:
    """Running mean and variance of every score seen, to normalise new ones.

    ``update`` merges a batch into the running statistics with the parallel
    form of Welford's algorithm (Chan, Golub & LeVeque 1979, as OpenAI
    baselines' RunningMeanStd), exact for any batch size and stable (no
    E[x²] − E[x]²). Statistics are kept in float64 on the device of the last
    update. ``normalize`` returns (s − mean) / sqrt(var + eps) with the
    unbiased variance; until two scores have been seen the variance is
    undefined and the scale is 1 (mean 0 until the first one).
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = eps
        self.count = 0
        self.mean = torch.zeros((), dtype=torch.float64)
        self.m2 = torch.zeros((), dtype=torch.float64)  # Σ (x − mean)²

    def update(self, scores: torch.Tensor) -> None:
        """Add the scores of a batch (any shape; all entries count)."""
        n_batch = scores.numel()
        if n_batch == 0:
            return
        x = scores.detach().to(torch.float64).flatten()
        mean_batch = x.mean()
        m2_batch = ((x - mean_batch) ** 2).sum()
        mean, m2 = self.mean.to(x.device), self.m2.to(x.device)
        total = self.count + n_batch
        delta = mean_batch - mean
        # Chan et al. 1979: combine (n_a, mean_a, M2_a) with (n_b, mean_b, M2_b).
        self.mean = mean + delta * (n_batch / total)
        self.m2 = m2 + m2_batch + delta**2 * (self.count * n_batch / total)
        self.count = total

    def variance(self) -> torch.Tensor:
        """Unbiased variance of the scores seen so far (0-d float64); 1 before two scores."""
        if self.count < 2:
            return torch.ones((), dtype=torch.float64, device=self.m2.device)
        return self.m2 / (self.count - 1)

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        """(scores − mean) / sqrt(var + eps), same shape and dtype as ``scores``."""
        mean = self.mean.to(scores.device)
        scale = torch.rsqrt(self.variance().to(scores.device) + self.eps)
        return ((scores.to(torch.float64) - mean) * scale).to(scores.dtype)

    def state_dict(self) -> dict:
        """{"count": int, "mean": 0-d tensor, "m2": 0-d tensor} (float64)."""
        return {"count": self.count, "mean": self.mean.clone(), "m2": self.m2.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        missing = {"count", "mean", "m2"} - set(state)
        if missing:
            raise ValueError(f"RunningRewardNormalizer state: missing keys {sorted(missing)}; expected count, mean, m2")
        self.count = int(state["count"])
        self.mean = torch.as_tensor(state["mean"], dtype=torch.float64).clone()
        self.m2 = torch.as_tensor(state["m2"], dtype=torch.float64).clone()


def majority_vote(answers: list[str | None], group_index: torch.Tensor) -> tuple[list[str | None], torch.Tensor]:
    """TTRL pseudo-labels and rewards (Zuo et al. 2025, "TTRL: Test-Time
    Reinforcement Learning", §2: majority vote over the group's extracted
    answers gives the label; reward 1 if a response's answer equals it, else 0).

    answers: one extracted answer per response (B entries), None where no
        answer could be extracted. Compared as exact strings: normalising
        them ("2", "2.0", "\\boxed{2}") is the answer extractor's job.
    group_index: (B,) long.
    Returns (pseudo_labels, rewards): the label of each response's group
    (B entries, None when no response of the group has an answer) and
    rewards (B,) float32 on ``group_index``'s device.

    None never wins. Ties between the most frequent answers go to the one
    that occurs first in batch order (lowest response index), so the result
    depends only on the inputs.
    """
    groups = group_index.tolist()
    if len(answers) != len(groups):
        raise ValueError(f"majority_vote: {len(answers)} answers for {len(groups)} responses in group_index")
    votes: dict[int, Counter] = {}
    first_seen: dict[tuple[int, str], int] = {}
    for i, (g, a) in enumerate(zip(groups, answers)):
        if a is None:
            continue
        votes.setdefault(g, Counter())[a] += 1
        first_seen.setdefault((g, a), i)
    label = {g: max(counter, key=lambda a, g=g: (counter[a], -first_seen[(g, a)])) for g, counter in votes.items()}
    pseudo_labels = [label.get(g) for g in groups]
    rewards = [float(a is not None and a == lab) for a, lab in zip(answers, pseudo_labels)]
    return pseudo_labels, torch.tensor(rewards, dtype=torch.float32, device=group_index.device)


def dynamic_sampling_keep(scores: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: keep responses whose group's scores differ (B,) bool.

    Yu et al. 2025, DAPO, eq. 11 constraint 0 < |{o_i | is_equivalent(a, o_i)}| < G:
    with 0/1 accuracy a group is kept unless all of it is right or all wrong,
    i.e. unless its scores are identical. Those groups have GRPO advantage 0
    everywhere and would only dilute the batch. Generalised to any scores as
    "max > min within the group"; a group of one is never kept.

    scores: (B,) float; group_index: (B,) long.
    """
    # torch.unique syncs with the host once; the caller re-slices the batch on the host anyway.
    _, inverse = torch.unique(group_index, return_inverse=True)  # (B,) dense group ids
    n = len(scores)
    high = torch.full((n,), -torch.inf, dtype=scores.dtype, device=scores.device)
    low = torch.full((n,), torch.inf, dtype=scores.dtype, device=scores.device)
    high = high.scatter_reduce(0, inverse, scores, "amax")
    low = low.scatter_reduce(0, inverse, scores, "amin")
    return high[inverse] > low[inverse]
