"""Value loss, Bradley–Terry loss, KL / entropy / positive-NLL terms:
hand-computed cases (tier 1) and their invariants (tier 3)."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.losses import (
    entropy_loss_term,
    kl_loss_term,
    pairwise_rm_loss,
    positive_nll_term,
    value_loss,
)

F64 = torch.float64


def t(x, **kw):
    return torch.tensor(x, dtype=F64, **kw)


def test_value_loss_clipping_hand_checked():
    # ε_v = 0.2
    #  V    V_old  R    | (V−R)² | V_clip | (V_clip−R)² | loss = ½·max | clipped | d/dV
    #  1.0  0.5    1.2  | 0.04   | 0.7    | 0.25        | 0.125        | yes     | 0 (clamp saturated)
    #  0.6  0.5    0.0  | 0.36   | 0.6    | 0.36        | 0.18         | no (tie)| V − R = 0.6
    #  0.0  0.5    1.0  | 1.0    | 0.3    | 0.49        | 0.5          | no      | V − R = −1
    v = t([[1.0, 0.6, 0.0]], requires_grad=True)
    out = value_loss(v, t([[0.5, 0.5, 0.5]]), t([[1.2, 0.0, 1.0]]), torch.ones(1, 3, dtype=torch.bool), 0.2)
    out.loss.sum().backward()
    torch.testing.assert_close(out.loss, t([[0.125, 0.18, 0.5]]))
    torch.testing.assert_close(v.grad, t([[0.0, 0.6, -1.0]]))
    assert out.diagnostics["clipped"].tolist() == [[True, False, False]]


def test_value_loss_inside_the_band_is_never_clipped():
    """V_old + (V − V_old) rounds away from V when V is small against V_old (float32): inside the band
    the two errors then differ by rounding, and no token may count as clipped for it."""
    v = torch.linspace(-1e-3, 1e-3, 1001).view(1, -1)
    old = v + 0.15  # inside ε_v = 0.2
    returns = torch.linspace(3, -3, 1001).view(1, -1)
    out = value_loss(v, old, returns, torch.ones_like(v, dtype=torch.bool), 0.2)
    values_clipped = old + (v - old).clamp(-0.2, 0.2)
    assert ((values_clipped - returns) ** 2 > (v - returns) ** 2).any()  # the rounding this guards against
    assert not out.diagnostics["clipped"].any()


def test_value_loss_without_clipping_and_masking():
    v = t([[1.0, float("nan")]], requires_grad=True)
    mask = torch.tensor([[True, False]])
    out = value_loss(v, t([[0.5, float("inf")]]), t([[1.2, float("nan")]]), mask, None)
    out.loss.sum().backward()
    torch.testing.assert_close(out.loss, t([[0.02, 0.0]]))  # ½·0.2²
    torch.testing.assert_close(v.grad, t([[-0.2, 0.0]]))
    assert out.diagnostics["clipped"].tolist() == [[False, False]]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(*[st.floats(-5, 5)] * 3), min_size=1, max_size=8),
    st.floats(0.01, 2.0),
)
def test_value_loss_clipped_is_never_below_unclipped(rows, eps_v):
    v, v_old, ret = (t([[r[i] for r in rows]]) for i in range(3))
    mask = torch.ones_like(v, dtype=torch.bool)
    clipped = value_loss(v, v_old, ret, mask, eps_v).loss
    plain = value_loss(v, v_old, ret, mask, None).loss
    assert (clipped >= plain).all()
    # Inside the band the clip changes nothing.
    inside = (v - v_old).abs() <= eps_v
    torch.testing.assert_close(clipped[inside], plain[inside])


def test_pairwise_rm_loss_hand_checked():
    # −log σ(2 − 1) = log(1 + e^−1) = 0.3132617; with margin 1: −log σ(0) = log 2.
    chosen, rejected = t([2.0, 0.0]), t([1.0, 0.0])
    torch.testing.assert_close(pairwise_rm_loss(chosen, rejected), t([math.log1p(math.exp(-1.0)), math.log(2.0)]))
    torch.testing.assert_close(
        pairwise_rm_loss(chosen, rejected, margin=t([1.0, 1.0])),
        t([math.log(2.0), math.log1p(math.exp(1.0))]),
    )


def test_pairwise_rm_loss_is_stable_for_large_gaps():
    chosen = t([-1000.0, 1000.0], requires_grad=True)
    loss = pairwise_rm_loss(chosen, t([0.0, 0.0]))
    loss.sum().backward()
    torch.testing.assert_close(loss, t([1000.0, 0.0]))
    torch.testing.assert_close(chosen.grad, t([-1.0, 0.0]))  # d/dr_c = −σ(−gap)


@settings(max_examples=50, deadline=None)
@given(st.floats(-20, 20), st.floats(-20, 20), st.floats(0, 5))
def test_pairwise_rm_loss_margin_only_shifts_the_gap(rc, rr, m):
    with_margin = pairwise_rm_loss(t([rc]), t([rr]), t([m]))
    shifted = pairwise_rm_loss(t([rc - m]), t([rr]))
    torch.testing.assert_close(with_margin, shifted)
    assert with_margin.item() >= pairwise_rm_loss(t([rc]), t([rr])).item()  # a margin only adds loss


def test_kl_loss_term_hand_checked():
    # log π = −1, log π_ref = −2: k1 = 1; k3 = e^(−1) − (−1) − 1 = e^−1; masked token -> 0.
    lp = t([[-1.0, float("nan")]], requires_grad=True)
    ref = t([[-2.0, -2.0]])
    mask = torch.tensor([[True, False]])
    torch.testing.assert_close(kl_loss_term(lp, ref, mask, "k1"), t([[1.0, 0.0]]))
    k3 = kl_loss_term(lp, ref, mask)
    torch.testing.assert_close(k3, t([[math.exp(-1.0), 0.0]]))
    k3.sum().backward()
    # d k3 / d log π = 1 − π_ref/π = 1 − e^−1; 0 on the masked NaN.
    torch.testing.assert_close(lp.grad, t([[1.0 - math.exp(-1.0), 0.0]]))


def test_entropy_term_masks_without_leaking_nan():
    h = t([[0.5, float("nan")]], requires_grad=True)
    term = entropy_loss_term(h, torch.tensor([[True, False]]))
    term.sum().backward()
    torch.testing.assert_close(term, t([[0.5, 0.0]]))
    torch.testing.assert_close(h.grad, t([[1.0, 0.0]]))


def test_positive_nll_term_hand_checked():
    # Only valid tokens of positive responses: row 0 token 0 (the NaN is on padding).
    lp = t([[-1.0, float("nan")], [-3.0, -4.0]], requires_grad=True)
    mask = torch.tensor([[True, False], [True, True]])
    term = positive_nll_term(lp, mask, torch.tensor([True, False]))
    term.sum().backward()
    torch.testing.assert_close(term, t([[1.0, 0.0], [0.0, 0.0]]))
    torch.testing.assert_close(lp.grad, t([[-1.0, 0.0], [0.0, 0.0]]))
