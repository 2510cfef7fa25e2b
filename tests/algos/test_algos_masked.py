"""masked.py: hand tables, a two-rank reduce hook, invariants."""

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten

F64 = torch.float64
X = torch.tensor([[1.0, 2.0, 100.0], [3.0, float("nan"), 5.0]], dtype=F64)
M = torch.tensor([[True, True, False], [True, False, True]])


def test_hand_table():
    # Valid values 1, 2, 3, 5: sum 11, mean 2.75,
    # squared deviations 3.0625 + 0.5625 + 0.0625 + 5.0625 = 8.75.
    assert masked_sum(X, M).item() == 11.0
    assert masked_mean(X, M).item() == 2.75
    assert masked_var(X, M).item() == pytest.approx(8.75 / 3)
    assert masked_var(X, M, unbiased=False).item() == pytest.approx(8.75 / 4)
    # Per row: (1 + 2) / 2 and (3 + 5) / 2; the NaN on a masked position does not leak.
    assert masked_mean(X, M, dim=-1).tolist() == [1.5, 4.0]
    assert masked_sum(X, M, dim=0).tolist() == [4.0, 2.0, 5.0]


def test_whiten_hand_table():
    x = torch.tensor([[1.0, 2.0, 3.0, 99.0]], dtype=F64)
    m = torch.tensor([[True, True, True, False]])
    # mean 2, unbiased var ((−1)² + 0 + 1²) / 2 = 1.
    out = masked_whiten(x, m, eps=0.0)
    assert out.tolist() == [[-1.0, 0.0, 1.0, 0.0]]
    # shift_mean=False only rescales: x / 1 with the mean kept.
    assert masked_whiten(x, m, shift_mean=False, eps=0.0).tolist() == [[1.0, 2.0, 3.0, 0.0]]


def test_mean_over_nothing_is_nan():
    assert torch.isnan(masked_mean(X, torch.zeros_like(M)))


@pytest.mark.parametrize("valid", [0, 1])
def test_variance_needs_two_valid_tokens(valid):
    m = torch.zeros_like(M)
    m[0, :valid] = True
    with pytest.raises(ValueError, match=f"the mask has {valid}"):
        masked_var(X, m)
    with pytest.raises(ValueError, match=f"the mask has {valid}"):
        masked_whiten(X, m)


def test_biased_variance_needs_one_valid_token():
    m = torch.zeros_like(M)
    m[0, 0] = True
    assert masked_var(X, m, unbiased=False).item() == 0.0
    with pytest.raises(ValueError, match="has 0"):
        masked_var(X, torch.zeros_like(M), unbiased=False)


def _two_rank_reduce():
    """A fake all_reduce for two threads: each gets the sum of both tensors."""
    barrier = threading.Barrier(2)
    slots = [None, None]

    def make(rank):
        def reduce(t):
            slots[rank] = t.clone()
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()  # both have read before the next call overwrites
            return total

        return reduce

    return make


def test_reduce_hook_gives_global_stats():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 9, generator=g, dtype=F64) * 3 + 1
    m = torch.rand(6, 9, generator=g) < 0.6
    make = _two_rank_reduce()
    results = [None, None]

    def run(rank):
        rows = slice(0, 2) if rank == 0 else slice(2, 6)  # uneven shards
        reduce = make(rank)
        results[rank] = (
            masked_var(x[rows], m[rows], reduce=reduce),
            masked_whiten(x[rows], m[rows], reduce=reduce),
        )

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0][0].item() == pytest.approx(masked_var(x, m).item(), rel=1e-12)
    assert results[1][0].item() == pytest.approx(masked_var(x, m).item(), rel=1e-12)
    whole = masked_whiten(x, m)
    torch.testing.assert_close(torch.cat([results[0][1], results[1][1]]), whole)


def test_variance_is_accurate_with_a_large_mean():
    # E[x²] − E[x]² would lose every digit here; the two-pass form keeps them.
    x = torch.tensor([1e8 + 1, 1e8 + 2, 1e8 + 3], dtype=F64)
    assert masked_var(x, torch.ones(3, dtype=torch.bool)).item() == 1.0


@st.composite
def batches(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 30))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, generator=g, dtype=F64) * draw(st.floats(0.1, 100.0))
    m = torch.rand(B, T, generator=g) < draw(st.floats(0.2, 1.0))
    return x, m, g


@settings(max_examples=50, deadline=None)
@given(batches())
def test_whitened_has_mean_zero_variance_one(batch):
    x, m, _ = batch
    if m.sum() < 2 or masked_var(x, m) < 1e-3:
        return
    w = masked_whiten(x, m)
    assert abs(masked_mean(w, m).item()) < 1e-9
    assert masked_var(w, m).item() == pytest.approx(1.0, rel=1e-5)
    assert (w[~m] == 0).all()


@settings(max_examples=50, deadline=None)
@given(batches())
def test_masked_positions_never_change_valid_outputs(batch):
    x, m, g = batch
    noisy = torch.where(m, x, torch.randn(x.shape, generator=g, dtype=F64) * 1e6)
    noisy[~m & (torch.rand(x.shape, generator=g) < 0.3)] = float("nan")
    assert torch.equal(masked_sum(x, m), masked_sum(noisy, m))
    assert torch.equal(masked_mean(x, m, dim=-1).nan_to_num(), masked_mean(noisy, m, dim=-1).nan_to_num())
    if m.sum() >= 2:
        assert torch.equal(masked_whiten(x, m), masked_whiten(noisy, m))
