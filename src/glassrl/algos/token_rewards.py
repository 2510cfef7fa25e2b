"""Token rewards: where scores sit on the response, and the KL cost.

DESIGN §1: ``token_scores[i]`` is the score placed on token i (the outcome score
on the last valid token T_b − 1, process rewards on step-end tokens) and
``r_i = token_scores[i] − β·kl[i]`` on valid tokens (Ziegler et al. 2019, §2.2;
InstructGPT, Ouyang et al. 2022, eq. 2); with a teacher (on-policy distillation) every
token also earns ``w·(log π_T − log π_old)`` (:func:`teacher_token_rewards`).
Shapes: B batch, T response length, S steps per response.
"""

from __future__ import annotations

import torch


def place_outcome_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Put each row's score (B,) on its last valid token; 0 elsewhere -> (B, T).

    The last valid token is the last True of the row (verl places the score at
    ``valid_response_length − 1``). A row with no valid token has nowhere to
    put its score: ValueError naming the rows.
    """
    B, T = response_mask.shape
    positions = torch.arange(T, device=response_mask.device).expand(B, T)  # (B, T)
    last = torch.where(response_mask, positions, -1).amax(dim=-1)  # (B,)
    empty = (last < 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"place_outcome_scores: rows {empty} of response_mask have no valid token")
    token_scores = torch.zeros((B, T), dtype=scores.dtype, device=scores.device)
    return token_scores.scatter(1, last.unsqueeze(1), scores.unsqueeze(1))


def place_process_rewards(
    step_rewards: torch.Tensor, step_ends: torch.Tensor, step_valid: torch.Tensor, T: int
) -> torch.Tensor:
    """Put step rewards (B, S) on their step-end tokens ``step_ends`` (B, S) -> (B, T).

    ``step_valid`` (B, S) marks real steps (rows have different step counts).
    Each valid end must lie in [0, T) and be unique within its row, otherwise
    two steps would silently merge: ValueError naming row and step.
    (Process supervision: DeepSeekMath, Shao et al. 2024, §4.1.3.)
    """
    B, S = step_rewards.shape
    bad = step_valid & ((step_ends < 0) | (step_ends >= T))
    if bool(bad.any()):
        b, s = bad.nonzero()[0].tolist()
        raise ValueError(
            f"place_process_rewards: step_ends[{b}, {s}] = {int(step_ends[b, s])} is outside the response [0, {T})"
        )
    ends = torch.where(step_valid, step_ends, 0)  # (B, S) invalid steps point at 0 ...
    rewards = torch.where(step_valid, step_rewards, torch.zeros_like(step_rewards))  # ... adding 0
    counts = torch.zeros((B, T), dtype=torch.long, device=step_ends.device)
    counts = counts.scatter_add(1, ends, step_valid.long())
    if bool((counts > 1).any()):
        b, t = (counts > 1).nonzero()[0].tolist()
        raise ValueError(f"place_process_rewards: row {b} has several steps ending at token {t}")
    out = torch.zeros((B, T), dtype=step_rewards.dtype, device=step_rewards.device)
    return out.scatter_add(1, ends, rewards)


def assemble_token_rewards(
    token_scores: torch.Tensor, kl: torch.Tensor, beta: float, response_mask: torch.Tensor
) -> torch.Tensor:
    """r_i = token_scores[i] − β·kl[i] on valid tokens, 0 elsewhere; all (B, T)."""
    rewards = token_scores - beta * kl
    return torch.where(response_mask, rewards, torch.zeros_like(rewards))


def teacher_token_rewards(
    teacher_logprobs: torch.Tensor, logprobs: torch.Tensor, response_mask: torch.Tensor, weight: float
) -> torch.Tensor:
    """w·(log π_T(a_i|s_i) − log π_old(a_i|s_i)) on valid tokens, 0 elsewhere; all (B, T).

    The negative reverse KL of the student from the teacher at the sampled token, a reward on
    every token (on-policy distillation: Agarwal et al. 2024, GKD, eq. 4 with λ = 1 and the reverse
    KL; the one-sample per-token form of Lu et al. 2025, Thinking Machines, "On-Policy
    Distillation"). Masked positions are neutralised first, so a NaN there reaches nothing.
    """
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    gap = torch.where(response_mask, teacher_logprobs, zero) - torch.where(response_mask, logprobs, zero)
    return torch.where(response_mask, weight * gap, zero)
