"""One registry of advantage estimators with one signature.

    ADVANTAGE_ESTIMATORS[name](inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs

Shapes: B batch (responses), T response length. Token convention: DESIGN §1.
Critic-free estimators read the sequence score as the masked sum of
``token_rewards`` over the row (as verl), broadcast one advantage over the
row's valid tokens (task-level credit) and give 0 on masked positions. Their
``returns`` equal their advantages (verl's convention: no critic fits them),
except REINFORCE++, whose returns are the discounted returns before whitening.
The math lives in advantages_gae.py and advantages_group.py; this file adapts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from glassrl.algos.advantages.gae import (
    gae,
    gae_reference,
    length_adaptive_lam,
    td_errors,
)
from glassrl.algos.advantages.group import grpo_outcome, grpo_process, minus_group_mean, rloo
from glassrl.algos.masked import masked_sum, masked_whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "GROUP_ESTIMATORS",
    "REQUIRED_INPUTS",
    "AdvantageInputs",
    "AdvantageOutputs",
    "AdvantageParams",
    "compute_advantages",
    "gae_reference",
    "td_errors",
]


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read.

    token_rewards (B, T) float: r_i (DESIGN §1).
    response_mask (B, T) bool: True on generated tokens that train.
    values (B, T): V(s_i), for "gae".
    group_index (B,) long: prompt id of each response, for group estimators.
    baseline_rewards (B,): ReMax, reward of the greedy response to the same prompt.
    step_end_mask (B, T) bool: "grpo_process", tokens carrying a step reward.
    """

    token_rewards: torch.Tensor
    response_mask: torch.Tensor
    values: torch.Tensor | None = None
    group_index: torch.Tensor | None = None
    baseline_rewards: torch.Tensor | None = None
    step_end_mask: torch.Tensor | None = None


@dataclass(frozen=True)
class AdvantageParams:
    """gamma, lam: GAE γ and λ. critic_lam: VAPO decoupled λ for the returns
    (critic targets); None = lam. length_alpha: VAPO length-adaptive policy λ
    = 1 − 1/(α·length) per row; None = lam. eps: GRPO std denominator."""

    gamma: float = 1.0
    lam: float = 1.0
    critic_lam: float | None = None
    length_alpha: float | None = None
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("gamma", "lam", "critic_lam"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"AdvantageParams.{name} must be in [0, 1], got {value}")
        if self.length_alpha is not None and self.length_alpha <= 0:
            raise ValueError(f"AdvantageParams.length_alpha must be > 0, got {self.length_alpha}")


@dataclass(frozen=True)
class AdvantageOutputs:
    """advantages (B, T): raw, before any PPO whitening by the caller (the
    whitening of REINFORCE++ is part of that estimator). returns (B, T)."""

    advantages: torch.Tensor
    returns: torch.Tensor


Estimator = Callable[[AdvantageInputs, AdvantageParams], AdvantageOutputs]


def _scores(inputs: AdvantageInputs) -> torch.Tensor:
    """Sequence score (B,): masked sum of token_rewards over the row (verl)."""
    return masked_sum(inputs.token_rewards, inputs.response_mask, dim=-1)


def _broadcast(seq_advantages: torch.Tensor, response_mask: torch.Tensor) -> AdvantageOutputs:
    """One advantage per row (B,) on every valid token of the row; 0 elsewhere."""
    zero = torch.zeros((), dtype=seq_advantages.dtype, device=seq_advantages.device)
    advantages = torch.where(response_mask, seq_advantages.unsqueeze(-1), zero)  # (B, T)
    return AdvantageOutputs(advantages, advantages)


