"""Weighted log-likelihood policy losses: REINFORCE, CISPO, ASPO.

Shapes: B batch, T response length. Same signature as the clipped losses
(see ``glassrl.algos.losses``). These losses keep a gradient on tokens that
PPO would clip, by multiplying −A·log π_θ by a weight held constant
(stop-gradient, sg). Their per-token *values* are surrogates (−w·A·log π),
not comparable with PPO's −r·A; their gradients are what the papers define.
"""

from __future__ import annotations

import torch

from glassrl.algos.losses.common import (
    PolicyLossOutput,
    PolicyLossParams,
    clip_flags,
    log_ratio,
    neutralise,
    zero_masked,
)


def reinforce(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """Plain REINFORCE, −A·log π_θ per token (B, T).

    Gradient −A·∇log π_θ (Williams 1992, REINFORCE; Sutton et al. 2000, policy
    gradient theorem). On-policy: ``old_logprobs`` and ``params`` only feed
    the "ratio" diagnostic, which should read 1 when the data is fresh.
    """
    logprobs, old_logprobs, advantages = neutralise(response_mask, logprobs, old_logprobs, advantages)
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    loss = -advantages * logprobs
    return PolicyLossOutput(zero_masked(loss, response_mask), {"ratio": ratio.detach()})


def cispo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """CISPO: −sg(clip(r, 1 − ε^IS_low, 1 + ε^IS_high))·A·log π_θ (B, T).

    MiniMax-M1 (2025), eq. 4 (objective sg(r̂)·Â·log π) and eq. 5 (r̂, the
    clipped IS weight). Gradient −r̂·A·∇log π_θ on every token: clipping
    bounds the weight, it never removes the token. Diagnostics: ratio,
    clipped_low (r < 1 − ε^IS_low), clipped_high (r > 1 + ε^IS_high), both
    whatever the sign of A (the weight is clipped, not the objective).
    """
    logprobs, old_logprobs, advantages = neutralise(response_mask, logprobs, old_logprobs, advantages)
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    low, high = 1.0 - params.cispo_eps_is_low, 1.0 + params.cispo_eps_is_high
    weight = ratio.clamp(low, high).detach()  # MiniMax-M1 eq. 5, sg(r̂) in eq. 4
    loss = -weight * advantages * logprobs
    diagnostics = {
        "ratio": ratio.detach(),
        "clipped_low": response_mask & (ratio < low),
        "clipped_high": response_mask & (ratio > high),
    }
    return PolicyLossOutput(zero_masked(loss, response_mask), diagnostics)


def aspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """ASPO: flipped IS weight for A > 0, hard mask, soft dual clip (B, T).

    Wang et al. 2025, "ASPO: Asymmetric Importance Sampling Policy
    Optimization" (arXiv 2510.06062), as in the authors' Archer2.0 code:
    - A < 0: PPO's term −A·max(r, 1 − ε_low); tokens with r < 1 − ε_low are
      hard-masked (no gradient). Gradient −A·r·∇log π.
    - A > 0: the flipped ratio r̂ = π_old·π_θ / sg(π_θ²), value 1/r, gradient
      (1/r)·∇log π, so low-probability tokens get the larger weight. Tokens
      with r > 1 + ε_high are hard-masked (the chapter's "r > 1 − ε_high" is
      a typo, reference/README.md).
    - Soft dual clip on both signs: where the weight would exceed c (A < 0:
      r > c; A > 0: 1/r > c) the term is −A·c·log π (CISPO-style, MiniMax-M1
      eq. 4), gradient −A·c·∇log π instead of 0.
    Diagnostics: ratio, clipped_low (A < 0, r < 1 − ε_low), clipped_high
    (A > 0, r > 1 + ε_high), dual_clipped (soft-clipped tokens).
    """
    logprobs, old_logprobs, advantages = neutralise(response_mask, logprobs, old_logprobs, advantages)
    c = params.dual_clip_c
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    positive = advantages > 0
    # A < 0: lower clip only; r below 1 − ε_low gets no gradient (ASPO, hard mask).
    neg_ratio = ratio.clamp(min=1.0 - params.clip_low)
    # A > 0: upper clip only, then flip: r̂ = r_h / sg(r_h)², value 1/r_h (ASPO, AIS).
    pos_ratio = ratio.clamp(max=1.0 + params.clip_high)
    flipped = pos_ratio / pos_ratio.detach() ** 2
    soft = torch.where(positive, pos_ratio < 1.0 / c, neg_ratio > c)  # weight would exceed c
    hard_term = -advantages * torch.where(positive, flipped, neg_ratio)
    soft_term = -advantages * c * logprobs  # ASPO soft dual clip, CISPO form
    loss = torch.where(soft, soft_term, hard_term)
    diagnostics = clip_flags(ratio, advantages, response_mask, params)
    diagnostics["dual_clipped"] = response_mask & (advantages != 0) & soft
    return PolicyLossOutput(zero_masked(loss, response_mask), diagnostics)
