"""The experience of one step: every tensor of the token convention (DESIGN §1), by meaning.

Shapes: B responses of the step (prompts × n), P prompt width, T response width.
The phases of glassrl.rl.phases fill it in order (2 score, 3 model outputs,
4 token rewards, 5 advantages); a field is None until its phase ran, and stays
None when the run has no such quantity (no reference: ``kl``; no critic: ``values``).
Names and symbols: docs/token-convention.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glassrl.algos.off_policy import OffPolicyResult
from glassrl.data.records import PromptRecord
from glassrl.rewards.base import RewardResult
from glassrl.rollout.base import RolloutBatch


@dataclass
class Experience:
    """Everything computed for the B responses of one step."""

    # trajectory (phase 1): what was sampled, and for which prompt
    rollout: RolloutBatch  # ids (B, P+T), response_mask (B, T), group_index (B,), finish reasons, texts
    records: list[PromptRecord]  # [B] the dataset row each response answers
    prompts: list[str]  # [B] each prompt as the rewards read it (s_0 exactly: rollout.prompt_ids)

    # outcome (phase 2): the reward's verdict and where it sits on the tokens
    results: list[RewardResult]  # [B] typed: ok / timeout / error
    scored: torch.Tensor  # (B,) bool: the result is ok
    raw_scores: torch.Tensor  # (B,) the combined reward's score before shaping; 0 where not scored
    scores: torch.Tensor  # (B,) after the score shapers: the outcome score placed on tokens
    token_scores: torch.Tensor  # (B, T) outcome score on the last valid token, or step rewards on step ends
    step_end_mask: torch.Tensor | None  # (B, T) bool: process rewards' step-end tokens; None without them
    baseline_rewards: torch.Tensor | None  # (B,) ReMax: the reward of the prompt's greedy response
    response_mask: torch.Tensor  # (B, T) bool: tokens that train; whole rows False when not scored / no baseline

    # policy (phase 3): the sampling policy and the reference, at the sampled tokens
    logprobs: torch.Tensor | None = None  # (B, T) log π_old(a_i|s_i) at the sampling temperature
    entropy: torch.Tensor | None = None  # (B, T) H(π_old(·|s_i))
    ref_logprobs: torch.Tensor | None = None  # (B, T) log π_ref(a_i|s_i); None without a reference
    kl: torch.Tensor | None = None  # (B, T) kl_i, the algo.kl.kind estimate; None without a reference
    teacher_logprobs: torch.Tensor | None = None  # (B, T) log π_T(a_i|s_i); None without a teacher source
    teacher_weight: float = 0.0  # w of the teacher source

    # behaviour (phase 3, last): the policy μ that sampled, when it is not π_old (rollout.rollout_logprobs: log μ)
    staleness: torch.Tensor | None = (
        None  # (B, T) long: actor updates since the weights that sampled a_i; 0 off the mask
    )
    correction: OffPolicyResult | None = None  # (B, T) weights, keep, cut of algo.off_policy from ρ_i = π_old/μ
    bypass: bool = False  # no correction on a stale batch: the clip anchors at μ, the policy that sampled (PPO)

    # value (phase 3): the critic
    values: torch.Tensor | None = None  # (B, T) V(s_i), read before a_i; None without a critic

    # rewards (phase 4)
    beta: float = 0.0  # β of the step: the KL controller's value (0 without a reference)
    kl_in_reward: bool = False  # β·kl_i is in the token rewards (else it is a loss term, or absent)
    teacher_rewards: torch.Tensor | None = None  # (B, T) w·(log π_T − log π_old): on-policy distillation
    token_rewards: torch.Tensor | None = (
        None  # (B, T) r_i = token_scores_i (+ teacher_rewards_i) − β·kl_i (β only when in the reward)
    )

    # advantages (phase 5)
    deltas: torch.Tensor | None = None  # (B, T) δ_i = r_i + γ·V(s_{i+1}) − V(s_i); None without a critic
    advantages: torch.Tensor | None = None  # (B, T) A_i, the estimator's raw output
    returns: torch.Tensor | None = None  # (B, T) R_i, the critic's target (A_i + V(s_i) under GAE)
    whitened_advantages: torch.Tensor | None = None  # (B, T) when whitening is on: what the policy loss sees

    @property
    def reward_beta(self) -> float:
        """β as it enters the token rewards: 0 unless the KL is in the reward."""
        return self.beta if self.kl_in_reward else 0.0

    @property
    def policy_advantages(self) -> torch.Tensor:
        """The advantages the policy loss sees: whitened when whitening is on, else raw."""
        return self.advantages if self.whitened_advantages is None else self.whitened_advantages