def _gae(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    # Policy λ: fixed, or VAPO length-adaptive (Yue et al. 2025, §3.2).
    if params.length_alpha is None:
        policy_lam: float | torch.Tensor = params.lam
    else:
        policy_lam = length_adaptive_lam(inputs.response_mask, params.length_alpha)
    args = (inputs.token_rewards, inputs.values, inputs.response_mask, params.gamma)
    advantages, returns = gae(*args, policy_lam)
    # VAPO decoupled GAE (§3.1): critic targets from their own λ run (λ_critic = 1 there).
    if params.critic_lam is not None or params.length_alpha is not None:
        critic_lam = params.lam if params.critic_lam is None else params.critic_lam
        returns = gae(*args, critic_lam)[1]
    return AdvantageOutputs(advantages, returns)


def _grpo(inputs: AdvantageInputs, params: AdvantageParams, normalize_by_std: bool) -> AdvantageOutputs:
    name = "grpo" if normalize_by_std else "dr_grpo"
    seq = grpo_outcome(_scores(inputs), inputs.group_index, normalize_by_std, params.eps, name)
    return _broadcast(seq, inputs.response_mask)


def _grpo_process(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    advantages = grpo_process(
        inputs.token_rewards,
        inputs.step_end_mask,
        inputs.response_mask,
        inputs.group_index,
        params.eps,
    )
    return AdvantageOutputs(advantages, advantages)


def _rloo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    return _broadcast(rloo(_scores(inputs), inputs.group_index), inputs.response_mask)


def _remax(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    # ReMax (Li et al. 2023, Algorithm 1): baseline = reward of the greedy response.
    return _broadcast(_scores(inputs) - inputs.baseline_rewards, inputs.response_mask)


def _reinforce_pp(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    # REINFORCE++ (Hu 2025, arXiv 2501.03262): token-level discounted return G_i = Σ_j γ^(j−i) r_j,
    # i.e. GAE with V = 0 and λ = 1 (same carry over observation tokens), then
    # whitening over all valid tokens of the batch (its "global advantage
    # normalization"; verl compute_reinforce_plus_plus_outcome_advantage).
    zeros = torch.zeros_like(inputs.token_rewards)
    returns = gae(inputs.token_rewards, zeros, inputs.response_mask, params.gamma, 1.0)[0]
    return AdvantageOutputs(masked_whiten(returns, inputs.response_mask), returns)


def _reinforce_pp_baseline(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    # REINFORCE++-baseline (Hu 2025; OpenRLHF "reinforce_baseline"): subtract the
    # group mean score, broadcast, whiten globally. As verl's version, the KL
    # part of token_rewards enters through the score sum; OpenRLHF instead puts
    # the centred score on the last token and takes discounted returns (same
    # thing for γ = 1 without KL in the reward).
    seq = minus_group_mean(_scores(inputs), inputs.group_index, "reinforce_pp_baseline")
    centred = _broadcast(seq, inputs.response_mask).advantages
    return AdvantageOutputs(masked_whiten(centred, inputs.response_mask), centred)


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "gae": _gae,
    "grpo": functools.partial(_grpo, normalize_by_std=True),
    "dr_grpo": functools.partial(_grpo, normalize_by_std=False),
    "grpo_process": _grpo_process,
    "rloo": _rloo,
    "remax": _remax,
    "reinforce_pp": _reinforce_pp,
    "reinforce_pp_baseline": _reinforce_pp_baseline,
}

# Optional AdvantageInputs fields each estimator needs.
REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {
    "gae": ("values",),
    "grpo": ("group_index",),
    "dr_grpo": ("group_index",),
    "grpo_process": ("group_index", "step_end_mask"),
    "rloo": ("group_index",),
    "remax": ("baseline_rewards",),
    "reinforce_pp": (),
    "reinforce_pp_baseline": ("group_index",),
}

GROUP_ESTIMATORS: frozenset[str] = frozenset(
    name for name, needed in REQUIRED_INPUTS.items() if "group_index" in needed
)

_SHAPES = {  # expected shape of each input, from (B, T)
    "token_rewards": lambda B, T: (B, T),
    "response_mask": lambda B, T: (B, T),
    "values": lambda B, T: (B, T),
    "group_index": lambda B, T: (B,),
    "baseline_rewards": lambda B, T: (B,),
    "step_end_mask": lambda B, T: (B, T),
}


def _check(name: str, inputs: AdvantageInputs) -> None:
    missing = [f for f in REQUIRED_INPUTS[name] if getattr(inputs, f) is None]
    if missing:
        raise ValueError(f"advantage estimator {name!r} needs AdvantageInputs.{missing[0]}")
    if inputs.response_mask.dtype != torch.bool:
        raise ValueError(f"AdvantageInputs.response_mask must be bool, got {inputs.response_mask.dtype}")
    B, T = inputs.token_rewards.shape
    for field in fields(inputs):
        value = getattr(inputs, field.name)
        expected = _SHAPES[field.name](B, T)
        if value is not None and tuple(value.shape) != expected:
            raise ValueError(f"AdvantageInputs.{field.name}: expected shape {expected}, got {tuple(value.shape)}")


def compute_advantages(name: str, inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs:
    """Run the estimator ``name`` after checking that its inputs are present and shaped."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
    _check(name, inputs)
    return ADVANTAGE_ESTIMATORS[name](inputs, params)
