"""kl.py: hand values, estimators against the exact KL, clamps, controllers."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.kl import (
    K3_MAX,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty,
)

F64 = torch.float64
LN2 = math.log(2.0)


def full_kl(logprobs_full: torch.Tensor, ref_logprobs_full: torch.Tensor) -> torch.Tensor:
    """The slow reference: exact KL(π || π_ref) = Σ_v π(v) (log π(v) − log π_ref(v)) per position,
    (B, T, V) log-distributions -> (B, T); a term with π(v) = 0 is 0 (0·log 0 = 0)."""
    p = logprobs_full.exp()
    return torch.where(p > 0, p * (logprobs_full - ref_logprobs_full), torch.zeros_like(p)).sum(-1)


def test_names():
    assert list(KL_ESTIMATORS) == ["k1", "abs", "k2", "k3"]


def test_hand_table():
    # π(a) = 0.5, π_ref(a) = 0.25: log-ratio log 2.
    # k3 = π_ref/π − log(π_ref/π) − 1 = 0.5 + log 2 − 1 = 0.193147...
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=F64)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=F64)
    expected = {
        "k1": [LN2, -LN2],
        "abs": [LN2, LN2],
        "k2": [0.5 * LN2**2, 0.5 * LN2**2],
        "k3": [0.5 + LN2 - 1, 2.0 - LN2 - 1],
    }
    for kind, values in expected.items():
        torch.testing.assert_close(kl_penalty(logp, ref, kind), torch.tensor([values], dtype=F64))


def test_unknown_kind_lists_valid_names():
    with pytest.raises(ValueError, match="k1, abs, k2, k3"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


def test_k3_clamps_stay_finite():
    # log-ratio ±50 would give exp(50) ≈ 5e21 (inf in fp16); both ends end at the cap.
    logp = torch.tensor([[-50.0, 0.0, 0.0]], dtype=torch.float16)
    ref = torch.tensor([[0.0, -50.0, 0.0]], dtype=torch.float16)
    k3 = kl_penalty(logp, ref, "k3")
    assert torch.isfinite(k3).all()
    assert k3.tolist() == [[K3_MAX, K3_MAX, 0.0]]


def test_full_kl_hand_table():
    # KL([½, ½] || [¼, ¾]) = ½ log 2 + ½ log(2/3).
    p = torch.tensor([[[0.5, 0.5]]], dtype=F64).log()
    q = torch.tensor([[[0.25, 0.75]]], dtype=F64).log()
    assert full_kl(p, q).item() == pytest.approx(0.5 * LN2 + 0.5 * math.log(2 / 3))
    assert full_kl(p, p).item() == 0.0


def test_full_kl_zero_probability_is_zero_not_nan():
    p = torch.tensor([[[0.0, float("-inf")]]], dtype=F64)  # π = [1, 0]
    q = torch.tensor([[[0.5, 0.5]]], dtype=F64).log()
    assert full_kl(p, q).item() == pytest.approx(LN2)


@st.composite
def distributions(draw):
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    V = draw(st.integers(2, 12))
    scale = draw(st.floats(0.1, 4.0))
    logp = torch.log_softmax(torch.randn(3, 2, V, generator=g, dtype=F64) * scale, -1)
    ref = torch.log_softmax(torch.randn(3, 2, V, generator=g, dtype=F64) * scale, -1)
    return logp, ref


@settings(max_examples=50, deadline=None)
@given(distributions())
def test_full_kl_matches_torch_distributions(pair):
    logp, ref = pair
    expected = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=logp), torch.distributions.Categorical(logits=ref)
    )
    torch.testing.assert_close(full_kl(logp, ref), expected)


@settings(max_examples=50, deadline=None)
@given(distributions())
def test_k1_and_k3_are_unbiased_k2_is_not_below_zero(pair):
    # E_{a~π}[k(a)] computed exactly by summing over the vocabulary.
    logp, ref = pair
    V = logp.shape[-1]
    flat = lambda t: t.reshape(-1, V)  # noqa: E731  (B·T, V): each token a as a row entry
    p = logp.exp()
    exact = full_kl(logp, ref)
    for kind in ("k1", "k3"):
        expectation = (p * kl_penalty(flat(logp), flat(ref), kind).reshape(logp.shape)).sum(-1)
        d = ref - logp
        if kind == "k3" and (d.exp() - d - 1).max() > K3_MAX:
            continue  # the cap makes k3 biased on purpose there
        torch.testing.assert_close(expectation, exact)
    assert (kl_penalty(logp, ref, "k2") >= 0).all()
    assert (kl_penalty(logp, ref, "k3") >= 0).all()


def test_fixed_controller():
    c = FixedKLController(0.05)
    c.update(current_kl=100.0, n_steps=1000)
    assert c.value == 0.05
    d = FixedKLController(1.0)
    d.load_state_dict(c.state_dict())
    assert d.value == 0.05


def test_adaptive_controller_hand_table():
    # β = 0.1, target 6, horizon 10000 (Ziegler et al. 2019 defaults), 256 samples:
    # KL 9 -> error clip(9/6 − 1) = 0.2 -> β · (1 + 0.2 · 256 / 10000) = 0.100512.
    c = AdaptiveKLController(0.1, target_kl=6.0, horizon=10000)
    c.update(9.0, 256)
    assert c.value == pytest.approx(0.100512)
    c.update(6.0, 256)  # on target: no change
    assert c.value == pytest.approx(0.100512)
    c.update(0.0, 10000)  # error clipped at −0.2 -> ×0.8
    assert c.value == pytest.approx(0.100512 * 0.8)


def test_adaptive_controller_state_round_trip():
    a = AdaptiveKLController(0.2, target_kl=1.0, horizon=100)
    a.update(3.0, 10)
    b = AdaptiveKLController(0.2, target_kl=1.0, horizon=100)
    b.load_state_dict(a.state_dict())
    for kl in (0.5, 2.0, 1.1):
        a.update(kl, 7)
        b.update(kl, 7)
    assert a.value == b.value


def test_controller_errors():
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, target_kl=1.0, horizon=0)
    with pytest.raises(ValueError, match="'value'"):
        FixedKLController(0.1).load_state_dict({"beta": 0.2})
