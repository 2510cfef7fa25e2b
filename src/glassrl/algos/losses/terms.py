"""The loss terms beside the policy loss: KL, entropy, positive NLL (actor),
the clipped value loss (critic), the Bradley–Terry loss (reward model).

Shapes: B batch, T response length. Per-token terms are (B, T), 0 on masked
positions; the trainer aggregates each and assembles the actor loss
L = L_π + β·KL − c·H + μ·NLL.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from glassrl.algos.kl import kl_penalty
from glassrl.algos.losses.common import neutralise, zero_masked


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


@dataclass
class ValueLossOutput:
    """loss: (B, T) per-token value loss, 0 on masked positions.
    diagnostics: "clipped" (B, T) bool, True where the prediction left the clip
    band (|V − V_old| > ε_v) and the clipped error was the larger one (the
    gradient then comes from the clipped prediction: 0); False on masked
    positions. Inside the band both errors are the same number but for
    rounding (V_old + (V − V_old) need not be V), which must not count.
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
    outside = (values - old_values).abs() > clip_range
    return ValueLossOutput(
        zero_masked(loss, response_mask), {"clipped": response_mask & outside & (clipped > unclipped)}
    )


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
