"""The legend of every token of a long response costs time linear in its length (issue 33, item 2):
the report writes the legend of each token, and each legend re-read the response before it (the
state's prefix), every return of the batch (REINFORCE++'s statistics) or every step end after it
(process rewards): 64 k tokens took minutes. Counted here in tokens read, not in seconds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import glassrl.ledger.legend as legend
from glassrl.ledger import Ledger

T = 2000


class CountingTokens(tuple):
    """A response's token rows that count how many rows are read (by index, slice or iteration)."""

    read = 0

    def __getitem__(self, key):
        got = super().__getitem__(key)
        CountingTokens.read += len(got) if isinstance(key, slice) else 1
        return got

    def __iter__(self):
        CountingTokens.read += len(self)
        return super().__iter__()


def long_ledger(estimator: str) -> Ledger:
    mask = torch.ones(1, T, dtype=torch.bool)
    step_end = torch.zeros(1, T, dtype=torch.bool)
    step_end[0, ::100] = True
    ledger = Ledger.from_tensors(
        prompts=["p"],
        token_texts=[["t"] * T],
        response_mask=mask,
        estimator=estimator,
        gamma=1.0,
        lam=0.95,
        beta=0.0,
        kl_kind=None,
        advantages=torch.ones(1, T),
        returns=torch.ones(1, T),
        values=torch.zeros(1, T),
        deltas=torch.zeros(1, T),
        token_rewards=torch.zeros(1, T),
        step_end_mask=step_end,
    )
    (resp,) = ledger.responses
    return dataclasses.replace(ledger, responses=(dataclasses.replace(resp, tokens=CountingTokens(resp.tokens)),))


@pytest.mark.parametrize("estimator", ["gae", "grpo", "reinforce_pp", "grpo_process"])
def test_the_legends_of_all_tokens_read_each_token_a_bounded_number_of_times(estimator, monkeypatch):
    ledger = long_ledger(estimator)
    stats = []
    real = legend._stats
    monkeypatch.setattr(legend, "_stats", lambda xs: stats.append(len(xs)) or real(xs))
    CountingTokens.read = 0
    lines = [legend.token_legend(ledger, 0, i) for i in range(T)]
    assert CountingTokens.read <= 60 * T, CountingTokens.read  # was T²/2 and more
    assert len(stats) <= 1  # REINFORCE++'s mean and std of the batch's returns: once, not per token
    state = lines[T - 1][1].text
    assert "…tttt" in state and state.count("t") < 50  # the prefix shown is the tail, as before
