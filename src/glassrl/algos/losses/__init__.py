"""Losses: the one registry of policy losses, and the import point for every loss.

Shapes: B batch, T response length. Every loss returns per-token terms
(B, T) (0 on masked positions) or per-pair terms (B,); aggregation is a
separate named step (``glassrl.algos.aggregation``, DESIGN §3).

``common.py`` holds what the policy losses share (parameters, output, ratio,
clip flags); the policy losses are in ``clipped.py`` (PPO clip, dual clip,
GSPO, Clip-Cov) and ``weighted.py`` (REINFORCE, CISPO, ASPO); the other
terms (KL, entropy, NLL, value, Bradley–Terry) are in ``terms.py``. Import
them all from here:

    from glassrl.algos.losses import get_policy_loss, PolicyLossParams
    out = get_policy_loss("ppo_clip")(logprobs, old_logprobs, adv, mask, PolicyLossParams())
    loss = aggregate(out.loss, mask, "token-mean")
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from glassrl.algos.losses.clipped import clip_cov, dual_clip, gspo, ppo_clip
from glassrl.algos.losses.common import PolicyLossOutput, PolicyLossParams
from glassrl.algos.losses.terms import (
    ValueLossOutput,
    entropy_loss_term,
    kl_loss_term,
    pairwise_rm_loss,
    positive_nll_term,
    value_loss,
)
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
