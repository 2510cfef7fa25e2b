"""Losses: the policy-loss registry and the auxiliary per-token terms.

Shapes: B batch, T response length. Every function returns per-token terms
(B, T) (0 on masked positions) or per-pair terms (B,); aggregation is a
separate named step (``glassrl.algos.aggregation``, DESIGN §3).

The policy losses live in ``losses_clipped`` (PPO clip, dual clip, GSPO,
Clip-Cov) and ``losses_weighted`` (REINFORCE, CISPO, ASPO); this module is
the one place that names them and the import point for everything:

    from glassrl.algos.losses import get_policy_loss, PolicyLossParams
    out = get_policy_loss("ppo_clip")(logprobs, old_logprobs, adv, mask, PolicyLossParams())
    loss = aggregate(out.loss, mask, "token-mean")
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from glassrl.algos.kl import kl_penalty
from glassrl.algos.losses.clipped import clip_cov, dual_clip, gspo, ppo_clip
from glassrl.algos.losses.common import PolicyLossOutput, PolicyLossParams, neutralise, zero_masked
from glassrl.algos.losses.terms import ValueLossOutput, pairwise_rm_loss, value_loss
from glassrl.algos.losses.weighted import aspo, cispo, reinforce

__all__ = [
    "POLICY_LOSSES",
    "PolicyLossFn",
    "PolicyLossOutput",
    "PolicyLossParams",
    "ValueLossOutput",
    "entropy_loss_term",
    "get_policy_loss",
    "kl_loss_term",
    "pairwise_rm_loss",
    "positive_nll_term",
    "value_loss",
]

PolicyLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PolicyLossParams], PolicyLossOutput]

POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "ppo_clip": ppo_clip,
    "dual_clip": dual_clip,
    "gspo": gspo,
    "cispo": cispo,
    "aspo": aspo,
    "clip_cov": clip_cov,
    "reinforce": reinforce,
}


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``; ValueError listing the valid names."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; valid: {', '.join(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


def kl_loss_term(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kind: str = "k3",
) -> torch.Tensor:
    """Per-token KL(π_θ || π_ref) estimate to add to the loss as β·term (B, T).

    GRPO puts the KL in the loss, not in the reward (Shao et al. 2024,
    DeepSeekMath, eq. 3, with the k3 estimator of eq. 4). The gradient flows
    through ``logprobs``; 0 on masked positions.
    """
    logprobs, ref_logprobs = neutralise(response_mask, logprobs, ref_logprobs)
    return zero_masked(kl_penalty(logprobs, ref_logprobs, kind), response_mask)


def entropy_loss_term(entropy: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token entropy H(π_θ(·|s_i)) on valid tokens, 0 elsewhere (B, T).

    The trainer subtracts coef·aggregate(term): an entropy bonus (Schulman et
    al. 2017, PPO, eq. 9, the c₂·S term). ``entropy`` comes from the logits
    elsewhere; this only masks it so that a NaN on padding cannot leak.
    """
    return zero_masked(entropy, response_mask)


def positive_nll_term(logprobs: torch.Tensor, response_mask: torch.Tensor, is_positive: torch.Tensor) -> torch.Tensor:
    """−log π_θ on the valid tokens of positive responses, 0 elsewhere (B, T).

    VAPO (Yue et al. 2025), "Positive Example LM Loss": L_NLL = −1/Σ_{o∈𝒯}|o|
    · Σ_{o∈𝒯} Σ_t log π_θ(a_t|s_t) over the correct responses 𝒯, added as
    L_PPO + μ·L_NLL (μ = 0.1 in the paper). To get that normalisation,
    aggregate with "token-mean" over the mask
    ``response_mask & is_positive[:, None]``, not over ``response_mask``.

    is_positive: (B,) bool, True for responses judged correct.
    """
    positive_tokens = response_mask & is_positive[:, None]  # (B, T)
    return zero_masked(-logprobs, positive_tokens)
