"""Group baselines of the critic-free estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline).

Shapes: B batch (responses), T response length, G number of groups.
``group_index`` (B,) long says which prompt each response answers; ids need
not be contiguous or sorted. All group statistics are vectorised (no loop over
groups). A group statistic over fewer than 2 members is an error, named by its
group id: a "baseline" from one sample is that sample itself.
"""

from __future__ import annotations

import torch


def _groups(group_index: torch.Tensor, weight: torch.Tensor | None = None):
    """(ids (G,), inverse (B,), counts (G,)); row b counts ``weight[b]`` times (default 1)."""
    ids, inverse = torch.unique(group_index, return_inverse=True)
    weight = torch.ones_like(group_index) if weight is None else weight.long()
    counts = torch.zeros(len(ids), dtype=torch.long, device=group_index.device)
    return ids, inverse, counts.index_add(0, inverse, weight)


def _require_two(ids: torch.Tensor, counts: torch.Tensor, estimator: str, what: str) -> None:
    small = (counts < 2).nonzero().flatten()
    if len(small):
        g = int(small[0])
        raise ValueError(
            f"{estimator}: group {int(ids[g])} has {int(counts[g])} {what}; a group baseline needs at least 2"
        )


def _group_sum(x: torch.Tensor, inverse: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add(0, inverse, x)


def grpo_outcome(
    scores: torch.Tensor, group_index: torch.Tensor, normalize_by_std: bool, eps: float, name: str
) -> torch.Tensor:
    """(s_i − mean_g) / (std_g + eps) per response (B,); without std when not ``normalize_by_std``.

    DeepSeekMath (Shao et al. 2024) §4.1.2: Â_i = (r_i − mean(r)) / std(r),
    std unbiased as TRL/verl (torch.std); eps keeps a group whose scores are
    all equal at advantage 0 instead of 0/0. Dr.GRPO (Liu et al. 2025,
    "Understanding R1-Zero-Like Training") drops the division by std, which
    up-weights questions whose scores barely differ.
    """
    ids, inverse, counts = _groups(group_index)
    _require_two(ids, counts, name, "responses")
    mean = _group_sum(scores, inverse, len(ids)) / counts  # (G,)
    centred = scores - mean[inverse]  # (B,)
    if not normalize_by_std:
        return centred
    std = (_group_sum(centred**2, inverse, len(ids)) / (counts - 1)).sqrt()  # (G,)
    return centred / (std[inverse] + eps)


def rloo(scores: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """A_i = s_i − mean of the other responses of the group (B,).

    RLOO (Ahmadian et al. 2024, "Back to Basics", after Kool et al. 2019):
    baseline (Σ_group s − s_i) / (n − 1).
    """
    ids, inverse, counts = _groups(group_index)
    _require_two(ids, counts, "rloo", "responses")
    total = _group_sum(scores, inverse, len(ids))[inverse]  # (B,)
    return scores - (total - scores) / (counts[inverse] - 1)


def minus_group_mean(scores: torch.Tensor, group_index: torch.Tensor, name: str) -> torch.Tensor:
    """s_i − mean of the group (B,) (REINFORCE++-baseline; Hu 2025)."""
    return grpo_outcome(scores, group_index, False, 0.0, name)


def grpo_process(
    token_rewards: torch.Tensor,
    step_end_mask: torch.Tensor,
    response_mask: torch.Tensor,
    group_index: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """GRPO with process supervision (DeepSeekMath, Shao et al. 2024, §4.1.3). (B, T).

    Every step reward r (token_rewards at ``step_end_mask``) is normalised with
    the mean and std of all step rewards of its group: r̃ = (r − mean) / (std
    + eps); the advantage of token t is Σ r̃ over the steps ending at or after t.
    Tokens after the last step end get 0, as do masked positions.
    """
    outside = step_end_mask & ~response_mask
    if bool(outside.any()):
        b, t = outside.nonzero()[0].tolist()
        raise ValueError(f"grpo_process: step_end_mask[{b}, {t}] is True on a token where response_mask is False")
    ids, inverse, counts = _groups(group_index, step_end_mask.sum(-1))
    _require_two(ids, counts, "grpo_process", "step rewards")
    zero = torch.zeros((), dtype=token_rewards.dtype, device=token_rewards.device)
    steps = torch.where(step_end_mask, token_rewards, zero)  # (B, T)
    mean = _group_sum(steps.sum(-1), inverse, len(ids)) / counts  # (G,)
    centred = torch.where(step_end_mask, steps - mean[inverse].unsqueeze(1), zero)  # (B, T)
    var = _group_sum((centred**2).sum(-1), inverse, len(ids)) / (counts - 1)  # (G,) unbiased
    normalised = centred / (var.sqrt()[inverse].unsqueeze(1) + eps)  # (B, T)
    # Σ over steps at or after t: a reverse cumulative sum along T.
    to_go = normalised.flip(-1).cumsum(-1).flip(-1)
    return torch.where(response_mask, to_go, zero)
