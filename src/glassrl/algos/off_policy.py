"""Importance weights and masks for samples that another policy drew: stale (asynchronous training)
or mismatched (an inference engine's numbers).

Shapes: B responses, T response length. Three policies (Hilton et al. 2022, "Batch size-invariance
for policy optimization", arXiv:2110.00641, §3, the decoupled objective; AReaL, Fu et al. 2025,
arXiv:2505.24298, §5.2):

- the behaviour policy μ, which sampled a_i: ``rollout_logprobs`` log μ(a_i|s_i), what the rollout
  engine computed while it sampled (glassrl.rollout.base.RolloutBatch.rollout_logprobs), with the
  weights of the version that sampled the token — an older π_θ when training is asynchronous, and
  another engine's kernels and precision when it is vLLM (Yao et al. 2025);
- the proximal policy π_old, the anchor of PPO's clip: ``old_logprobs``, what the trainer computes
  in phase 3 with the current weights;
- π_θ, being updated (not an input here: the weights below are constants of the batch).

Each correction turns the per-token ratio ρ_i = π_old(a_i|s_i) / μ(a_i|s_i) into a constant weight
w_i on token i's policy-loss term and a decision ``keep`` (False: the token leaves the loss and its
denominator). The decoupled PPO loss is then (Hilton et al. 2022, §3; Fu et al. 2025, §5.2)

    L = − Σ_i keep_i · w_i · min(r_i A_i, clip(r_i, 1 − ε, 1 + ε) A_i) / Σ_i keep_i,   r_i = π_θ / π_old.

A masked token leaves the denominator as well as the numerator (slime PR #657, following verl PR
#3915: a rejected token counted in the denominator shrinks every other token's gradient).

:data:`OFF_POLICY` holds the corrections, one signature each,
``fn(old_logprobs, rollout_logprobs, mask, knobs) -> OffPolicyResult``; the log-ratio is zeroed off
``mask`` before any ``exp``, so whatever padding holds, every weight is finite (``decoupled`` alone
is uncut: a token μ found e^−90 times less likely than π_old overflows, and the run's non-finite check
stops or skips that step). ``logprob_mismatch`` measures the gap the corrections correct.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from glassrl.algos.masked import masked_mean


@dataclass(frozen=True)
class OffPolicyResult:
    """weights (B, T) ≥ 0, the constant on each kept token's policy-loss term (0 where not kept);
    keep (B, T) bool, the tokens that stay in the loss (a subset of the mask); cut (B, T) bool, the
    tokens whose weight the cap truncated (False for the masking corrections)."""

    weights: torch.Tensor
    keep: torch.Tensor
    cut: torch.Tensor


def log_ratios(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log ρ_i = log π_old(a_i|s_i) − log μ(a_i|s_i) on valid tokens, 0 elsewhere (B, T), detached."""
    return torch.where(mask, old_logprobs.detach() - rollout_logprobs.detach(), 0.0)


def _sequence(log_ratio: torch.Tensor) -> torch.Tensor:
    """log Π_i ρ_i = Σ_i log ρ_i per response, (B, 1): the sequence ratio's log (0 off the mask)."""
    return log_ratio.sum(-1, keepdim=True)


def _result(weights: torch.Tensor, keep: torch.Tensor, cut: torch.Tensor | None = None) -> OffPolicyResult:
    weights = torch.where(keep, weights, 0.0)
    return OffPolicyResult(weights, keep, keep & cut if cut is not None else torch.zeros_like(keep))


def token_tis(old_logprobs, rollout_logprobs, mask, knobs) -> OffPolicyResult:
    """Token-level truncated IS: w_i = min(ρ_i, C); every token kept. Yao et al. 2025, "Your
    Efficient RL Framework Secretly Brings You Off-Policy RL Training", §2 ("TIS"); the truncation is
    Ionides 2008, "Truncated Importance Sampling", J. Comput. Graph. Stat. 17(2), eq. (2.4)."""
    cap = knobs["cap"]
    log_ratio = log_ratios(old_logprobs, rollout_logprobs, mask)
    return _result(torch.exp(log_ratio).clamp(max=cap), mask, log_ratio > math.log(cap))


