"""Loss aggregation: per-token terms (B, T) -> one scalar, by named mode.

Shapes: B batch, T response length. ``mask`` (B, T) bool, True = the token
counts. Masked positions are excluded with torch.where, so a NaN there never
reaches the result or the gradient.

Modes (verl's names; DAPO and Dr.GRPO for what they mean):
- "token-mean": Σ_{b,t} x / N over the N valid tokens of the batch; every
  token weighs the same (DAPO, Yu et al. 2025, eq. 12 "token-level loss").
- "seq-mean-token-mean": mean over sequences of each sequence's token mean;
  every sequence weighs the same (GRPO, Shao et al. 2024, eq. 3: 1/G Σ 1/|o_i| Σ_t).
- "seq-mean-token-sum": mean over sequences of each sequence's token sum.
- "seq-mean-token-sum-norm": mean over sequences of (token sum / L), L a
  constant (``norm_length``, default T): Dr.GRPO (Liu et al. 2025, "Understanding
  R1-Zero-Like Training", §3.2) removes 1/|o_i| and divides by a constant so that
  no length bias is introduced: 1/B · Σ_i (Σ_t x / L). verl 0.9.1's mode of
  the same name computes the same (agg_loss: the seq-mean over non-empty rows,
  then ÷ loss_scale_factor, default T); verl's 0.8 tree left out the 1/B.

Empty masks (a choice, stated): a sum over no token is 0, and every mode
returns 0 (with a zero gradient) when no token is valid, never NaN. An
all-masked micro-batch (padding rows added for data parallelism, all
responses filtered) then adds nothing to the step instead of turning the
whole accumulated gradient into NaN; the trainer logs its token counts, so an
empty batch is visible there. A row with no valid token is likewise left out
of the sequence means (it is padding, not a sample); the divisor is the
number of non-empty rows, at least 1. All modes are device-side: no host sync.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from glassrl.algos.masked import masked_sum

AggregateFn = Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]


def _token_mean(x: torch.Tensor, mask: torch.Tensor, norm_length: int | None) -> torch.Tensor:
    return masked_sum(x, mask) / mask.sum().clamp(min=1)


def _sequence_mean(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of (B,) over rows with at least one valid token; 0 if none."""
    nonempty = mask.any(-1)  # (B,)
    return masked_sum(per_sequence, nonempty) / nonempty.sum().clamp(min=1)


def _seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor, norm_length: int | None) -> torch.Tensor:
    per_sequence = masked_sum(x, mask, dim=-1) / mask.sum(-1).clamp(min=1)  # (B,)
    return _sequence_mean(per_sequence, mask)


def _seq_mean_token_sum(x: torch.Tensor, mask: torch.Tensor, norm_length: int | None) -> torch.Tensor:
    return _sequence_mean(masked_sum(x, mask, dim=-1), mask)


def _seq_mean_token_sum_norm(x: torch.Tensor, mask: torch.Tensor, norm_length: int | None) -> torch.Tensor:
    length = mask.shape[-1] if norm_length is None else norm_length
    if length <= 0:
        raise ValueError(f"norm_length must be a positive token count, got {length}")
    # Dr.GRPO: a constant divisor, the same for every sequence and every step.
    return _sequence_mean(masked_sum(x, mask, dim=-1) / length, mask)


AGGREGATIONS: dict[str, AggregateFn] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int | None = None) -> torch.Tensor:
    """Reduce per-token terms (B, T) over valid tokens to a 0-d tensor.

    ``norm_length`` is read by "seq-mean-token-sum-norm" only (default T);
    pass the configured maximum response length so the divisor stays the same
    whatever the batch's padded width. Unknown ``mode``: ValueError listing
    the valid ones.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid: {', '.join(AGGREGATIONS)}")
    return AGGREGATIONS[mode](per_token, mask, norm_length)
