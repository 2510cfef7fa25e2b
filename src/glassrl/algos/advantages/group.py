"""The critic-free estimators: group baselines (GRPO, Dr.GRPO, GRPO process
rewards, RLOO, REINFORCE++-baseline) and ReMax's greedy baseline.

Shapes: B batch (responses), T response length, G number of groups.
``group_index`` (B,) long says which prompt each response answers; ids need
not be contiguous or sorted. All group statistics are vectorised (no loop over
groups). A group statistic over fewer than 2 members is an error, named by its
group id: a "baseline" from one sample is that sample itself.

The outcome estimators read the sequence score S as the masked sum of
``token_rewards`` over the row (verl: ``token_level_rewards.sum(-1)``), so a
KL cost in the reward enters through S, and broadcast one advantage over the
row's valid tokens (task-level credit, DESIGN §1). The ``estimate_*``
functions adapt this math to the one estimator signature
(``glassrl.algos.advantages.types``); what each returns as ``returns`` is
listed in ``glassrl.algos.advantages``.
"""

from __future__ import annotations

import torch

from glassrl.algos.advantages.types import AdvantageInputs, AdvantageOutputs, AdvantageParams
from glassrl.algos.masked import masked_sum, masked_whiten


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


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
    zero = _zero(token_rewards)
    steps = torch.where(step_end_mask, token_rewards, zero)  # (B, T)
    mean = _group_sum(steps.sum(-1), inverse, len(ids)) / counts  # (G,)
    centred = torch.where(step_end_mask, steps - mean[inverse].unsqueeze(1), zero)  # (B, T)
    var = _group_sum((centred**2).sum(-1), inverse, len(ids)) / (counts - 1)  # (G,) unbiased
    normalised = centred / (var.sqrt()[inverse].unsqueeze(1) + eps)  # (B, T)
    return reward_to_go(normalised, response_mask)  # Σ over the steps at or after t


def reward_to_go(token_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Σ_{j ≥ i} r_j over the row's valid tokens, undiscounted (B, T); 0 on masked positions.

    The reverse cumulative sum of verl's compute_remax_outcome_advantage
    (``(r * mask).flip(-1).cumsum(-1).flip(-1)``), masked with torch.where.
    """
    zero = _zero(token_rewards)
    to_go = torch.where(response_mask, token_rewards, zero).flip(-1).cumsum(-1).flip(-1)  # (B, T)
    return torch.where(response_mask, to_go, zero)


# ---------------------------------------------------------------- the estimators (one signature)


def sequence_scores(inputs: AdvantageInputs) -> torch.Tensor:
    """S (B,): masked sum of token_rewards over the row (verl)."""
    return masked_sum(inputs.token_rewards, inputs.response_mask, dim=-1)


def broadcast(seq_advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """One advantage per row (B,) on every valid token of the row (B, T); 0 elsewhere."""
    return torch.where(response_mask, seq_advantages.unsqueeze(-1), _zero(seq_advantages))


def estimate_grpo(inputs: AdvantageInputs, params: AdvantageParams, normalize_by_std: bool) -> AdvantageOutputs:
    """GRPO and Dr.GRPO ("grpo", "dr_grpo"): R = A, as verl's compute_grpo_outcome_advantage returns."""
    name = "grpo" if normalize_by_std else "dr_grpo"
    advantages = broadcast(
        grpo_outcome(sequence_scores(inputs), inputs.group_index, normalize_by_std, params.eps, name),
        inputs.response_mask,
    )
    return AdvantageOutputs(advantages, advantages)


def estimate_grpo_process(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    """GRPO with process rewards ("grpo_process"): R = A (verl has no such estimator to follow)."""
    advantages = grpo_process(
        inputs.token_rewards, inputs.step_end_mask, inputs.response_mask, inputs.group_index, params.eps
    )
    return AdvantageOutputs(advantages, advantages)


def estimate_rloo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    """RLOO ("rloo"): R = A, as verl's compute_rloo_outcome_advantage returns."""
    advantages = broadcast(rloo(sequence_scores(inputs), inputs.group_index), inputs.response_mask)
    return AdvantageOutputs(advantages, advantages)


def estimate_remax(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    """ReMax ("remax"): A = S − r(greedy) on every valid token; R = the reward-to-go Σ_{j ≥ i} r_j.

    ReMax (Li et al. 2023, Algorithm 1): the baseline is the reward of the
    greedy response to the same prompt, and the gradient weight of every token
    is r(x, y) − r(x, ȳ). R follows verl's compute_remax_outcome_advantage
    (undiscounted reward-to-go). verl's advantage is that reward-to-go minus
    the baseline, per token: the two agree when every reward of the row sits
    on its last valid token (an outcome score, no KL in the reward) and differ
    along the row otherwise; glassrl keeps the paper's one weight per response.
    """
    advantages = broadcast(sequence_scores(inputs) - inputs.baseline_rewards, inputs.response_mask)
    return AdvantageOutputs(advantages, reward_to_go(inputs.token_rewards, inputs.response_mask))


def estimate_reinforce_pp_baseline(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    """REINFORCE++-baseline ("reinforce_pp_baseline"): A = S − group mean, broadcast, whitened
    over the batch; R = S − group mean before whitening.

    REINFORCE++-baseline (Hu 2025; OpenRLHF "reinforce_baseline"). As verl's
    compute_reinforce_plus_plus_baseline_outcome_advantage, the KL part of
    token_rewards enters through S; OpenRLHF instead puts the centred score on
    the last token and takes discounted returns (the same for γ = 1 without
    KL in the reward). verl returns the whitened values as R too; here R is
    the raw A (DESIGN §1: returns come from advantages before whitening).
    """
    seq = minus_group_mean(sequence_scores(inputs), inputs.group_index, "reinforce_pp_baseline")
    centred = broadcast(seq, inputs.response_mask)
    return AdvantageOutputs(masked_whiten(centred, inputs.response_mask), centred)
