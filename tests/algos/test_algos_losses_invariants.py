"""Tier 3: invariants of every policy loss, property-based (hypothesis)."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from glassrl.algos.losses import POLICY_LOSSES, PolicyLossParams, get_policy_loss

SETTINGS = settings(max_examples=50, deadline=None)
F64 = torch.float64


@st.composite
def batches(draw, max_b=3, max_t=5):
    """(logprobs, old_logprobs, advantages, mask), float64 (B, T). No subnormal values: an
    advantage of 5e-324 has a gradient that rounds to 0 once halved (torch.max splits a tie's
    gradient between its arguments, as at r = 1 in PPO's clip), which no loss can help."""
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    n = b * t
    lp = draw(st.lists(st.floats(-6, 0, allow_subnormal=False), min_size=n, max_size=n))
    log_r = draw(st.lists(st.floats(-2.5, 2.5, allow_subnormal=False), min_size=n, max_size=n))
    adv = draw(st.lists(st.floats(-3, 3, allow_subnormal=False), min_size=n, max_size=n))
    mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    lp_t = torch.tensor(lp, dtype=F64).view(b, t)
    old = lp_t - torch.tensor(log_r, dtype=F64).view(b, t)
    return lp_t, old, torch.tensor(adv, dtype=F64).view(b, t), torch.tensor(mask).view(b, t)


def loss_and_grad(name, lp0, old, adv, mask, params=PolicyLossParams()):
    lp = lp0.clone().requires_grad_(True)
    out = get_policy_loss(name)(lp, old, adv, mask, params)
    out.loss.sum().backward()
    return out, lp.grad


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
@SETTINGS
@given(data=batches(), junk=st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30, -7.0]))
def test_masked_positions_never_change_valid_outputs_or_gradients(name, data, junk):
    lp, old, adv, mask = data
    out, grad = loss_and_grad(name, lp, old, adv, mask)
    # Same batch with garbage (NaN, inf, huge) in every masked position of every input.
    dirty = [torch.where(mask, x, torch.full_like(x, junk)) for x in (lp, old, adv)]
    out2, grad2 = loss_and_grad(name, *dirty, mask)
    assert torch.isfinite(out2.loss).all() and torch.isfinite(grad2).all()
    torch.testing.assert_close(out2.loss, out.loss)
    torch.testing.assert_close(grad2, grad)
    assert (out2.loss[~mask] == 0).all() and (grad2[~mask] == 0).all()
    for key, value in out2.diagnostics.items():
        torch.testing.assert_close(value, out.diagnostics[key])
        if value.dtype == torch.bool:
            assert not value[~mask].any(), key


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
@SETTINGS
@given(data=batches())
def test_on_policy_gradient_is_the_policy_gradient(name, data):
    # At r = 1 (first mini-batch, fresh data) no clip is active, and every loss's
    # gradient is the policy gradient −A·∇log π (Clip-Cov: except the tokens it detaches).
    lp, _, adv, mask = data
    out, grad = loss_and_grad(name, lp, lp.clone(), adv, mask)
    expected = torch.where(mask, -adv, torch.zeros_like(adv))
    if name == "clip_cov":
        expected = torch.where(out.diagnostics["cov_clipped"], torch.zeros_like(adv), expected)
    torch.testing.assert_close(grad, expected)


@SETTINGS
@given(data=batches(max_t=1))
def test_gspo_equals_ppo_when_every_response_has_one_token(data):
    lp, old, adv, mask = data
    p = PolicyLossParams(clip_low=0.2, clip_high=0.28)
    gspo_out, gspo_grad = loss_and_grad("gspo", lp, old, adv, mask, p)
    ppo_out, ppo_grad = loss_and_grad("ppo_clip", lp, old, adv, mask, p)
    torch.testing.assert_close(gspo_out.loss, ppo_out.loss)
    torch.testing.assert_close(gspo_grad, ppo_grad)
    for key in ("ratio", "clipped_low", "clipped_high"):
        torch.testing.assert_close(gspo_out.diagnostics[key], ppo_out.diagnostics[key])


