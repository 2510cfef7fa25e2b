"""The off-policy corrections (glassrl.algos.off_policy): each by hand on one table, then the
invariants every correction keeps (hypothesis), and the train/rollout mismatch."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.off_policy import OFF_POLICY, correct, logprob_mismatch, token_tis

L = math.log
# One response of 4 positions; the last is padding holding numbers that must not matter.
#   token:          0         1         2          3 (pad)
#   π_old:        0.5       0.3       0.2          -
#   π_rollout:    0.25      0.6       0.2          -
#   ratio:        2         0.5       1            e^100
OLD = torch.tensor([[L(0.5), L(0.3), L(0.2), 0.0]])
ROLLOUT = torch.tensor([[L(0.25), L(0.6), L(0.2), -100.0]])
MASK = torch.tensor([[True, True, True, False]])


def _tis(old, rollout, mask, cap):
    result = correct("token_tis", old, rollout, mask, {"cap": cap})
    return result.weights, result.cut


def test_weights_are_the_ratio_cut_at_the_cap():
    weights, truncated = _tis(OLD, ROLLOUT, MASK, cap=1.5)
    # min(2, 1.5) = 1.5; min(0.5, 1.5) = 0.5; min(1, 1.5) = 1; padding 0
    torch.testing.assert_close(weights, torch.tensor([[1.5, 0.5, 1.0, 0.0]]))
    assert truncated.tolist() == [[True, False, False, False]]


def test_a_cap_above_every_ratio_keeps_the_plain_ratio():
    weights, truncated = _tis(OLD, ROLLOUT, MASK, cap=3.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 1.0, 0.0]]))
    assert not truncated.any()


def test_same_engine_gives_weight_one_and_no_gradient():
    old = OLD.clone().requires_grad_(True)
    weights, _ = _tis(old, OLD, MASK, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    assert not weights.requires_grad  # a constant factor of the loss


def test_weighted_loss_gradient_is_finite_on_padding():
    # A per-token loss times the weights: padding's e^100 ratio must not become inf·0 = NaN.
    logprobs = torch.zeros(1, 4, requires_grad=True)
    weights, _ = _tis(OLD, ROLLOUT, MASK, cap=2.0)
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
        _tis(OLD, ROLLOUT, MASK, cap=0.0)


# ---------------------------------------------------------------- every correction, by hand
# Two responses; row 1 has two tokens and two positions of padding holding junk.
#   row 0 ratios ρ:  2     0.5   1     pad        Π ρ = 1,   geometric mean 1
#   row 1 ratios ρ:  3     1.5   pad   pad        Π ρ = 4.5, geometric mean √4.5 = 2.12
OLD2 = torch.tensor([[L(0.5), L(0.3), L(0.2), 0.0], [L(0.6), L(0.3), float("nan"), 7.0]])
ROLLOUT2 = torch.tensor([[L(0.25), L(0.6), L(0.2), -100.0], [L(0.2), L(0.2), 0.0, float("inf")]])
MASK2 = torch.tensor([[True, True, True, False], [True, True, False, False]])
F, T = False, True
HAND = {
    # name: (knobs, weights, keep, cut)
    "token_tis": (
        {"cap": 2.5},
        [[2, 0.5, 1, 0], [2.5, 1.5, 0, 0]],
        [[T, T, T, F], [T, T, F, F]],
        [[F] * 4, [T, F, F, F]],
    ),
    "seq_tis": ({"cap": 2.5}, [[1, 1, 1, 0], [2.5, 2.5, 0, 0]], [[T, T, T, F], [T, T, F, F]], [[F] * 4, [T, T, F, F]]),
    "token_mis": ({"cap": 2.5}, [[2, 0.5, 1, 0], [0, 1.5, 0, 0]], [[T, T, T, F], [F, T, F, F]], [[F] * 4] * 2),
    "seq_mis": ({"cap": 2.5}, [[1, 1, 1, 0], [0, 0, 0, 0]], [[T, T, T, F], [F] * 4], [[F] * 4] * 2),
    "icepop": ({"low": 0.6, "high": 2.5}, [[2, 0, 1, 0], [0, 1.5, 0, 0]], [[T, F, T, F], [F, T, F, F]], [[F] * 4] * 2),
    "geo_mask": ({"low": 0.9, "high": 1.1}, [[1, 1, 1, 0], [0, 0, 0, 0]], [[T, T, T, F], [F] * 4], [[F] * 4] * 2),
    "decoupled": ({}, [[2, 0.5, 1, 0], [3, 1.5, 0, 0]], [[T, T, T, F], [T, T, F, F]], [[F] * 4] * 2),
}


def test_the_hand_table_covers_every_correction():
    assert set(HAND) == set(OFF_POLICY)


@pytest.mark.parametrize("name", sorted(HAND))
def test_each_correction_by_hand(name):
    knobs, weights, keep, cut = HAND[name]
    result = correct(name, OLD2, ROLLOUT2, MASK2, knobs)
    torch.testing.assert_close(result.weights, torch.tensor(weights, dtype=torch.float32), rtol=1e-5, atol=1e-6)
    assert result.keep.tolist() == keep
    assert result.cut.tolist() == cut


def test_defaults_fill_missing_knobs_and_bad_ones_are_refused():
    default = correct("icepop", OLD2, ROLLOUT2, MASK2, {})  # [0.5, 5]: only row 0's ρ = 0.5 sits on the edge
    assert default.keep[1].tolist() == [T, T, F, F]
    with pytest.raises(ValueError, match="low 3.0 > high 2.0"):
        correct("icepop", OLD2, ROLLOUT2, MASK2, {"low": 3.0, "high": 2.0})
    with pytest.raises(ValueError, match="unknown; valid: token_tis"):
        correct("tis", OLD2, ROLLOUT2, MASK2, {})


def test_token_tis_is_the_truncated_ratio():
    result = token_tis(OLD, ROLLOUT, MASK, {"cap": 1.5})
    torch.testing.assert_close(result.weights, torch.tensor([[1.5, 0.5, 1.0, 0.0]]))


# ---------------------------------------------------------------- invariants of every correction


@st.composite
def batches(draw):
    """(old, rollout, mask): B ≤ 3 rows of T ≤ 6 log-probs in [−6, 0], a random mask."""
    B, T_ = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    logprob = st.floats(-6.0, 0.0, allow_nan=False)
    old = torch.tensor(draw(st.lists(st.lists(logprob, min_size=T_, max_size=T_), min_size=B, max_size=B)))
    rollout = torch.tensor(draw(st.lists(st.lists(logprob, min_size=T_, max_size=T_), min_size=B, max_size=B)))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=T_, max_size=T_), min_size=B, max_size=B)))
    return old, rollout, mask


SEQUENCE_LEVEL = ("seq_tis", "seq_mis", "geo_mask")


@settings(max_examples=60, deadline=None)
@given(batch=batches(), junk=st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30]))
def test_every_correction_keeps_its_invariants(batch, junk):
    old, rollout, mask = batch
    for name in OFF_POLICY:
        result = correct(name, old, rollout, mask, {})
        assert not (result.keep & ~mask).any(), name  # only valid tokens are kept
        assert not (result.cut & ~result.keep).any(), name
        assert torch.isfinite(result.weights).all() and (result.weights >= 0).all(), name
        assert (result.weights[~result.keep] == 0).all(), name
        assert not result.weights.requires_grad
        if name in SEQUENCE_LEVEL:  # one decision and one weight per response
            for b in range(len(mask)):
                kept, valid = result.keep[b][mask[b]], result.weights[b][mask[b]]
                assert kept.all() or not kept.any(), name
                assert (valid == valid[0]).all() if len(valid) else True, name
        # whatever the padding holds, nothing changes
        dirty_old, dirty_rollout = torch.where(mask, old, junk), torch.where(mask, rollout, -junk)
        dirty = correct(name, dirty_old, dirty_rollout, mask, {})
        assert torch.equal(dirty.weights, result.weights) and torch.equal(dirty.keep, result.keep), name


@settings(max_examples=30, deadline=None)
@given(batch=batches())
def test_on_policy_samples_keep_every_token_at_weight_one(batch):
    old, _, mask = batch
    for name in OFF_POLICY:
        result = correct(name, old, old.clone(), mask, {})
        assert torch.equal(result.keep, mask), name
        torch.testing.assert_close(result.weights, mask.float(), msg=name)
