"""Losses: the one registry of policy losses, and the import point for every loss.

Shapes: B batch, T response length. Every loss returns per-token terms
(B, T) (0 on masked positions) or per-pair terms (B,); aggregation is a
separate named step (``glassrl.algos.aggregation``, DESIGN §3).

Each entry of POLICY_LOSSES (:class:`PolicyLoss`) is the loss and the algo.* knobs it
reads. ``common.py`` holds what the policy losses share (parameters, output, ratio,
clip flags); the policy losses are in ``clipped.py`` (PPO clip, dual clip,
GSPO, Clip-Cov) and ``weighted.py`` (REINFORCE, CISPO, ASPO); the other
terms (KL, entropy, NLL, value, Bradley–Terry) are in ``terms.py``; the offline
preference losses (DPO, IPO, SimPO, KTO: their own registries, PAIR_LOSSES and
UNPAIRED_LOSSES) in ``preference.py``. Import them all from here:

    from glassrl.algos.losses import get_policy_loss, PolicyLossParams
    out = get_policy_loss("ppo_clip")(logprobs, old_logprobs, adv, mask, PolicyLossParams())
    loss = aggregate(out.loss, mask, "token-mean")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from glassrl.algos.losses.clipped import clip_cov, dual_clip, gspo, ppo_clip
from glassrl.algos.losses.common import PolicyLossOutput, PolicyLossParams
from glassrl.algos.losses.preference import (
    PAIR_LOSSES,
    PREFERENCE_LOSSES,
    UNPAIRED_LOSSES,
    PreferenceLoss,
    PreferenceLossParams,
    Rewards,
    Side,
    get_preference_loss,
    kto_reference_point,
    pair_loss,
    sequence_rewards,
    side_rewards,
    token_rewards,
)
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
    "PAIR_LOSSES",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "UNPAIRED_LOSSES",
    "PolicyLoss",
    "PolicyLossFn",
    "PolicyLossOutput",
    "PolicyLossParams",
    "PreferenceLoss",
    "PreferenceLossParams",
    "Rewards",
    "Side",
    "ValueLossOutput",
    "entropy_loss_term",
    "get_policy_loss",
    "get_preference_loss",
    "kl_loss_term",
    "kto_reference_point",
    "pair_loss",
    "pairwise_rm_loss",
    "positive_nll_term",
    "sequence_rewards",
    "side_rewards",
    "token_rewards",
    "value_loss",
]

PolicyLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PolicyLossParams], PolicyLossOutput]


@dataclass(frozen=True)
class PolicyLoss:
    """An entry of POLICY_LOSSES: the loss, ``fn(logprobs, old_logprobs, advantages,
    response_mask, params) -> PolicyLossOutput``, and the PolicyLossParams fields it reads
    (``knobs``), each set by the config key ``algo.<knob>``; the config check calls any other
    policy-loss knob the user sets ignored."""

    fn: PolicyLossFn
    knobs: tuple[str, ...] = ()


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo_clip": PolicyLoss(ppo_clip, knobs=("clip_low", "clip_high")),
    "dual_clip": PolicyLoss(dual_clip, knobs=("clip_low", "clip_high", "dual_clip_c")),
    "gspo": PolicyLoss(gspo, knobs=("clip_low", "clip_high")),
    "cispo": PolicyLoss(cispo, knobs=("cispo_eps_is_low", "cispo_eps_is_high")),
    "aspo": PolicyLoss(aspo, knobs=("clip_low", "clip_high", "dual_clip_c")),
    "clip_cov": PolicyLoss(
        clip_cov, knobs=("clip_low", "clip_high", "clip_cov_r", "clip_cov_omega_low", "clip_cov_omega_high")
    ),
    "reinforce": PolicyLoss(reinforce),
}


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``; ValueError listing the valid names."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; valid: {', '.join(POLICY_LOSSES)}")
    return POLICY_LOSSES[name].fn
