"""Critic and reward-model losses: clipped value loss, pairwise BT loss.

Shapes: B batch, T response length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from glassrl.algos.losses.common import neutralise, zero_masked


@dataclass
class ValueLossOutput:
    """loss: (B, T) per-token value loss, 0 on masked positions.
    diagnostics: "clipped" (B, T) bool, True where the clipped error was the
    larger one (the gradient then comes from the clipped prediction, which is
    0 outside the clip band); False on masked positions.
    """

    loss: torch.Tensor
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range: float | None,
) -> ValueLossOutput:
    """PPO2 value loss, per token (B, T).

    ½·max((V − R)², (V_old + clip(V − V_old, −ε_v, ε_v) − R)²), the value
    clipping of OpenAI baselines ppo2 (``vf_loss = .5 * mean(maximum(...))``)
    that verl's compute_value_loss and TRL keep; it is not in the PPO paper,
    whose eq. 9 has the plain squared error (V − R)². The ½ makes the gradient
    (V − R), as in those implementations. ``clip_range`` None: ½·(V − R)².

    values: V(s_i) now; old_values: V(s_i) at rollout; returns: R_i (the
    critic's target, DESIGN §1), all (B, T).
    """
    values, old_values, returns = neutralise(response_mask, values, old_values, returns)
    unclipped = (values - returns) ** 2
    if clip_range is None:
        return ValueLossOutput(
            zero_masked(0.5 * unclipped, response_mask),
            {"clipped": torch.zeros_like(response_mask)},
        )
    # baselines ppo2: vpredclipped = OLDVPRED + clip(vpred - OLDVPRED, -CLIPRANGE, CLIPRANGE)
    values_clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    clipped = (values_clipped - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped, clipped)
    return ValueLossOutput(zero_masked(loss, response_mask), {"clipped": response_mask & (clipped > unclipped)})


def pairwise_rm_loss(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    margin: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bradley–Terry pairwise loss −log σ(r_c − r_r − m), per pair (B,).

    Ouyang et al. 2022, InstructGPT, eq. 1 (without margin); Touvron et al.
    2023, Llama 2, §3.2.2 eq. 2 (with the margin m(r) from the preference
    rating). logsigmoid keeps it finite for any gap (log(sigmoid(x)) is −inf
    once sigmoid underflows).
    """
    gap = chosen_rewards - rejected_rewards
    if margin is not None:
        gap = gap - margin
    return -F.logsigmoid(gap)