@SETTINGS
@given(data=batches(), c=st.floats(1.01, 10), log_r_scale=st.floats(1, 8))
def test_dual_clip_bounds_the_loss_for_negative_advantages(data, c, log_r_scale):
    lp, old, adv, mask = data
    old = lp - (lp - old) * log_r_scale  # ratios up to e^20
    p = PolicyLossParams(dual_clip_c=c)
    dual, _ = loss_and_grad("dual_clip", lp, old, adv, mask, p)
    ppo, _ = loss_and_grad("ppo_clip", lp, old, adv, mask, p)
    neg = mask & (adv < 0)
    assert (dual.loss[neg] <= c * adv[neg].abs() * (1 + 1e-12)).all()  # Ye et al. 2020, eq. 5
    assert (dual.loss <= ppo.loss).all()
    torch.testing.assert_close(dual.loss[adv >= 0], ppo.loss[adv >= 0])


@SETTINGS
@given(data=batches())
def test_ppo_clip_flags_are_where_the_gradient_vanishes(data):
    lp, old, adv, mask = data
    out, grad = loss_and_grad("ppo_clip", lp, old, adv, mask)
    r = out.diagnostics["ratio"]
    assume(((r - 0.8).abs() > 1e-9).all() and ((r - 1.2).abs() > 1e-9).all())
    clipped = out.diagnostics["clipped_low"] | out.diagnostics["clipped_high"]
    live = mask & (adv != 0)
    assert ((grad == 0) == (clipped | ~live)).all()


@SETTINGS
@given(data=batches(), eps_hi=st.floats(0.0, 3.0))
def test_cispo_gradient_is_its_formula(data, eps_hi):
    # MiniMax-M1 eq. 4–5: ∇ = −clip(r, 1 − ε^IS_low, 1 + ε^IS_high)·A·∇log π on every valid token.
    lp, old, adv, mask = data
    p = PolicyLossParams(cispo_eps_is_high=eps_hi)
    _, grad = loss_and_grad("cispo", lp, old, adv, mask, p)
    w = torch.exp(lp - old).clamp(1 - p.cispo_eps_is_low, 1 + eps_hi)
    torch.testing.assert_close(grad, torch.where(mask, -w * adv, torch.zeros_like(adv)))


@SETTINGS
@given(data=batches(), c=st.floats(1.5, 5))
def test_aspo_gradient_is_its_formula(data, c):
    lp, old, adv, mask = data
    p = PolicyLossParams(clip_low=0.2, clip_high=0.2, dual_clip_c=c)
    r = torch.exp(lp - old)
    for edge in (1 / c, c, 0.8, 1.2):
        assume(((r - edge).abs() > 1e-9).all())
    _, grad = loss_and_grad("aspo", lp, old, adv, mask, p)
    zero = torch.zeros_like(adv)
    positive = torch.where(r < 1 / c, -adv * c, torch.where(r > 1.2, zero, -adv / r))
    negative = torch.where(r > c, -adv * c, torch.where(r < 0.8, zero, -adv * r))
    expected = torch.where(adv > 0, positive, torch.where(adv < 0, negative, zero))
    torch.testing.assert_close(grad, torch.where(mask, expected, zero))
    # No token's gradient weight exceeds c·|A|: the soft dual clip bounds it on both sides.
    assert (grad.abs() <= c * adv.abs() * (1 + 1e-9)).all()


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
@SETTINGS
@given(data=batches(), perm_seed=st.integers(0, 1000))
def test_row_order_does_not_matter(name, data, perm_seed):
    # Every loss is per token or per sequence (Clip-Cov's batch means are
    # order-free): permuting the rows permutes the output.
    lp, old, adv, mask = data
    perm = torch.randperm(lp.shape[0], generator=torch.Generator().manual_seed(perm_seed))
    out, grad = loss_and_grad(name, lp, old, adv, mask)
    out_p, grad_p = loss_and_grad(name, lp[perm], old[perm], adv[perm], mask[perm])
    torch.testing.assert_close(out_p.loss, out.loss[perm])
    if name == "clip_cov":
        # Equal covariances may swap which token is detached; the count may not change.
        assert out_p.diagnostics["cov_clipped"].sum() == out.diagnostics["cov_clipped"].sum()
        return
    torch.testing.assert_close(grad_p, grad[perm])


def test_log_ratio_bound_is_the_only_clamp_on_the_ratio():
    # log r = 20 is passed through exactly (e^20), beyond is held at e^20.
    lp = torch.zeros(1, 2, dtype=F64)
    out = get_policy_loss("reinforce")(
        lp,
        torch.tensor([[-20.0, -30.0]], dtype=F64),
        torch.zeros(1, 2, dtype=F64),
        torch.ones(1, 2, dtype=torch.bool),
        PolicyLossParams(),
    )
    torch.testing.assert_close(out.diagnostics["ratio"], torch.full((1, 2), math.exp(20.0), dtype=F64))
