"""Preference losses: the DPO family on pairs (DPO, conservative DPO, RPO, IPO, SimPO, CPO, ORPO,
BCO) and KTO on unpaired examples. Offline: the responses come from a data set, not from the policy.

Shapes: B pairs (or examples), T response length (chosen and rejected may differ in T).
Three steps, each its own function, so that every number of the loss can be shown per token:

1. **per-token terms** (:func:`token_rewards`, (B, T)): the implicit reward of each response token,
   ρ_i = β·(log π_θ(a_i|s_i) − log π_ref(a_i|s_i)), or ρ_i = β·log π_θ(a_i|s_i) without a reference
   (SimPO). DPO's reward of a response, β·log π_θ(y|x)/π_ref(y|x) (Rafailov et al. 2023, "Direct
   Preference Optimization", eq. 5 without the prompt-only β·log Z(x), which cancels in eq. 7), is
   the sum of these terms since log π(y|x) = Σ_i log π(a_i|s_i); Rafailov et al. 2024 ("From r to
   Q*: Your Language Model is Secretly a Q-Function") read each term as the token's credit;
2. **aggregation**, a separate named step (:func:`sequence_rewards`, (B,)): "token-sum" (DPO, IPO,
   KTO: the sum above) or "token-mean" (SimPO's length normalisation, Meng et al. 2024, eq. 4);
3. **the loss** of each pair from its two sequence rewards, or of each unpaired example from its
   reward, its label and the KL reference point (B,); the trainer averages it over the batch.
   RPO, CPO and ORPO add an NLL term on the chosen response (:func:`nll_terms`): per chosen
   token ν_i = −α·log π_θ(a_i|s_i)/|y_w|, so a pair's loss is the preference term plus Σ_i ν_i,
   and the ledger shows each ν_i beside ρ_i.

Registries (each entry declares its aggregation, whether it reads π_ref, and the knobs of
:class:`PreferenceLossParams` it reads): ``PAIR_LOSSES``, ``fn(chosen (B,), rejected (B,), params)
-> (B,)``; ``UNPAIRED_LOSSES``, ``fn(rewards (B,), desirable (B,) bool, z0 0-d, params) -> (B,)``.
Masked positions (padding) are replaced by 0 before any arithmetic (torch.where, DESIGN §3), so a
NaN there reaches neither a reward nor a gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from glassrl.algos.losses.common import neutralise, zero_masked
from glassrl.algos.masked import masked_sum


@dataclass(frozen=True)
class PreferenceLossParams:
    """Numbers the preference losses read; each field names the paper's symbol.

    beta: β, the strength of the KL constraint to π_ref (DPO eq. 7; IPO's τ, Azar et al. 2023,
        eq. 17; KTO's β). SimPO's β scales its reference-free reward (Meng et al. 2024, eq. 4;
        the paper uses 2.0–2.5, far above DPO's 0.1).
    label_smoothing: ε, the probability that a pair's label is flipped (conservative DPO,
        Mitchell 2023, "A note on DPO with noisy preferences and relationship to IPO"); 0 is DPO.
    simpo_gamma: γ, SimPO's target reward margin (Meng et al. 2024, eq. 6).
    kto_desirable_weight, kto_undesirable_weight: λ_D, λ_U of KTO's value function
        (Ethayarajh et al. 2024): weights of desirable and undesirable examples.
    rpo_alpha: α, the weight of DPO's NLL term on the chosen response (RPO, Pang et al. 2024,
        "Iterative Reasoning Preference Optimization", eq. 1; TRL's ``rpo_alpha``); 0 is DPO.
    cpo_alpha: the weight of CPO's NLL term (Xu et al. 2024, "Contrastive Preference
        Optimization", eq. 4 has 1; TRL's ``cpo_alpha``).
    bco_delta: δ, BCO's reward shift (Jung et al. 2024, "Binary Classifier Optimization for
        Large Language Model Alignment", eq. 7): the running mean of the rewards, kept by the
        trainer (state, not a knob: glassrl.supervised.preference sets it each step).
    """

    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    kto_desirable_weight: float = 1.0
    kto_undesirable_weight: float = 1.0
    rpo_alpha: float = 0.0
    cpo_alpha: float = 1.0
    bco_delta: float = 0.0

    def __post_init__(self) -> None:
        checks = [
            ("beta", self.beta > 0.0, "must be > 0"),
            ("label_smoothing", 0.0 <= self.label_smoothing < 0.5, "must lie in [0, 0.5)"),
            ("simpo_gamma", self.simpo_gamma >= 0.0, "must be >= 0"),
            ("kto_desirable_weight", self.kto_desirable_weight > 0.0, "must be > 0"),
            ("kto_undesirable_weight", self.kto_undesirable_weight > 0.0, "must be > 0"),
            ("rpo_alpha", self.rpo_alpha >= 0.0, "must be >= 0"),
            ("cpo_alpha", self.cpo_alpha >= 0.0, "must be >= 0"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"PreferenceLossParams.{name} = {getattr(self, name)}: {why}")


# ---------------------------------------------------------------- 1. per-token terms


def token_rewards(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None, response_mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """Implicit reward of each response token (B, T), 0 on masked positions.

    ρ_i = β·(log π_θ(a_i|s_i) − log π_ref(a_i|s_i)) (the per-token terms of DPO's reward, eq. 5);
    ``ref_logprobs`` None: ρ_i = β·log π_θ(a_i|s_i) (SimPO, reference-free, Meng et al. 2024, eq. 4).
    The gradient flows through ``logprobs``.
    """
    if ref_logprobs is None:
        (logprobs,) = neutralise(response_mask, logprobs)
        return zero_masked(beta * logprobs, response_mask)
    logprobs, ref_logprobs = neutralise(response_mask, logprobs, ref_logprobs)
    return zero_masked(beta * (logprobs - ref_logprobs), response_mask)


def nll_terms(logprobs: torch.Tensor, response_mask: torch.Tensor, weight: float) -> torch.Tensor:
    """The NLL term of each chosen token (B, T), 0 on masked positions: ν_i = −α·log π_θ(a_i|s_i)/|y_w|,
    so that Σ_i ν_i = α·(−mean log π_θ over the response's tokens), the term RPO (Pang et al. 2024,
    eq. 1), CPO (Xu et al. 2024, eq. 4) and ORPO (Hong et al. 2024, eq. 6: L_SFT) add to a pair's loss.
    The mean is per response; TRL's trainers take it over every chosen token of the batch (the same
    when the batch's chosen responses have one length). The gradient flows through ``logprobs``."""
    (logprobs,) = neutralise(response_mask, logprobs)
    length = response_mask.sum(-1, keepdim=True).clamp(min=1)  # (B, 1)
    return zero_masked(-weight * logprobs / length, response_mask)


# ---------------------------------------------------------------- 2. aggregation


def _token_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(x, mask, dim=-1)


def _token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # SimPO, Meng et al. 2024, eq. 4: β/|y| · log π_θ(y|x), |y| the response's token count
    return masked_sum(x, mask, dim=-1) / mask.sum(-1).clamp(min=1)


SEQUENCE_REDUCTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token-sum": _token_sum,
    "token-mean": _token_mean,
}


def sequence_rewards(per_token: torch.Tensor, response_mask: torch.Tensor, reduction: str) -> torch.Tensor:
    """A response's implicit reward (B,) from its tokens' (B, T): their sum or mean over valid tokens.

    An empty row (no valid token) has reward 0. Unknown ``reduction``: ValueError listing the valid ones.
    """
    if reduction not in SEQUENCE_REDUCTIONS:
        raise ValueError(f"unknown sequence reduction {reduction!r}; valid: {', '.join(SEQUENCE_REDUCTIONS)}")
    return SEQUENCE_REDUCTIONS[reduction](per_token, response_mask)


# ---------------------------------------------------------------- 3. the losses


def dpo(chosen: torch.Tensor, rejected: torch.Tensor, params: PreferenceLossParams) -> torch.Tensor:
    """DPO, per pair (B,): −log σ(r_c − r_r), r = β·log π_θ/π_ref of each response.

    Rafailov et al. 2023, eq. 7. With label smoothing ε (conservative DPO, Mitchell 2023; TRL's
    ``label_smoothing``): −(1 − ε)·log σ(h) − ε·log σ(−h), h = r_c − r_r: the expected DPO loss
    when each label is flipped with probability ε, so that the loss no longer pushes h to ∞.
    logsigmoid keeps it finite for any h.
    """
    h = chosen - rejected
    eps = params.label_smoothing
    return -(1.0 - eps) * F.logsigmoid(h) - eps * F.logsigmoid(-h)


def ipo(chosen: torch.Tensor, rejected: torch.Tensor, params: PreferenceLossParams) -> torch.Tensor:
    """IPO, per pair (B,): (h − 1/(2τ))², h = log π_θ(y_w)/π_ref(y_w) − log π_θ(y_l)/π_ref(y_l).

    Azar et al. 2023 ("A General Theoretical Paradigm to Understand Learning from Human
    Preferences"), eq. 17, with τ = β. The rewards given carry β (r = β·log π/π_ref), so
    h = (r_c − r_r)/β. A squared loss: it pulls h to the target 1/(2β) and no further, where DPO
    keeps pushing h up on pairs it already orders. Sums of log-probs, as in the paper
    (TRL averages them over tokens for its ``ipo``).
    """
    beta = params.beta
    h = (chosen - rejected) / beta
    return (h - 1.0 / (2.0 * beta)) ** 2


def simpo(chosen: torch.Tensor, rejected: torch.Tensor, params: PreferenceLossParams) -> torch.Tensor:
    """SimPO, per pair (B,): −log σ(r_c − r_r − γ), r = β/|y|·log π_θ(y|x) (reference-free,
    length-normalised: the "token-mean" of β·log π_θ). Meng et al. 2024, eq. 6 (the reward: eq. 4)."""
    return -F.logsigmoid(chosen - rejected - params.simpo_gamma)


def cpo(chosen: torch.Tensor, rejected: torch.Tensor, params: PreferenceLossParams) -> torch.Tensor:
    """CPO's preference term, per pair (B,): −log σ(r_c − r_r), r = β·log π_θ(y|x) (reference-free,
    token-sum). Xu et al. 2024 ("Contrastive Preference Optimization"), eq. 3, the DPO loss with
    π_ref uniform; label smoothing ε as in DPO (TRL's CPOTrainer ``loss_type="sigmoid"``). The NLL
    term of eq. 4, weighted by ``cpo_alpha``, is the entry's (:func:`nll_terms`)."""
    return dpo(chosen, rejected, params)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − e^x) for x < 0, without cancellation: log1p(−e^x) below −log 2, log(−expm1(x))
    above (Mächler 2012; TRL's orpo_trainer.log1mexp branches at the same point). Each branch
    reads only its own side's inputs, so the other's infinite derivative (at x → 0 or x → −∞)
    never meets torch.where's zero as inf·0 = NaN."""
    low = x < -math.log(2.0)
    cut = torch.full_like(x, -math.log(2.0))
    return torch.where(
        low, torch.log1p(-torch.exp(torch.where(low, x, cut))), torch.log(-torch.expm1(torch.where(low, cut, x)))
    )


def orpo(chosen: torch.Tensor, rejected: torch.Tensor, params: PreferenceLossParams) -> torch.Tensor:
    """ORPO's odds-ratio term, per pair (B,): −β·log σ(log odds(y_w|x) − log odds(y_l|x)).

    Hong et al. 2024 ("ORPO: Monolithic Preference Optimization without Reference Model"),
    eq. 6-7: odds(y|x) = P(y|x)/(1 − P(y|x)) with P(y|x) = exp(mean_t log π_θ(y_t|x, y_<t))
    (eq. 4's length-normalised likelihood), L_OR weighted by λ (= β here, as TRL's ``beta``);
    L_SFT is the entry's NLL term (weight 1). The rewards given are β·mean log π_θ (token-mean of
    β·log π_θ), so mean log π = r/β. A mean log-prob of exactly 0 (P = 1, odds ∞) is read as
    −1e-30 to keep log(1 − P) finite (TRL's would be −inf; it needs every token at probability 1).
    """
    beta = params.beta
    lc, lr = (torch.clamp(r / beta, max=-1e-30) for r in (chosen, rejected))
    log_odds = (lc - lr) - (log1mexp(lc) - log1mexp(lr))
    return -beta * F.logsigmoid(log_odds)


def bco(chosen: torch.Tensor, rejected: torch.Tensor, params: PreferenceLossParams) -> torch.Tensor:
    """BCO on pairs, per pair (B,): −log σ(r_c − δ) − log σ(−(r_r − δ)), r = β·log π_θ/π_ref.

    Jung et al. 2024 ("Binary Classifier Optimization for Large Language Model Alignment"), eq. 7:
    a binary classifier whose logit is the implicit reward, chosen labelled 1 and rejected 0, with
    the reward shift δ (``params.bco_delta``: the running mean of the rewards, which the trainer
    keeps; TRL's DPOTrainer ``loss_type="bco_pair"``, its RunningMoments mean of the batches'
    mean rewards). Each response is scored alone: the loss also moves r_c and r_r against δ,
    not only their difference.
    """
    delta = params.bco_delta
    return -F.logsigmoid(chosen - delta) - F.logsigmoid(-(rejected - delta))


def kto(rewards: torch.Tensor, desirable: torch.Tensor, z0: torch.Tensor, params: PreferenceLossParams) -> torch.Tensor:
    """KTO, per example (B,): λ_y − v(x, y), with r = β·log π_θ(y|x)/π_ref(y|x) (``rewards``) and

        v(x, y) = λ_D·σ(r − β·z₀)   for a desirable y,
        v(x, y) = λ_U·σ(β·z₀ − r)   for an undesirable y,

    z₀ the KL reference point (:func:`kto_reference_point`, in nats, no gradient). Ethayarajh et al.
    2024 ("KTO: Model Alignment as Prospect Theoretic Optimization"): L_KTO = E[λ_y − v(x, y)], the
    Kahneman-Tversky value of the implicit reward relative to z₀; TRL's KTOTrainer computes the same
    (``1 − sigmoid(beta·(logratio − kl))``, weighted by ``desirable_weight``/``undesirable_weight``).

    desirable: (B,) bool; z0: 0-d.
    """
    shifted = rewards - params.beta * z0.detach()  # (B,)
    return torch.where(
        desirable,
        params.kto_desirable_weight * (1.0 - torch.sigmoid(shifted)),
        params.kto_undesirable_weight * (1.0 - torch.sigmoid(-shifted)),
    )


def kto_reference_point(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """KTO's z₀ (0-d, no gradient): max(0, mean over the batch of Σ_i (log π_θ − log π_ref)) on
    mismatched pairs (x, y'), y' another example's response — a biased estimate of
    KL(π_θ(y'|x) ‖ π_ref(y'|x)) (Ethayarajh et al. 2024, the reference point; clamped at 0 and not
    back-propagated, as in the paper and TRL). Inputs (B, T) of those pairs."""
    logprobs, ref_logprobs = neutralise(response_mask, logprobs.detach(), ref_logprobs)
    per_response = masked_sum(logprobs - ref_logprobs, response_mask, dim=-1)  # (B,)
    return per_response.mean().clamp(min=0.0)


# ---------------------------------------------------------------- the registries


@dataclass(frozen=True)
class PreferenceLoss:
    """An entry of PAIR_LOSSES or UNPAIRED_LOSSES: the loss, the aggregation of its per-token
    rewards (SEQUENCE_REDUCTIONS), whether it reads π_ref, and the PreferenceLossParams fields it
    reads (``knobs``); the config check calls any other knob the user sets ignored. ``nll``: the
    knob weighting its NLL term on the chosen response; ``state``: the fields the trainer sets."""

    fn: Callable[..., torch.Tensor]
    reduction: str
    reference: bool = True
    knobs: tuple[str, ...] = ("beta",)
    nll: str | None = None  # the knob weighting the NLL term on the chosen response (nll_terms); "" = weight 1
    state: tuple[str, ...] = ()  # PreferenceLossParams fields the trainer sets each step (BCO's δ), not knobs

    def nll_weight(self, params: PreferenceLossParams) -> float:
        """α of the NLL term: 0 without one."""
        if self.nll is None:
            return 0.0
        return getattr(params, self.nll) if self.nll else 1.0


PAIR_LOSSES: dict[str, PreferenceLoss] = {
    "dpo": PreferenceLoss(dpo, "token-sum", knobs=("beta", "label_smoothing", "rpo_alpha"), nll="rpo_alpha"),
    "ipo": PreferenceLoss(ipo, "token-sum"),
    "simpo": PreferenceLoss(simpo, "token-mean", reference=False, knobs=("beta", "simpo_gamma")),
    "cpo": PreferenceLoss(
        cpo, "token-sum", reference=False, knobs=("beta", "label_smoothing", "cpo_alpha"), nll="cpo_alpha"
    ),
    "orpo": PreferenceLoss(orpo, "token-mean", reference=False, nll=""),
    "bco": PreferenceLoss(bco, "token-sum", state=("bco_delta",)),
}
UNPAIRED_LOSSES: dict[str, PreferenceLoss] = {
    "kto": PreferenceLoss(kto, "token-sum", knobs=("beta", "kto_desirable_weight", "kto_undesirable_weight")),
}
PREFERENCE_LOSSES: dict[str, PreferenceLoss] = {**PAIR_LOSSES, **UNPAIRED_LOSSES}


def get_preference_loss(name: str) -> PreferenceLoss:
    """The entry registered as ``name``; ValueError listing the valid names."""
    if name not in PREFERENCE_LOSSES:
        raise ValueError(f"unknown preference loss {name!r}; valid: {', '.join(PREFERENCE_LOSSES)}")
    return PREFERENCE_LOSSES[name]


class Side(NamedTuple):
    """The responses of one side of a batch: log π_θ (B, T) (with gradient), log π_ref (B, T) or
    None (reference-free), response_mask (B, T) bool."""

    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    mask: torch.Tensor


class Rewards(NamedTuple):
    """The implicit rewards of one side: per token (B, T) and per response (B,), the latter the
    former aggregated by the loss's reduction (what the ledger's sums must equal); ``nll``: the
    NLL terms ν_i (B, T) of a chosen side under a loss with one (RPO, CPO, ORPO), else None."""

    tokens: torch.Tensor
    sequence: torch.Tensor
    nll: torch.Tensor | None = None


def side_rewards(side: Side, entry: PreferenceLoss, beta: float) -> Rewards:
    """Steps 1 and 2 for one side: per-token implicit rewards, then their aggregation."""
    tokens = token_rewards(side.logprobs, side.ref_logprobs if entry.reference else None, side.mask, beta)
    return Rewards(tokens, sequence_rewards(tokens, side.mask, entry.reduction))


def pair_loss(
    name: str, chosen: Side, rejected: Side, params: PreferenceLossParams
) -> tuple[torch.Tensor, Rewards, Rewards]:
    """A pair loss of PAIR_LOSSES, all three steps: (loss (B,), chosen's Rewards, rejected's Rewards);
    a loss with an NLL term of weight > 0 adds Σ_i ν_i of the chosen response (chosen's Rewards.nll)."""
    if name not in PAIR_LOSSES:
        raise ValueError(f"unknown pair loss {name!r}; valid: {', '.join(PAIR_LOSSES)}")
    entry = PAIR_LOSSES[name]
    r_c, r_r = side_rewards(chosen, entry, params.beta), side_rewards(rejected, entry, params.beta)
    loss = entry.fn(r_c.sequence, r_r.sequence, params)
    if entry.nll_weight(params):  # RPO with rpo_alpha = 0 is DPO: no NLL terms
        nll = nll_terms(chosen.logprobs, chosen.mask, entry.nll_weight(params))  # (B, T)
        r_c = r_c._replace(nll=nll)
        loss = loss + masked_sum(nll, chosen.mask, dim=-1)
    return loss, r_c, r_r
