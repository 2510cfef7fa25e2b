"""Per-token KL estimators and KL-coefficient controllers.

Shapes: ``logprobs`` and ``ref_logprobs`` (B, T) are log π(a_i|s_i) and
log π_ref(a_i|s_i) of the sampled tokens; full log-distributions are (B, T, V).
The estimators k1, k2, k3 are those of Schulman, "Approximating KL divergence"
(2020, joschu.net/blog/kl-approx.html), all for KL(π || π_ref) with a ~ π.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# k3 input clamp: exp(20) ≈ 4.9e8 is finite in fp16/bf16/fp32, so a token whose
# reference log-prob far exceeds the policy's cannot produce inf (and inf − inf
# = NaN). Same bound as verl core_algos.kl_penalty ("low_var_kl").
K3_LOG_RATIO_BOUND = 20.0
# k3 output clamp: k3 ≥ 0, so only the upper bound acts; it caps one token's
# penalty at 10 nats so that a single outlier cannot dominate the reward or the
# loss (its gradient is then 0). Same bound as verl and OpenRLHF.
K3_MAX = 10.0


def _k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    # k1 = log π/π_ref: unbiased, high variance, can be negative (Schulman 2020).
    return logprobs - ref_logprobs


def _abs(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    # |log π/π_ref|: a non-negative variant used by TRL / verl ("abs").
    return (logprobs - ref_logprobs).abs()


def _k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    # k2 = ½ (log π/π_ref)²: biased, low variance, ≥ 0 (Schulman 2020).
    return 0.5 * (logprobs - ref_logprobs).square()


def _k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    # k3 = π_ref/π − log(π_ref/π) − 1: unbiased, low variance, ≥ 0 (Schulman
    # 2020; DeepSeekMath, Shao et al. 2024, eq. 4). Clamps: see K3_* above.
    log_ratio = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    return (torch.exp(log_ratio) - log_ratio - 1).clamp(max=K3_MAX)


KL_ESTIMATORS: dict[str, KLFn] = {"k1": _k1, "abs": _abs, "k2": _k2, "k3": _k3}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate (B, T) with the estimator named ``kind``."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](logprobs, ref_logprobs)


class FixedKLController:
    """A constant KL coefficient β (InstructGPT, Ouyang et al. 2022, eq. 2)."""

    def __init__(self, beta: float) -> None:
        self.value = float(beta)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt; present so both controllers share one interface."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(_field(state, "value"))


class AdaptiveKLController:
    """Proportional controller for β (Ziegler et al. 2019, §2.2).

    e = clip(KL / target − 1, −0.2, 0.2);  β ← β · (1 + e · n_steps / horizon).
    """

    def __init__(self, init_beta: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(
                f"AdaptiveKLController: target_kl and horizon must be > 0, got target_kl={target_kl}, horizon={horizon}"
            )
        self.value = float(init_beta)
        self.target_kl = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β towards the value that keeps KL at ``target_kl``.

        ``n_steps``: samples (or steps) since the last update, as in Ziegler
        et al.; the error clip at ±0.2 bounds the change per horizon.
        """
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(_field(state, "value"))


def _field(state: dict, key: str) -> object:
    if key not in state:
        raise ValueError(f"KL controller state: missing key {key!r}; got keys {sorted(state)}")
    return state[key]
