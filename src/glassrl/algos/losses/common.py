"""Shared parts of the policy losses: parameters, output, input sanitising.

Shapes: B batch, T response length. Every policy loss takes
``logprobs``, ``old_logprobs``, ``advantages`` (B, T) float and
``response_mask`` (B, T) bool and returns per-token terms (B, T) to be
*minimised* (the papers write objectives to maximise; each loss here is the
negated objective). Aggregation into a scalar is a separate named step
(``glassrl.algos.aggregation``).

Masked positions: every input is first replaced by a neutral value
(``torch.where``, DESIGN §3) so that a NaN or inf sitting on padding can
reach neither a valid output nor a gradient (with ``where(mask, f(x), 0)``
alone the backward pass would still compute ``0 * f'(NaN) = NaN``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# verl core_algos.compute_policy_loss_vanilla clamps log π − log π_old to ±20
# before exp so that one stale token cannot overflow the ratio to inf
# (inf in an unselected branch still poisons the gradient as 0 · inf).
LOG_RATIO_BOUND = 20.0


@dataclass(frozen=True)
class PolicyLossParams:
    """Numbers the policy losses read. Each field names the paper's symbol.

    clip_low, clip_high: ε_low, ε_high of the trust region
        [1 − ε_low, 1 + ε_high] (DAPO, Yu et al. 2025, eq. 8 "Clip-Higher";
        PPO's single ε when equal). Used by ppo_clip, dual_clip, gspo (on the
        sequence ratio; the GSPO paper uses ε of order 3e-4..4e-4), aspo and
        clip_cov.
    dual_clip_c: c > 1, the lower bound −c·|A| of the objective for A < 0
        (Ye et al. 2020, dual-clip PPO, eq. 5); ASPO uses the same c for its
        soft dual clip on both signs.
    cispo_eps_is_low, cispo_eps_is_high: ε^IS_low, ε^IS_high of CISPO's
        clipped IS weight clip(r, 1 − ε^IS_low, 1 + ε^IS_high) (MiniMax-M1 2025,
        eq. 5). The paper sets ε^IS_low large (no lower bound: 1.0 makes the
        bound 0) and tunes only ε^IS_high; the default 0.28 here is DAPO's
        ε_high, not a value taken from the paper.
    clip_cov_r: r, the fraction of valid tokens whose gradient Clip-Cov
        detaches (Cui et al. 2025, §5 Clip-Cov; their default 2e-4).
    clip_cov_omega_low, clip_cov_omega_high: ω_low < ω_high, the covariance
        band a token must fall in to be eligible (Cui et al. 2025, §5).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float = 3.0
    cispo_eps_is_low: float = 1.0
    cispo_eps_is_high: float = 0.28
    clip_cov_r: float = 2e-4
    clip_cov_omega_low: float = 1.0
    clip_cov_omega_high: float = 5.0

    def __post_init__(self) -> None:
        checks = [
            ("clip_low", 0.0 <= self.clip_low <= 1.0, "must lie in [0, 1]"),
            ("clip_high", self.clip_high >= 0.0, "must be >= 0"),
            ("dual_clip_c", self.dual_clip_c > 1.0, "must be > 1 (Ye et al. 2020, eq. 5)"),
            ("cispo_eps_is_low", self.cispo_eps_is_low >= 0.0, "must be >= 0"),
            ("cispo_eps_is_high", self.cispo_eps_is_high >= 0.0, "must be >= 0"),
            ("clip_cov_r", 0.0 < self.clip_cov_r <= 1.0, "must lie in (0, 1]"),
            (
                "clip_cov_omega_high",
                self.clip_cov_omega_high > self.clip_cov_omega_low,
                f"must be > clip_cov_omega_low ({self.clip_cov_omega_low})",
            ),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"PolicyLossParams.{name} = {getattr(self, name)}: {why}")


@dataclass
class PolicyLossOutput:
    """Per-token loss and per-token diagnostics.

    loss: (B, T) float, the term each token contributes to the loss to
        minimise; exactly 0 where ``response_mask`` is False.
    diagnostics: name -> (B, T) tensor, detached. "ratio" (float, π/π_old or
        the sequence ratio for GSPO) and bool flags such as "clipped_low",
        "clipped_high", "dual_clipped", "cov_clipped", which are False on
        masked positions; the trainer turns them into fractions with
        masked_mean. "ratio" means nothing on masked positions: aggregate
        it with the mask too.
    """

    loss: torch.Tensor
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)


def neutralise(mask: torch.Tensor, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each (B, T) tensor with its masked positions replaced by 0.

    0 is neutral for every input here: log-probs 0 and 0 give ratio 1,
    advantage 0 gives a zero term; the gradient into a masked position is then
    exactly 0 (torch.where routes it, nothing is multiplied).
    """
    return tuple(torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)) for x in xs)


def zero_masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with masked positions set to exactly 0 (B, T)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """log r = log π_θ − log π_old, clamped to ±LOG_RATIO_BOUND (B, T)."""
    return (logprobs - old_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def clip_flags(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, params: PolicyLossParams
) -> dict[str, torch.Tensor]:
    """Where PPO's clipped branch is the active one (its gradient is 0).

    For A > 0 that is r > 1 + ε_high, for A < 0 it is r < 1 − ε_low
    (Schulman et al. 2017, eq. 7 and its Figure 1); the same test as verl's
    ``pg_losses2 > pg_losses1``.
    """
    return {
        "ratio": ratio.detach(),
        "clipped_low": mask & (advantages < 0) & (ratio < 1.0 - params.clip_low),
        "clipped_high": mask & (advantages > 0) & (ratio > 1.0 + params.clip_high),
    }


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, params: PolicyLossParams) -> torch.Tensor:
    """−min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A) per token (B, T).

    Schulman et al. 2017, PPO, eq. 7, with DAPO's decoupled ε_low / ε_high
    (Yu et al. 2025, eq. 8); −min(a, b) = max(−a, −b).
    """
    clipped = ratio.clamp(1.0 - params.clip_low, 1.0 + params.clip_high)
    return torch.maximum(-advantages * ratio, -advantages * clipped)
