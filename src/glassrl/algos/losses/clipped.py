"""Clipped-surrogate policy losses: PPO clip, dual clip, GSPO, Clip-Cov.

Shapes: B batch, T response length. Signature of each (the POLICY_LOSSES
registry in ``glassrl.algos.losses``):
``fn(logprobs (B, T), old_logprobs (B, T), advantages (B, T),
response_mask (B, T) bool, params) -> PolicyLossOutput`` with ``loss`` (B, T),
0 on masked positions.
"""

from __future__ import annotations

import math

import torch

from glassrl.algos.losses.common import (
    PolicyLossOutput,
    PolicyLossParams,
    clip_flags,
    clipped_surrogate,
    log_ratio,
    neutralise,
    zero_masked,
)
from glassrl.algos.masked import masked_sum


def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """PPO's clipped surrogate with clip-higher, per token (B, T).

    −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A), r = π_θ / π_old
    (Schulman et al. 2017, eq. 7; Yu et al. 2025, DAPO, eq. 8).
    Diagnostics: ratio, clipped_low, clipped_high.
    """
    logprobs, old_logprobs, advantages = neutralise(response_mask, logprobs, old_logprobs, advantages)
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    loss = clipped_surrogate(ratio, advantages, params)
    return PolicyLossOutput(zero_masked(loss, response_mask), clip_flags(ratio, advantages, response_mask, params))


def dual_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """Dual-clip PPO, per token (B, T).

    For A < 0 the objective is max(min(r·A, clip(r)·A), c·A), so the loss of
    one token is at most −c·A = c·|A| however large r grows (Ye et al. 2020,
    "Mastering Complex Control in MOBA Games", eq. 5); for A ≥ 0 it is PPO's.
    Diagnostics: ratio, clipped_low, clipped_high, dual_clipped (A < 0 and
    r > c, where the gradient is 0).
    """
    logprobs, old_logprobs, advantages = neutralise(response_mask, logprobs, old_logprobs, advantages)
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    ppo_loss = clipped_surrogate(ratio, advantages, params)
    bound = -advantages * params.dual_clip_c  # −c·A, Ye et al. 2020, eq. 5
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(ppo_loss, bound), ppo_loss)
    diagnostics = clip_flags(ratio, advantages, response_mask, params)
    diagnostics["dual_clipped"] = response_mask & negative & (ppo_loss > bound)
    return PolicyLossOutput(zero_masked(loss, response_mask), diagnostics)


def gspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """GSPO: one clipped, length-normalised ratio per sequence (B, T).

    s_i = (π_θ(y_i|x) / π_old(y_i|x))^(1/|y_i|) = exp(mean_t log r_{i,t})
    (Zheng et al. 2025, GSPO, eq. 7), clipped per sequence in the objective
    min(s_i·A, clip(s_i, 1 − ε_low, 1 + ε_high)·A) (eq. 5). Written per token
    in the GSPO-token form (§4.3): s_{i,t} = sg[s_i] · π_θ(y_{i,t}) /
    sg[π_θ(y_{i,t})], whose value is s_i and whose gradient is
    s_i · ∇log π_θ(y_{i,t}). With one advantage per sequence, every token of
    sequence i carries eq. 5's term ℓ_i for that sequence, so a sequence's
    token mean is ℓ_i and its gradient. Only "seq-mean-token-mean" then gives
    eq. 5, 1/G Σ_i ℓ_i, value and gradient. The other modes weight ℓ_i by the
    sequence's length: "token-mean" gives Σ_i |y_i|·ℓ_i / Σ_i |y_i|,
    "seq-mean-token-sum" 1/G Σ_i |y_i|·ℓ_i (verl's GSPO, too, aggregates
    with whichever mode is configured). Diagnostics: ratio (= s_i),
    clipped_low, clipped_high (per sequence, broadcast to its tokens).
    """
    logprobs, old_logprobs, advantages = neutralise(response_mask, logprobs, old_logprobs, advantages)
    length = response_mask.sum(-1).clamp(min=1)  # (B,); an empty row gives s = 1
    seq_log_ratio = masked_sum(log_ratio(logprobs, old_logprobs), response_mask, dim=-1) / length
    # GSPO §4.3: value s_i, gradient only through this token's log-prob.
    token_log_ratio = seq_log_ratio.detach()[:, None] + logprobs - logprobs.detach()  # (B, T)
    ratio = torch.exp(token_log_ratio)
    loss = clipped_surrogate(ratio, advantages, params)
    return PolicyLossOutput(zero_masked(loss, response_mask), clip_flags(ratio, advantages, response_mask, params))


def clip_cov(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """Clip-Cov: PPO clip, plus the gradient of a few high-covariance tokens
    detached (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning
    LMs", §5).

    Cov_i = (log π_i − mean log π) · (A_i − mean A), means over the batch's
    valid tokens. Eligible: valid tokens that PPO did not already clip with
    ω_low < Cov < ω_high. Detached: max(⌊r·N⌋, 1) of them, N = number of valid
    tokens. The paper draws them uniformly at random; here they are the
    eligible tokens of highest covariance (ties: lower flat index first), so
    the loss is a deterministic function of its inputs. A detached token keeps
    its loss value and contributes no gradient. Diagnostics: ratio,
    clipped_low, clipped_high, cov_clipped.
    """
    logprobs, old_logprobs, advantages = neutralise(response_mask, logprobs, old_logprobs, advantages)
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    loss = clipped_surrogate(ratio, advantages, params)
    diagnostics = clip_flags(ratio, advantages, response_mask, params)

    count = response_mask.sum().clamp(min=1)
    lp = logprobs.detach()
    centred_lp = lp - masked_sum(lp, response_mask) / count
    centred_adv = advantages.detach() - masked_sum(advantages.detach(), response_mask) / count
    cov = centred_lp * centred_adv  # (B, T), Cui et al. 2025, §5 Cov(y_i)
    ppo_clipped = diagnostics["clipped_low"] | diagnostics["clipped_high"]
    eligible = response_mask & ~ppo_clipped & (cov > params.clip_cov_omega_low) & (cov < params.clip_cov_omega_high)
    k = torch.floor(params.clip_cov_r * response_mask.sum()).clamp(min=1)  # max(⌊r·N⌋, 1)
    # Rank the eligible tokens by covariance without leaving the device.
    score = torch.where(eligible, cov, torch.full_like(cov, -math.inf)).flatten()  # (B*T,)
    order = torch.argsort(score, descending=True, stable=True)
    positions = torch.arange(order.numel(), device=order.device)
    rank = torch.empty_like(order).scatter_(0, order, positions)  # rank[order[j]] = j
    selected = eligible & (rank < k).view_as(eligible)
    loss = torch.where(selected, loss.detach(), loss)
    diagnostics["cov_clipped"] = selected
    return PolicyLossOutput(zero_masked(loss, response_mask), diagnostics)
