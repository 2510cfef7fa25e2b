"""GAE: hand tables, fast vs the Python-loop reference, stability, invariants."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.advantages import (
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    gae_reference,
    td_errors,
)
from glassrl.algos.advantages.gae import discounted_reverse_cumsum, gae, length_adaptive_lam

F64 = torch.float64


def test_dialogue_c_question_1_table():
    # γ = 1, λ = 0.95, V(s_6) = 0. δ_i = r_i + V_{i+1} − V_i:
    #   δ_5 = 0.995 − 0.60 = 0.395      A_5 = 0.395
    #   δ_4 = −0.02 + 0.60 − 0.45 = 0.13   A_4 = 0.13 + 0.95·0.395 = 0.50525
    #   δ_3 = −0.01 + 0.45 − 0.35 = 0.09   A_3 = 0.09 + 0.95·0.50525 = 0.5699875
    #   δ_2 = 0.005 + 0.35 − 0.30 = 0.055  A_2 = 0.055 + 0.95·0.5699875 = 0.596488125
    #   δ_1 = −0.005 + 0.30 − 0.25 = 0.045 A_1 = 0.045 + 0.95·0.596488125 = 0.61166371875
    #   δ_0 = −0.01 + 0.25 − 0.20 = 0.04   A_0 = 0.04 + 0.95·0.61166371875 = 0.6210805328125
    # returns = A + V.
    r = torch.tensor([[-0.01, -0.005, 0.005, -0.01, -0.02, 0.995]], dtype=F64)
    v = torch.tensor([[0.20, 0.25, 0.30, 0.35, 0.45, 0.60]], dtype=F64)
    m = torch.ones(1, 6, dtype=torch.bool)
    deltas = [0.04, 0.045, 0.055, 0.09, 0.13, 0.395]
    adv = [0.6210805328125, 0.61166371875, 0.596488125, 0.5699875, 0.50525, 0.395]
    ret = [0.8210805328125, 0.86166371875, 0.896488125, 0.9199875, 0.95525, 0.995]
    torch.testing.assert_close(td_errors(r, v, m, 1.0), torch.tensor([deltas], dtype=F64))
    out = compute_advantages("gae", AdvantageInputs(r, m, values=v), AdvantageParams(1.0, 0.95))
    torch.testing.assert_close(out.advantages, torch.tensor([adv], dtype=F64))
    torch.testing.assert_close(out.returns, torch.tensor([ret], dtype=F64))
    torch.testing.assert_close(gae_reference(r, v, m, 1.0, 0.95)[0], out.advantages)


def test_observation_token_carry_hand_table():
    # Tokens [a, obs, b, pad]; mask [T, F, T, F]; r = [0, 5, 1, 3], V = [0.5, 9, 0.8, 4].
    # obs and pad are skipped: a bootstraps from b, and b from V = 0.
    # γ = 0.9, λ = 0.5: δ_b = 1 − 0.8 = 0.2; δ_a = 0 + 0.9·0.8 − 0.5 = 0.22;
    # A_b = 0.2; A_a = 0.22 + 0.45·0.2 = 0.31. Returns: 0.81, 1.0.
    r = torch.tensor([[0.0, 5.0, 1.0, 3.0]], dtype=F64)
    v = torch.tensor([[0.5, 9.0, 0.8, 4.0]], dtype=F64)
    m = torch.tensor([[True, False, True, False]])
    torch.testing.assert_close(td_errors(r, v, m, 0.9), torch.tensor([[0.22, 0, 0.2, 0]], dtype=F64))
    for fn in (gae, gae_reference):
        adv, ret = fn(r, v, m, 0.9, 0.5)
        torch.testing.assert_close(adv, torch.tensor([[0.31, 0, 0.2, 0]], dtype=F64))
        torch.testing.assert_close(ret, torch.tensor([[0.81, 0, 1.0, 0]], dtype=F64))


def test_lambda_zero_is_td_error_lambda_one_is_monte_carlo_hand():
    # r = [1, 2, 3], V = [1, 1, 1], γ = 0.5. δ = [1 + .5 − 1, 2 + .5 − 1, 3 − 1] = [.5, 1.5, 2].
    # λ = 1: A_i = G_i − V_i with G = [1 + 1 + .75, 2 + 1.5, 3] = [2.75, 3.5, 3].
    r = torch.tensor([[1.0, 2.0, 3.0]], dtype=F64)
    v = torch.ones(1, 3, dtype=F64)
    m = torch.ones(1, 3, dtype=torch.bool)
    torch.testing.assert_close(gae(r, v, m, 0.5, 0.0)[0], torch.tensor([[0.5, 1.5, 2.0]], dtype=F64))
    torch.testing.assert_close(gae(r, v, m, 0.5, 1.0)[0], torch.tensor([[1.75, 2.5, 2.0]], dtype=F64))


def test_decoupled_and_length_adaptive_lambda_hand():
    # Rows of 4 and 2 valid tokens, α = 0.5: λ = 1 − 1/(0.5·4) = 0.5 and 1 − 1/(0.5·2) = 0.
    m = torch.tensor([[True, True, True, True], [True, True, False, False]])
    torch.testing.assert_close(length_adaptive_lam(m, 0.5), torch.tensor([0.5, 0.0]))
    # A row shorter than 1/α would get λ < 0: clamped to 0.
    assert length_adaptive_lam(m, 0.1).tolist() == [0.0, 0.0]
    g = torch.Generator().manual_seed(3)
    r, v = torch.randn(2, 4, generator=g, dtype=F64), torch.randn(2, 4, generator=g, dtype=F64)
    inputs = AdvantageInputs(r, m, values=v)
    out = compute_advantages("gae", inputs, AdvantageParams(gamma=1.0, lam=0.9, critic_lam=1.0, length_alpha=0.5))
    lam_rows = torch.tensor([0.5, 0.0], dtype=F64)
    torch.testing.assert_close(out.advantages, gae_reference(r, v, m, 1.0, lam_rows)[0])
    torch.testing.assert_close(out.returns, gae_reference(r, v, m, 1.0, 1.0)[1])
    # Decoupled only: advantages from λ = 0.9, returns from λ_critic = 1.
    out = compute_advantages("gae", inputs, AdvantageParams(gamma=1.0, lam=0.9, critic_lam=1.0))
    torch.testing.assert_close(out.advantages, gae_reference(r, v, m, 1.0, 0.9)[0])
    torch.testing.assert_close(out.returns, gae_reference(r, v, m, 1.0, 1.0)[1])


def _random_batch(seed, B, T, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=dtype)
    v = torch.randn(B, T, generator=g, dtype=dtype)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    holes = torch.rand(B, T, generator=g) < torch.rand(B, 1, generator=g) * 0.5
    m = (torch.arange(T) < lengths.unsqueeze(1)) & ~holes  # padding + observation holes
    m[0] = True  # one full row
    return r, v, m


@pytest.mark.parametrize("T", [1, 15, 16, 17, 257, 3000])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.0), (1.0, 1.0), (0.99, 0.95), (0.9, 1.0), (1.0, "rows")])
def test_fast_equals_reference(T, gamma, lam):
    r, v, m = _random_batch(T, 5, T)
    if lam == "rows":
        lam = torch.tensor([0.0, 1.0, 0.3, 0.95, 0.999], dtype=F64)
    ref_adv, ref_ret = gae_reference(r, v, m, gamma, lam)
    adv, ret = gae(r, v, m, gamma, lam)
    torch.testing.assert_close(adv, ref_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-6, rtol=0)
    ref_deltas = gae_reference(r, v, m, gamma, 0.0)[0]
    torch.testing.assert_close(td_errors(r, v, m, gamma), ref_deltas, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.9), (1.0, 1.0)])
def test_stable_at_any_length(dtype, gamma, lam):
    # T = 8192: (γλ)^−T = 0.9^−8192 would overflow any float; nothing like it is formed.
    r, v, m = _random_batch(1, 2, 8192, dtype)
    adv, ret = gae(r, v, m, gamma, lam)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    ref_adv, ref_ret = gae_reference(r, v, m, gamma, lam)
    scale = ref_adv.abs().max().item()  # λ = 1 sums 8192 terms: compare relative to size
    tol = 1e-9 if dtype == F64 else 1e-5
    torch.testing.assert_close(adv, ref_adv, atol=tol * max(scale, 1.0), rtol=0)


@pytest.mark.parametrize("T", [1, 15, 16, 17, 16 * 16 + 1, 1000])
def test_discounted_reverse_cumsum_equals_the_loop(T):
    g = torch.Generator().manual_seed(T)
    x = torch.randn(4, T, generator=g, dtype=F64)
    discount = torch.tensor([[0.0], [1.0], [0.5], [0.999]], dtype=F64)  # one per row
    expected, acc = torch.empty_like(x), torch.zeros(4, 1, dtype=F64)
    for t in reversed(range(T)):
        acc = x[:, t : t + 1] + discount * acc
        expected[:, t : t + 1] = acc
    torch.testing.assert_close(discounted_reverse_cumsum(x, discount), expected, atol=1e-12, rtol=0)


def test_discounted_reverse_cumsum_tiny_discount_underflows_to_zero_not_nan():
    x = torch.ones(1, 5000, dtype=torch.float32)
    assert torch.equal(discounted_reverse_cumsum(x, torch.tensor([[1e-30]])), x)


@st.composite
def gae_cases(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 60))
    gamma = draw(st.sampled_from([1.0, 0.95, 0.5]))
    lam = draw(st.sampled_from([0.0, 0.5, 0.95, 1.0]))
    return _random_batch(seed, B, T) + (gamma, lam, seed)


@settings(max_examples=50, deadline=None)
@given(gae_cases())
def test_masked_positions_never_change_valid_outputs(case):
    r, v, m, gamma, lam, seed = case
    g = torch.Generator().manual_seed(seed + 1)
    noise = torch.randn(r.shape, generator=g, dtype=F64) * 1e3
    adv, ret = gae(r, v, m, gamma, lam)
    adv2, ret2 = gae(torch.where(m, r, noise), torch.where(m, v, -noise), m, gamma, lam)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    assert (adv[~m] == 0).all() and (ret[~m] == 0).all()


@settings(max_examples=50, deadline=None)
@given(gae_cases())
def test_lambda_one_is_monte_carlo_return_minus_value(case):
    r, v, m, gamma, _, _ = case
    adv, ret = gae(r, v, m, gamma, 1.0)
    for b in range(r.shape[0]):
        idx = m[b].nonzero().flatten().tolist()  # valid tokens; observations are not steps
        G = 0.0
        for i in reversed(idx):
            G = r[b, i].item() + gamma * G
            assert adv[b, i].item() == pytest.approx(G - v[b, i].item(), abs=1e-9)
            assert ret[b, i].item() == pytest.approx(G, abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(gae_cases())
def test_returns_are_raw_advantages_plus_values(case):
    r, v, m, gamma, lam, _ = case
    out = compute_advantages("gae", AdvantageInputs(r, m, values=v), AdvantageParams(gamma, lam))
    torch.testing.assert_close(out.returns[m], out.advantages[m] + v[m], atol=1e-12, rtol=0)
    # λ = 0: A is the TD error itself.
    torch.testing.assert_close(gae(r, v, m, gamma, 0.0)[0], td_errors(r, v, m, gamma), atol=1e-12, rtol=0)
