"""The train/rollout mismatch and its truncated importance-sampling correction (TIS).

Shapes: B responses, T response length. ``old_logprobs`` log π_old(a_i|s_i), what the trainer
computes in phase 3; ``rollout_logprobs`` log π_rollout(a_i|s_i), what the rollout engine
computed while it sampled a_i (glassrl.rollout.base.RolloutBatch.rollout_logprobs), with the
same weights and temperature.

Why they differ: an inference engine runs other kernels, another precision and another
batching than the trainer, so π_rollout ≠ π_old even with the same weights, and by far on a
few tokens (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", blog post, Aug 2025, §1: vLLM vs FSDP probabilities of the same tokens). The PPO
objective treats the tokens as sampled from π_old; they were sampled from π_rollout: the
update is off-policy by that gap.

Truncated importance sampling (Yao et al. 2025, §2, "TIS"; the truncation is Ionides 2008,
"Truncated Importance Sampling", J. Comput. Graph. Stat. 17(2)) weights each token's policy
loss term by

    w_i = min(π_old(a_i|s_i) / π_rollout(a_i|s_i), C)

a constant (no gradient flows through it: both log-probs are fixed numbers of the rollout),
cut at C so that one token the engine found unlikely cannot dominate the update. verl applies
the same weight to its per-token policy losses (``tis_imp_ratio_cap``,
verl/trainer/ppo/core_algos.py). glassrl.rl.update multiplies the chosen policy loss's
per-token terms by :func:`truncated_is_weights` when ``algo.rollout_is`` is set.
"""

from __future__ import annotations

import math

import torch

from glassrl.algos.masked import masked_mean


def logprob_mismatch(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, max) over the valid tokens of |log π_old(a_i|s_i) − log π_rollout(a_i|s_i)|, 0-dim tensors.

    All inputs (B, T); ``mask`` bool, True where the token counts. NaN for both when no token is valid.
    """
    diff = torch.where(mask, (old_logprobs - rollout_logprobs).abs(), 0.0)  # (B, T)
    if not bool(mask.any()):
        nan = torch.full((), math.nan, dtype=diff.dtype, device=diff.device)
        return nan, nan.clone()
    return masked_mean(diff, mask), diff.max()


def truncated_is_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, truncated), both (B, T): w_i = min(exp(log π_old − log π_rollout), cap) on valid
    tokens, 0 elsewhere (no gradient); truncated_i: the ratio exceeded ``cap`` (bool, False off the mask).

    The log-ratio is zeroed off the mask before ``exp``, so every weight is finite: a padding
    position holding any number cannot turn a gradient into NaN.
    """
    if not cap > 0:
        raise ValueError(f"truncated_is_weights: cap must be > 0, got {cap}")
    log_ratio = torch.where(mask, old_logprobs.detach() - rollout_logprobs.detach(), 0.0)  # (B, T)
    weights = torch.where(mask, torch.exp(log_ratio).clamp(max=cap), 0.0)  # (B, T)
    return weights, mask & (log_ratio > math.log(cap))