def seq_tis(old_logprobs, rollout_logprobs, mask, knobs) -> OffPolicyResult:
    """Sequence-level truncated IS: every token of response b weighted by w_b = min(Π_i ρ_i, C);
    every token kept. Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse
    from the Training-Inference Mismatch", part 2 (the sequence-level estimator, unbiased for the
    sequence before truncation); verl docs/algo/rollout_corr_math.md §3.3.2."""
    cap = knobs["cap"]
    log_seq = _sequence(log_ratios(old_logprobs, rollout_logprobs, mask))  # (B, 1)
    weights = torch.exp(log_seq).clamp(max=cap).expand_as(mask)  # exp(+inf) = inf, cut to C
    return _result(weights, mask, (log_seq > math.log(cap)).expand_as(mask))


def token_mis(old_logprobs, rollout_logprobs, mask, knobs) -> OffPolicyResult:
    """Token-level masked IS: w_i = ρ_i where ρ_i ≤ C; a token above C is dropped, not clipped.
    Liu, Li et al. 2025, part 3 ("MIS": ρ·1{ρ ≤ C}, rejection over truncation); AReaL's
    ``behav_imp_weight_cap`` filters the same tokens (Fu et al. 2025, §5.2)."""
    log_ratio = log_ratios(old_logprobs, rollout_logprobs, mask)
    return _result(torch.exp(log_ratio), mask & (log_ratio <= math.log(knobs["cap"])))


def seq_mis(old_logprobs, rollout_logprobs, mask, knobs) -> OffPolicyResult:
    """Sequence-level masked IS: every token of response b weighted by ρ_b = Π_i ρ_i where ρ_b ≤ C;
    a response above C is dropped whole. Liu, Li et al. 2025, part 3 (sequence-level MIS)."""
    log_seq = _sequence(log_ratios(old_logprobs, rollout_logprobs, mask))  # (B, 1)
    keep = mask & (log_seq <= math.log(knobs["cap"]))
    return _result(torch.exp(torch.where(keep, log_seq, 0.0)), keep)


def icepop(old_logprobs, rollout_logprobs, mask, knobs) -> OffPolicyResult:
    """IcePop's two-sided token mask: w_i = ρ_i where α ≤ ρ_i ≤ β, the token dropped otherwise
    (its gradient is 0 whichever side it falls). Ling Team 2025, "Every Step Evolves: Scaling
    Reinforcement Learning for Trillion-Scale Thinking Model" (Ring-1T, arXiv:2510.18855), IcePop's
    masking function M(k) = k if k ∈ [α, β] else 0, with α = 0.5, β = 5."""
    log_ratio = log_ratios(old_logprobs, rollout_logprobs, mask)
    inside = (log_ratio >= math.log(knobs["low"])) & (log_ratio <= math.log(knobs["high"]))
    return _result(torch.exp(log_ratio), mask & inside)


def geo_mask(old_logprobs, rollout_logprobs, mask, knobs) -> OffPolicyResult:
    """The geometric-mean sequence mask: response b is kept (weight 1) when its per-token geometric
    mean ratio ρ̄_b = exp(mean_i log ρ_i) lies in [low, high], dropped whole otherwise. Liu, Li et al.
    2025, part 3 ("Geo-RS": unlike Π_i ρ_i, the mean does not grow with the length); verl
    docs/algo/rollout_corr_math.md §3.3.3 (thresholds near 1: 1.001 is 0.1 % per token)."""
    log_ratio = log_ratios(old_logprobs, rollout_logprobs, mask)
    tokens = mask.sum(-1, keepdim=True).clamp(min=1)  # (B, 1)
    log_mean = _sequence(log_ratio) / tokens  # (B, 1)
    inside = (log_mean >= math.log(knobs["low"])) & (log_mean <= math.log(knobs["high"]))
    return _result(torch.ones_like(log_ratio), mask & inside)


