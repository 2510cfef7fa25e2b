"""Aggregation modes: hand-computed (tier 1), loop reference (tier 2),
invariants (tier 3)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.algos.aggregation import AGGREGATIONS, aggregate

F64 = torch.float64
SETTINGS = settings(max_examples=50, deadline=None)

# x = [[1, 2, 3],    mask = [[T, T, F],
#      [4, 5, 6]]            [T, F, F]]
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=F64)
M = torch.tensor([[True, True, False], [True, False, False]])
HAND = {
    "token-mean": (1 + 2 + 4) / 3,  # every token weighs the same
    "seq-mean-token-mean": ((1 + 2) / 2 + 4 / 1) / 2,  # 2.75
    "seq-mean-token-sum": ((1 + 2) + 4) / 2,  # 3.5
    "seq-mean-token-sum-norm": ((1 + 2) / 3 + 4 / 3) / 2,  # Dr.GRPO, L = T = 3: 7/6
}


@pytest.mark.parametrize("mode", list(HAND))
def test_hand_checked(mode):
    assert aggregate(X, M, mode).item() == pytest.approx(HAND[mode])


def test_sum_norm_divides_by_a_constant_length():
    # Dr.GRPO: the divisor is a constant, not the sequence length and not the padded width.
    assert aggregate(X, M, "seq-mean-token-sum-norm", norm_length=10).item() == pytest.approx((3 / 10 + 4 / 10) / 2)
    wide_x = torch.cat([X, torch.full((2, 4), 9.0, dtype=F64)], dim=1)  # padded to T = 7
    wide_m = torch.cat([M, torch.zeros(2, 4, dtype=torch.bool)], dim=1)
    assert aggregate(wide_x, wide_m, "seq-mean-token-sum-norm", norm_length=3).item() == pytest.approx(
        HAND["seq-mean-token-sum-norm"]
    )
    # Without norm_length the divisor is the padded width T.
    assert aggregate(wide_x, wide_m, "seq-mean-token-sum-norm").item() == pytest.approx((3 / 7 + 4 / 7) / 2)
    with pytest.raises(ValueError, match="norm_length"):
        aggregate(X, M, "seq-mean-token-sum-norm", norm_length=0)


def test_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="valid: token-mean, seq-mean-token-mean"):
        aggregate(X, M, "mean")


@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_empty_mask_gives_zero_and_zero_gradient(mode):
    x = X.clone().requires_grad_(True)
    out = aggregate(x, torch.zeros_like(M), mode)
    out.backward()
    assert out.item() == 0.0
    assert (x.grad == 0).all()


@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_empty_rows_are_left_out_and_nan_never_leaks(mode):
    # A padding row (no valid token) full of NaN changes neither value nor gradient.
    x = torch.cat([X, torch.full((1, 3), float("nan"), dtype=F64)]).requires_grad_(True)
    m = torch.cat([M, torch.zeros(1, 3, dtype=torch.bool)])
    out = aggregate(x, m, mode)
    out.backward()
    assert out.item() == pytest.approx(HAND[mode] if mode != "seq-mean-token-sum-norm" else 7 / 6)
    assert torch.isfinite(x.grad).all() and (x.grad[~m] == 0).all()


def reference(x, m, mode, norm_length=None):
    """Python loops over rows and tokens."""
    rows = []
    for b in range(x.shape[0]):
        vals = [x[b, t].item() for t in range(x.shape[1]) if m[b, t]]
        if vals:
            rows.append(vals)
    if not rows:
        return 0.0
    if mode == "token-mean":
        flat = [v for r in rows for v in r]
        return sum(flat) / len(flat)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / len(rows)
    length = x.shape[1] if norm_length is None else norm_length
    return sum(sum(r) / length for r in rows) / len(rows)


@st.composite
def tables(draw):
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    x = draw(st.lists(st.floats(-100, 100), min_size=b * t, max_size=b * t))
    m = draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))
    return torch.tensor(x, dtype=F64).view(b, t), torch.tensor(m).view(b, t)


@pytest.mark.parametrize("mode", list(AGGREGATIONS))
@SETTINGS
@given(data=tables(), norm_length=st.one_of(st.none(), st.integers(1, 50)))
def test_matches_loop_reference(mode, data, norm_length):
    x, m = data
    assert aggregate(x, m, mode, norm_length).item() == pytest.approx(
        reference(x, m, mode, norm_length), rel=1e-9, abs=1e-9
    )


@SETTINGS
@given(data=tables())
def test_modes_agree_where_they_should(data):
    x, m = data
    n_rows = m.any(-1).sum().item()
    # token-sum = L · token-sum-norm, for any L.
    assert aggregate(x, m, "seq-mean-token-sum").item() == pytest.approx(
        7 * aggregate(x, m, "seq-mean-token-sum-norm", norm_length=7).item(), rel=1e-9, abs=1e-9
    )
    # With every row fully valid, token-mean = seq-mean-token-mean = token-sum / T.
    full = torch.ones_like(m)
    tm = aggregate(x, full, "token-mean").item()
    assert aggregate(x, full, "seq-mean-token-mean").item() == pytest.approx(tm, rel=1e-9, abs=1e-9)
    assert aggregate(x, full, "seq-mean-token-sum").item() == pytest.approx(tm * x.shape[1], rel=1e-9, abs=1e-7)
    # A constant per-token value c aggregates to c under both means.
    if n_rows:
        c = torch.full_like(x, 2.5)
        assert aggregate(c, m, "token-mean").item() == pytest.approx(2.5)
        assert aggregate(c, m, "seq-mean-token-mean").item() == pytest.approx(2.5)
