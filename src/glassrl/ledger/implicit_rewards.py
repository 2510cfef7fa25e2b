"""A preference ledger (glassrl.ledger.preference) from log-probs, through the loss's own functions.

    ledger = pair_ledger(prompt, chosen, rejected, loss="dpo", params=PreferenceLossParams(beta=0.1))

Each side is a :class:`SideNumbers`: the response's token ids and texts and its log π_θ and
log π_ref per token (T,). The per-token rewards, their aggregation and the pair's loss are
glassrl.algos.losses.preference's — the functions ``glassrl dpo`` trains with — so the ledger's
sums are the rewards of the loss (tests/ledger/test_ledger_preference.py checks them against the
trainer's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from glassrl.algos.losses.preference import (
    PAIR_LOSSES,
    PreferenceLossParams,
    Side,
    get_preference_loss,
    pair_loss,
    side_rewards,
)
from glassrl.ledger.preference import PreferenceLedger, PreferenceSide, PreferenceToken


class SideNumbers(NamedTuple):
    """One response: its text, token ids and texts, log π_θ (T,) and log π_ref (T,) or None."""

    response: str
    token_ids: Sequence[int]
    tokens: Sequence[str]
    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None


def pair_ledger(
    prompt: str,
    chosen: SideNumbers,
    rejected: SideNumbers,
    *,
    loss: str,
    params: PreferenceLossParams,
    source: str = "",
) -> PreferenceLedger:
    """The ledger of one pair under preference loss ``loss`` (PAIR_LOSSES or KTO)."""
    entry = get_preference_loss(loss)
    sides = [_side(numbers, entry.reference) for numbers in (chosen, rejected)]
    rewards = [side_rewards(side, entry, params.beta) for side in sides]
    total = None
    if loss in PAIR_LOSSES:  # KTO's loss needs a batch's z₀
        value, *rewards = pair_loss(loss, *sides, params)  # the chosen side's NLL terms too (RPO, CPO, ORPO)
        total = value.item()
    built = [
        _ledger_side(name, numbers, side, reward)
        for name, numbers, side, reward in zip(("chosen", "rejected"), (chosen, rejected), sides, rewards)
    ]
    knobs = {k: float(getattr(params, k)) for k in (*entry.knobs, *entry.state)}  # state: BCO's δ
    return PreferenceLedger(loss, knobs, entry.reduction, prompt, built[0], built[1], total, source)


def _side(numbers: SideNumbers, reference: bool) -> Side:
    logprobs = numbers.logprobs.reshape(1, -1).float()  # (1, T), float32 as in training
    ref = numbers.ref_logprobs.reshape(1, -1).float() if reference and numbers.ref_logprobs is not None else None
    if reference and ref is None:
        raise ValueError("this loss reads π_ref: give the reference log-probs")
    return Side(logprobs, ref, torch.ones_like(logprobs, dtype=torch.bool))


def _ledger_side(name: str, numbers: SideNumbers, side: Side, rewards) -> PreferenceSide:
    ref = side.ref_logprobs
    tokens = tuple(
        PreferenceToken(
            i=i,
            token_id=int(token_id),
            token=text,
            logprob=side.logprobs[0, i].item(),
            ref_logprob=None if ref is None else ref[0, i].item(),
            reward=rewards.tokens[0, i].item(),
            nll=None if rewards.nll is None else rewards.nll[0, i].item(),
        )
        for i, (token_id, text) in enumerate(zip(numbers.token_ids, numbers.tokens))
    )
    return PreferenceSide(
        name=name,
        response=numbers.response,
        tokens=tokens,
        reward=rewards.sequence[0].item(),
        logprob=side.logprobs.sum().item(),
        ref_logprob=None if ref is None else ref.sum().item(),
    )
