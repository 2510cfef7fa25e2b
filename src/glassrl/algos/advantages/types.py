"""What an advantage estimator reads, is configured by, and returns, and its registry entry.

Shapes: B batch (responses), T response length. Token convention: DESIGN §1.
Every estimator has one signature (its entry's ``fn`` in the ADVANTAGE_ESTIMATORS
registry in ``glassrl.algos.advantages``):

    estimator(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutputs
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


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
    whitening of REINFORCE++ is part of that estimator). returns (B, T): what
    each estimator returns there is listed in ``glassrl.algos.advantages``.
    Both are 0 on masked positions."""

    advantages: torch.Tensor
    returns: torch.Tensor


Estimator = Callable[[AdvantageInputs, AdvantageParams], AdvantageOutputs]


@dataclass(frozen=True)
class AdvantageEstimator:
    """An entry of ADVANTAGE_ESTIMATORS: the estimator and all that the rest of glassrl reads of it.

    fn: the estimator, ``fn(inputs, params) -> AdvantageOutputs``.
    inputs: the optional AdvantageInputs fields it needs (``compute_advantages`` checks them).
        They decide how a run treats it: "values" trains a critic (:attr:`critic`),
        "group_index" samples and compares groups (:attr:`group`), "baseline_rewards"
        samples a greedy response per prompt (ReMax).
    knobs: the AdvantageParams fields it reads, each set by the config key ``algo.<knob>``;
        the trainer passes these and no other, and the config check calls any other
        estimator knob the user sets ignored.
    """

    fn: Estimator
    inputs: tuple[str, ...] = ()
    knobs: tuple[str, ...] = ()

    @property
    def critic(self) -> bool:
        """Whether it reads values V(s_i), so that the run trains a critic."""
        return "values" in self.inputs

    @property
    def group(self) -> bool:
        """Whether it compares the responses to one prompt (a group estimator): it reads group_index."""
        return "group_index" in self.inputs