def decoupled(old_logprobs, rollout_logprobs, mask, knobs) -> OffPolicyResult:
    """AReaL's decoupled objective: w_i = π_prox(a_i|s_i) / μ(a_i|s_i), uncut, every token kept; the
    clip of PPO acts around π_prox = π_old (the weights before this update), not around the stale μ
    (Fu et al. 2025, AReaL, §5.2; Hilton et al. 2022, §3). For AReaL's cap on w use token_mis."""
    return _result(torch.exp(log_ratios(old_logprobs, rollout_logprobs, mask)), mask)


CorrectionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Mapping[str, float]], OffPolicyResult]


@dataclass(frozen=True)
class Correction:
    """An entry of OFF_POLICY: ``fn(old_logprobs, rollout_logprobs, mask, knobs) -> OffPolicyResult``,
    the knobs it reads with their defaults (``algo.off_policy.<knob>``), and one line on what it does
    (the config's help, ``glassrl explain``'s legend)."""

    fn: CorrectionFn
    knobs: dict[str, float] = field(default_factory=dict)
    does: str = ""


OFF_POLICY: dict[str, Correction] = {
    "token_tis": Correction(token_tis, {"cap": 2.0}, "each token's loss × min(ρ_i, cap)"),
    "seq_tis": Correction(seq_tis, {"cap": 2.0}, "each response's tokens × min(Π ρ_i, cap)"),
    "token_mis": Correction(token_mis, {"cap": 2.0}, "each token × ρ_i; a token with ρ_i > cap dropped"),
    "seq_mis": Correction(seq_mis, {"cap": 2.0}, "each response × Π ρ_i; a response with Π ρ_i > cap dropped"),
    "icepop": Correction(icepop, {"low": 0.5, "high": 5.0}, "each token × ρ_i; one outside [low, high] dropped"),
    "geo_mask": Correction(
        geo_mask, {"low": 0.999, "high": 1.001}, "a response whose geometric-mean ρ is outside [low, high] dropped"
    ),
    "decoupled": Correction(decoupled, {}, "each token × ρ_i = π_prox/μ, uncut (AReaL)"),
}


def correct(
    name: str,
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    knobs: Mapping[str, float],
) -> OffPolicyResult:
    """OFF_POLICY[name] on (B, T) inputs with ``knobs`` (the entry's defaults for those missing);
    ValueError naming the valid corrections, or a knob out of range."""
    if name not in OFF_POLICY:
        raise ValueError(f"off-policy correction {name!r}: unknown; valid: {', '.join(OFF_POLICY)}")
    entry = OFF_POLICY[name]
    values = {**entry.knobs, **{k: v for k, v in knobs.items() if k in entry.knobs}}
    for knob, value in values.items():
        if not value > 0:
            raise ValueError(f"off-policy correction {name}: {knob} must be > 0, got {value}")
    if "low" in values and not values["low"] <= values["high"]:
        raise ValueError(f"off-policy correction {name}: low {values['low']} > high {values['high']}")
    return entry.fn(old_logprobs, rollout_logprobs, mask, values)


def logprob_mismatch(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, max) over the valid tokens of |log π_old(a_i|s_i) − log μ(a_i|s_i)|, 0-dim tensors.

    All inputs (B, T); ``mask`` bool, True where the token counts. NaN for both when no token is valid.
    """
    diff = log_ratios(old_logprobs, rollout_logprobs, mask).abs()  # (B, T)
    if not bool(mask.any()):
        nan = torch.full((), math.nan, dtype=diff.dtype, device=diff.device)
        return nan, nan.clone()
    return masked_mean(diff, mask), diff.max()
