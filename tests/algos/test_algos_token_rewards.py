"""token_rewards.py: hand tables (dialogue c, question 1), errors, invariants."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.token_rewards import (
    assemble_token_rewards,
    place_outcome_scores,
    place_process_rewards,
)

F64 = torch.float64


def test_dialogue_c_question_1():
    # Response [是, 的, ，, 等于, 2, ！], score 1.0, β = 0.1,
    # KL [0.1, 0.05, −0.05, 0.1, 0.2, 0.05] -> r = −0.1·KL, plus 1 on the last token.
    mask = torch.ones(1, 6, dtype=torch.bool)
    scores = place_outcome_scores(torch.tensor([1.0], dtype=F64), mask)
    assert scores.tolist() == [[0, 0, 0, 0, 0, 1.0]]
    kl = torch.tensor([[0.1, 0.05, -0.05, 0.1, 0.2, 0.05]], dtype=F64)
    rewards = assemble_token_rewards(scores, kl, 0.1, mask)
    expected = torch.tensor([[-0.01, -0.005, 0.005, -0.01, -0.02, 0.995]], dtype=F64)
    torch.testing.assert_close(rewards, expected)


def test_outcome_score_sits_on_the_last_valid_token():
    # Row 1 has an observation hole at 1: its last valid token is still 3.
    mask = torch.tensor([[True, True, True, False], [True, False, True, True]])
    out = place_outcome_scores(torch.tensor([1.0, 0.5]), mask)
    assert out.tolist() == [[0, 0, 1.0, 0], [0, 0, 0, 0.5]]


def test_outcome_row_without_valid_token_is_named():
    mask = torch.tensor([[True, False], [False, False], [False, False]])
    with pytest.raises(ValueError, match=r"rows \[1, 2\]"):
        place_outcome_scores(torch.ones(3), mask)


def test_process_rewards_hand_table():
    # Row 0: steps end at 1 and 3 (rewards 0.5, 1.0); row 1: one step at 2, one unused slot.
    rewards = torch.tensor([[0.5, 1.0], [-1.0, 7.0]])
    ends = torch.tensor([[1, 3], [2, 99]])
    valid = torch.tensor([[True, True], [True, False]])
    out = place_process_rewards(rewards, ends, valid, T=4)
    assert out.tolist() == [[0, 0.5, 0, 1.0], [0, 0, -1.0, 0]]


def test_process_rewards_errors():
    valid = torch.tensor([[True, True]])
    with pytest.raises(ValueError, match=r"step_ends\[0, 1\] = 4"):
        place_process_rewards(torch.ones(1, 2), torch.tensor([[0, 4]]), valid, T=4)
    with pytest.raises(ValueError, match="row 0 has several steps ending at token 2"):
        place_process_rewards(torch.ones(1, 2), torch.tensor([[2, 2]]), valid, T=4)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 5), st.integers(1, 20), st.floats(0.0, 1.0))
def test_assembly_is_zero_on_masked_positions_and_ignores_them(seed, B, T, beta):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, T, generator=g, dtype=F64)
    kl = torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.rand(B, T, generator=g) < 0.6
    out = assemble_token_rewards(scores, kl, beta, mask)
    noisy_kl = torch.where(mask, kl, torch.full_like(kl, float("nan")))
    assert torch.equal(out, assemble_token_rewards(scores, noisy_kl, beta, mask))
    assert (out[~mask] == 0).all()
    torch.testing.assert_close(out[mask], scores[mask] - beta * kl[mask])
