"""The losses of the RL update: each a sum of weighted :class:`Term`\\ s, a per-token quantity
aggregated by a named mode (DESIGN §3), and the forward passes they read.

Shapes: B responses of a micro-batch, T response width; a batch is a dict of tensors whose first
dimension is B (keys in glassrl.workers.base). Terms are selected by config values (a coefficient > 0,
a KL placement), never by algorithm name: :func:`actor_terms` and :func:`critic_terms`. The update
loop that sums and accumulates them is glassrl.rl.update.run_updates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from glassrl.algos.losses import (
    PolicyLossParams,
    entropy_loss_term,
    get_policy_loss,
    kl_loss_term,
    positive_nll_term,
    value_loss,
)
from glassrl.models.logprobs import response_logprobs
from glassrl.models.values import response_values

Batch = dict[str, torch.Tensor]
Forward = dict[str, torch.Tensor]  # model outputs of one micro-batch: "logprobs", "entropy", "values"


# Diagnostics of the losses reported as metrics (docs/metrics.md): each is a masked
# mean over a micro-batch's valid tokens, averaged over the update's micro-batches.
DIAGNOSTIC_METRICS = {
    "clipped_low": "clip_frac_low",
    "clipped_high": "clip_frac_high",
    "dual_clipped": "dual_clip_frac",
    "cov_clipped": "cov_clip_frac",
    "approx_kl": "approx_kl",
    "clipped": "vf_clip_frac",
}


@dataclass(frozen=True)
class Term:
    """coef × aggregate(per_token, mask, mode): one part of a loss.

    name: metric key of the term's value (e.g. "actor/policy_loss").
    mask(micro) -> (B, T) bool: the tokens it averages over (from the batch alone).
    per_token(forward, micro) -> ((B, T) loss terms, {name: (B, T) diagnostics}).
    """

    name: str
    coef: float
    mode: str
    norm_length: int | None
    mask: Callable[[Batch], torch.Tensor]
    per_token: Callable[[Forward, Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


# ---------------------------------------------------------------- forward passes
# Module-level functions bound with functools.partial (not closures): a remote
# worker can receive them pickled.


def actor_forward(
    temperature: float,
    with_entropy: bool,
    model: torch.nn.Module,
    micro: Batch,
    *,
    packed: bool = False,
    shared_prefix: bool = False,
) -> Forward:
    """log π_θ(a_i|s_i) (B, T) at the sampling temperature, and the entropy H(π_θ(·|s_i)) (B, T)
    when a term needs it (``with_entropy``) or the batch has no old_logprobs (the on-policy update
    of :func:`run_updates` stands in for phase 3, whose metrics show the entropy: detached then,
    unless a term needs it). Both from the same logits. ``packed``: padding-free (model.padding_free);
    ``shared_prefix``: each distinct prompt once (model.shared_prefix)."""
    T = micro["response_mask"].shape[1]
    logprobs, entropy = response_logprobs(
        model,
        micro["input_ids"],
        micro["attention_mask"],
        T,
        temperature=temperature,
        with_entropy=with_entropy or "old_logprobs" not in micro,
        entropy_grad=with_entropy,
        packed=packed,
        shared_prefix=shared_prefix,
    )
    return {"logprobs": logprobs} if entropy is None else {"logprobs": logprobs, "entropy": entropy}


def critic_forward(
    model: torch.nn.Module, micro: Batch, *, packed: bool = False, shared_prefix: bool = False
) -> Forward:
    """V(s_i) (B, T), read at the position before token i (DESIGN §1). ``packed``: padding-free;
    ``shared_prefix``: each distinct prompt once (model.shared_prefix)."""
    T = micro["response_mask"].shape[1]
    values = response_values(
        model, micro["input_ids"], micro["attention_mask"], T, packed=packed, shared_prefix=shared_prefix
    )
    return {"values": values}


# ---------------------------------------------------------------- actor terms


def _response_mask(micro: Batch) -> torch.Tensor:
    return micro["response_mask"]


def _policy_mask(micro: Batch) -> torch.Tensor:
    # An off-policy correction's mask (glassrl.algos.off_policy): a dropped token leaves the policy
    # loss and its denominator (the batch carries the decision, made before the update: rl/phases).
    mask = micro["response_mask"]
    return mask & micro["is_keep"] if "is_keep" in micro else mask


def _positive_mask(micro: Batch) -> torch.Tensor:
    # VAPO positive-example LM loss: normalised over the tokens of positive responses only.
    return micro["response_mask"] & (micro["scores"] > 0).unsqueeze(-1)  # (B, T)


def approx_kl(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """How far an update moved the policy, per token (B, T): KL(π_old ‖ π_θ) estimated on the sampled
    tokens, 0 where ``mask`` is False.

    k3 = (r − 1) − log r with r = π_θ / π_old. Its mean over valid tokens is unbiased for
    KL(π_old ‖ π_θ) because the tokens were drawn from π_old, and it is ≥ 0 per token (Schulman
    2020, "Approximating KL divergence", k3; the ``approx_kl`` of CleanRL's ppo.py). Not clamped,
    unlike the KL penalty (algos/kl.py): a diagnostic should show a large step, not hide it.
    """
    log_ratio = torch.where(mask, logprobs.detach() - old_logprobs.detach(), 0.0)
    return torch.expm1(log_ratio) - log_ratio


def _policy_per_token(name: str, params: PolicyLossParams, out: Forward, micro: Batch):
    mask = _policy_mask(micro)
    result = get_policy_loss(name)(out["logprobs"], micro["old_logprobs"], micro["advantages"], mask, params)
    diagnostics = {**result.diagnostics, "approx_kl": approx_kl(out["logprobs"], micro["old_logprobs"], mask)}
    if "is_weights" not in micro:
        return result.loss, diagnostics
    # The decoupled loss (Hilton et al. 2022, §3; glassrl.algos.off_policy): each kept token's term × w_i,
    # a constant of the batch (TIS: min(π_old/μ, C), Yao et al. 2025).
    return result.loss * micro["is_weights"], diagnostics


def _kl_per_token(kind: str, out: Forward, micro: Batch):
    return kl_loss_term(out["logprobs"], micro["ref_logprobs"], micro["response_mask"], kind), {}


def _entropy_per_token(out: Forward, micro: Batch):
    return entropy_loss_term(out["entropy"], micro["response_mask"]), {}


def _positive_nll_per_token(out: Forward, micro: Batch):
    return positive_nll_term(out["logprobs"], micro["response_mask"], micro["scores"] > 0), {}


def actor_terms(
    *,
    policy_loss: str,
    params: PolicyLossParams,
    loss_agg: str,
    norm_length: int,
    kl_in_loss: str | None,
    kl_coef: float,
    entropy_coef: float,
    positive_nll_coef: float,
) -> list[Term]:
    """The actor's loss: the policy loss, then each auxiliary term whose coefficient is on.

    kl_in_loss: the KL estimator when the KL sits in the loss (GRPO, Shao et al. 2024,
    eq. 3), else None. The entropy bonus enters with −c₂ (PPO, Schulman et al. 2017, eq. 9).
    A batch with an off-policy correction's "is_weights" and "is_keep" (glassrl.rl.phases.off_policy)
    weighs the policy loss's per-token terms and keeps only the kept tokens in it; the other terms
    see every generated token.
    """
    agg = dict(mode=loss_agg, norm_length=norm_length)
    get_policy_loss(policy_loss)  # unknown name: error now, not at the first update
    terms = [
        Term(
            "actor/policy_loss",
            1.0,
            mask=_policy_mask,
            per_token=partial(_policy_per_token, policy_loss, params),
            **agg,
        )
    ]
    if kl_in_loss is not None and kl_coef > 0:
        terms.append(
            Term("actor/kl_loss", kl_coef, mask=_response_mask, per_token=partial(_kl_per_token, kl_in_loss), **agg)
        )
    if entropy_coef > 0:
        terms.append(
            Term("actor/entropy_loss", -entropy_coef, mask=_response_mask, per_token=_entropy_per_token, **agg)
        )
    if positive_nll_coef > 0:
        terms.append(
            Term(
                "actor/positive_nll_loss",
                positive_nll_coef,
                "token-mean",
                None,
                mask=_positive_mask,
                per_token=_positive_nll_per_token,
            )
        )
    return terms


# ---------------------------------------------------------------- critic terms


def _value_per_token(clip: float | None, out: Forward, micro: Batch):
    result = value_loss(out["values"], micro["old_values"], micro["returns"], micro["response_mask"], clip)
    return result.loss, result.diagnostics


def critic_terms(*, value_clip: float | None, loss_agg: str, norm_length: int) -> list[Term]:
    """The critic's loss: the (clipped) value loss against the returns R_i (DESIGN §1)."""
    return [
        Term(
            "critic/value_loss",
            1.0,
            loss_agg,
            norm_length,
            mask=_response_mask,
            per_token=partial(_value_per_token, value_clip),
        )
    ]
