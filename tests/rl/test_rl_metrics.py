"""Metric helpers: hand-computed tables, a reference formula, invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.masked import masked_mean
from glassrl.rl import loss
from glassrl.rl.metrics import PhaseTimer, distinct_n, explained_variance, masked_stats

NAN = float("nan")
MASK = torch.tensor([[True, True, False], [True, True, False]])


def test_explained_variance_by_hand():
    # Valid R = 1, 2, 3, 4 and V = 1, 2, 3, 3: R − V = 0, 0, 0, 1.
    # Var[R − V] = (3·0.25² + 0.75²) / 3 = 0.25; Var[R] = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3.
    returns = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]])
    values = torch.tensor([[1.0, 2.0, NAN], [3.0, 3.0, -7.0]])
    assert explained_variance(values, returns, MASK) == pytest.approx(1 - 0.25 / (5 / 3))  # 0.85
    assert explained_variance(returns, returns, MASK) == 1.0
    assert explained_variance(torch.full_like(returns, 2.5), returns, MASK) == pytest.approx(0.0)


def test_explained_variance_is_nan_without_variance_or_tokens():
    returns = torch.tensor([[2.0, 2.0, 5.0]])
    values = torch.tensor([[1.0, 3.0, 0.0]])
    assert math.isnan(explained_variance(values, returns, torch.tensor([[True, True, False]])))  # Var[R] = 0
    assert math.isnan(explained_variance(values, returns, torch.tensor([[False, False, True]])))  # 1 token
    assert math.isnan(explained_variance(values, returns, torch.zeros(1, 3, dtype=torch.bool)))


def test_explained_variance_matches_openai_baselines_formula():
    gen = torch.Generator().manual_seed(0)
    returns = torch.randn(6, 9, generator=gen)
    values = returns + 0.5 * torch.randn(6, 9, generator=gen)
    mask = torch.rand(6, 9, generator=gen) > 0.3
    y, ypred = returns[mask].numpy().astype(np.float64), values[mask].numpy().astype(np.float64)
    baselines = 1 - np.var(y - ypred) / np.var(y)  # baselines/common/math_util.py (biased var cancels)
    assert explained_variance(values, returns, mask) == pytest.approx(baselines, rel=1e-12)


def test_masked_stats_by_hand():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, NAN]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    stats = masked_stats(x, mask)
    assert stats == pytest.approx({"mean": 2.5, "std": math.sqrt(5 / 3), "min": 1.0, "max": 4.0})
    one = masked_stats(x, torch.tensor([[False, False, True], [False, False, False]]))
    assert one["mean"] == one["min"] == one["max"] == 100.0 and math.isnan(one["std"])
    assert all(math.isnan(v) for v in masked_stats(x, torch.zeros_like(mask)).values())


def approx_kl(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """actor/approx_kl of one micro-batch: the loss's per-token k3, its mean over valid tokens."""
    return masked_mean(loss.approx_kl(logprobs, old_logprobs, mask), mask).item()


def test_approx_kl_by_hand():
    # r = 2: (2 − 1) − ln 2; r = 1/2: (1/2 − 1) + ln 2; their mean is exactly 1/4.
    old = torch.zeros(1, 3, dtype=torch.float64)
    new = torch.tensor([[math.log(2.0), math.log(0.5), 50.0]], dtype=torch.float64)
    assert approx_kl(new, old, MASK[:1]) == pytest.approx(0.25, abs=1e-12)
    assert approx_kl(old, old, MASK[:1]) == 0.0


def test_approx_kl_is_unbiased_for_kl_old_to_new():
    """Tokens drawn from π_old: the mean of k3 estimates KL(π_old ‖ π_θ) (Schulman 2020)."""
    gen = torch.Generator().manual_seed(0)
    p_old = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    p_new = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])
    tokens = torch.multinomial(p_old, 200_000, replacement=True, generator=gen).reshape(400, 500)
    estimate = approx_kl(p_new.log()[tokens], p_old.log()[tokens], torch.ones_like(tokens, dtype=torch.bool))
    exact = float((p_old * (p_old.log() - p_new.log())).sum())
    assert estimate == pytest.approx(exact, rel=0.02)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=12), st.lists(st.floats(-5, 5), min_size=1, max_size=12))
def test_approx_kl_is_non_negative(a, b):
    n = min(len(a), len(b))
    new, old = torch.tensor([a[:n]], dtype=torch.float64), torch.tensor([b[:n]], dtype=torch.float64)
    assert approx_kl(new, old, torch.ones(1, n, dtype=torch.bool)) >= 0.0


def test_distinct_n_by_hand():
    assert distinct_n(["abab", "ab"], 1) == pytest.approx(2 / 6)  # {a, b} of a b a b a b
    assert distinct_n(["abab", "ab"], 2) == pytest.approx(2 / 4)  # {ab, ba} of ab ba ab ab
    assert distinct_n([[1, 2, 3], [1, 2]], 2) == pytest.approx(2 / 3)  # {(1,2), (2,3)} of (1,2) (2,3) (1,2)
    assert distinct_n([s.split() for s in ["the cat", "the dog"]], 1) == pytest.approx(3 / 4)
    assert distinct_n([[7], [7]], 1) == 0.5
    assert math.isnan(distinct_n([[1, 2]], 3)) and math.isnan(distinct_n([], 1))
    with pytest.raises(ValueError, match="n must be >= 1"):
        distinct_n([[1]], 0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=8), max_size=6), st.integers(1, 3))
def test_distinct_n_lies_in_unit_interval(sequences, n):
    value = distinct_n(sequences, n)
    if any(len(s) >= n for s in sequences):
        assert 0.0 < value <= 1.0
    else:
        assert math.isnan(value)


def test_phase_timer_by_hand():
    ticks = iter([0.0, 1.5, 2.0, 2.5, 10.0, 14.0])
    timer = PhaseTimer(clock=lambda: next(ticks))
    with timer.phase("generate"):
        timer.add_tokens("generate", 5)
    with timer.phase("score"):
        pass
    with pytest.raises(RuntimeError):
        with timer.phase("generate"):  # time of a failing phase still counts
            timer.add_tokens("generate", 6)
            raise RuntimeError
    assert timer.metrics() == {
        "perf/generate_s": 5.5,
        "perf/generate_tokens_per_s": 2.0,  # 11 tokens / 5.5 s
        "perf/score_s": 0.5,
    }
    timer.reset()
    assert timer.metrics() == {}


def test_phase_timer_zero_time_gives_nan_rate():
    timer = PhaseTimer(clock=lambda: 3.0)
    with timer.phase("update"):
        timer.add_tokens("update", 10)
    metrics = timer.metrics()
    assert metrics["perf/update_s"] == 0.0 and math.isnan(metrics["perf/update_tokens_per_s"])
