"""check_weights (glassrl.optim): a float32 sum clears the weights, an exact
element-by-element test decides when the sum is not finite.

Hand cases: finite weights whose float32 sum overflows pass; a NaN, a +inf, and a +inf and −inf
in different tensors (their sum NaN) stop the step naming the weight; with ``reduce`` (data
parallelism) another rank's non-finite shard stops every rank, its overflow alone does not.
"""

from __future__ import annotations

import pytest
import torch

from glassrl.optim import NonFiniteError, check_weights, params_sum

BIG = 3.0e38  # finite; two of them overflow a float32 sum


def model_with(a: list[float], b: list[float]) -> torch.nn.Module:
    m = torch.nn.Module()
    m.a = torch.nn.Parameter(torch.tensor(a))
    m.b = torch.nn.Parameter(torch.tensor(b))
    return m


def check(m: torch.nn.Module, reduce=None) -> None:
    check_weights(m, [p for p in m.parameters()], "step 1", reduce=reduce)


def test_params_sum_is_float32_and_exact_on_small_values():
    m = model_with([1.0, 2.0], [0.5])
    total = params_sum(m.parameters())
    assert total.dtype == torch.float32 and total.item() == 3.5


def test_finite_weights_whose_sum_overflows_pass():
    m = model_with([BIG, BIG], [BIG])
    assert not torch.isfinite(params_sum(m.parameters()))  # the case the exact test is for
    check(m)


@pytest.mark.parametrize(
    ("a", "b", "named"),
    [
        ([1.0, float("nan")], [0.0], "a"),
        ([1.0], [float("inf"), 2.0], "b"),
        ([float("inf")], [float("-inf")], "a"),  # the sum is NaN, not ±inf
        ([BIG, BIG], [float("nan")], "b"),  # overflow and a NaN: the NaN is found
    ],
)
def test_a_non_finite_weight_stops_naming_it(a, b, named):
    with pytest.raises(NonFiniteError, match=rf"step 1: weight {named} is non-finite"):
        check(model_with(a, b))


class OtherRank:
    """``reduce`` as all_reduce_sum over this rank and one other: adds the other rank's values,
    its weights' sum first, then its count of non-finite weights."""

    def __init__(self, weights_sum: float, bad: int) -> None:
        self.values = [weights_sum, float(bad)]

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t + self.values.pop(0)


def test_another_ranks_non_finite_shard_stops_this_rank():
    with pytest.raises(NonFiniteError, match="a weight of another rank's shard"):
        check(model_with([1.0], [2.0]), reduce=OtherRank(float("nan"), 1))


def test_another_ranks_overflow_alone_passes():
    check(model_with([BIG], [1.0]), reduce=OtherRank(BIG, 0))


def test_this_ranks_non_finite_weight_is_named_under_reduce():
    with pytest.raises(NonFiniteError, match="weight b is non-finite"):
        check(model_with([1.0], [float("nan")]), reduce=OtherRank(1.0, 0))
