"""The train/rollout mismatch and truncated importance sampling (glassrl.algos.rollout_is), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from glassrl.algos.rollout_is import logprob_mismatch, truncated_is_weights

L = math.log
# One response of 4 positions; the last is padding holding numbers that must not matter.
#   token:          0         1         2          3 (pad)
#   π_old:        0.5       0.3       0.2          -
#   π_rollout:    0.25      0.6       0.2          -
#   ratio:        2         0.5       1            e^100
OLD = torch.tensor([[L(0.5), L(0.3), L(0.2), 0.0]])
ROLLOUT = torch.tensor([[L(0.25), L(0.6), L(0.2), -100.0]])
MASK = torch.tensor([[True, True, True, False]])


def test_weights_are_the_ratio_cut_at_the_cap():
    weights, truncated = truncated_is_weights(OLD, ROLLOUT, MASK, cap=1.5)
    # min(2, 1.5) = 1.5; min(0.5, 1.5) = 0.5; min(1, 1.5) = 1; padding 0
    torch.testing.assert_close(weights, torch.tensor([[1.5, 0.5, 1.0, 0.0]]))
    assert truncated.tolist() == [[True, False, False, False]]


def test_a_cap_above_every_ratio_keeps_the_plain_ratio():
    weights, truncated = truncated_is_weights(OLD, ROLLOUT, MASK, cap=3.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 1.0, 0.0]]))
    assert not truncated.any()


def test_same_engine_gives_weight_one_and_no_gradient():
    old = OLD.clone().requires_grad_(True)
    weights, _ = truncated_is_weights(old, OLD, MASK, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    assert not weights.requires_grad  # a constant factor of the loss


def test_weighted_loss_gradient_is_finite_on_padding():
    # A per-token loss times the weights: padding's e^100 ratio must not become inf·0 = NaN.
    logprobs = torch.zeros(1, 4, requires_grad=True)
    weights, _ = truncated_is_weights(OLD, ROLLOUT, MASK, cap=2.0)
    loss = torch.where(MASK, -logprobs * weights, 0.0).sum()
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -torch.tensor([[2.0, 0.5, 1.0, 0.0]]))


def test_mismatch_is_the_mean_and_max_absolute_log_ratio_over_valid_tokens():
    mean, biggest = logprob_mismatch(OLD, ROLLOUT, MASK)
    # |log 2|, |log 0.5|, 0 -> mean 2·log 2 / 3, max log 2 (the padding's 100 is not counted)
    assert mean.item() == pytest.approx(2 * L(2) / 3)
    assert biggest.item() == pytest.approx(L(2))


def test_mismatch_without_valid_tokens_is_nan():
    mean, biggest = logprob_mismatch(OLD, ROLLOUT, torch.zeros_like(MASK))
    assert math.isnan(mean.item()) and math.isnan(biggest.item())


def test_a_cap_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(OLD, ROLLOUT, MASK, cap=0.0)
