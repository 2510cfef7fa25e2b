"""Masked statistics over the valid tokens of a batch.

Shapes: ``x`` and ``mask`` share any shape, usually (B, T); ``mask`` is bool,
True = the token counts. Statistics are global over every valid token of the
batch (verl ``verl/utils/torch_functional.py``: masked_mean / masked_var /
masked_whiten), not per row.

``reduce`` lets a data-parallel caller make them global over ranks too: it
receives a 1-D tensor of partial sums and must return it summed over ranks, e.g.
``lambda t: (dist.all_reduce(t), t)[1]``. Without it the stats are local.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is True; over everything when ``dim`` is None.

    Masked with torch.where, so a NaN or inf on a masked position does not leak
    (NaN * 0 would be NaN).
    """
    valid = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return valid.sum() if dim is None else valid.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over valid positions; NaN where there is none (0 / 0).

    No eps is added to the count: a mean over nothing is undefined and should
    show as NaN rather than as a silent 0.
    """
    return masked_sum(x, mask, dim) / masked_sum(torch.ones_like(x), mask, dim)


def _global_mean_var(
    x: torch.Tensor, mask: torch.Tensor, unbiased: bool, reduce: Reduce | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, var) over all valid tokens (across ranks when ``reduce`` is given).

    Two passes (mean first, then the sum of squared deviations) instead of
    E[x²] − E[x]², which loses every digit when the mean is large against the
    spread.
    """
    reduce = reduce if reduce is not None else (lambda t: t)
    sums = reduce(torch.stack([masked_sum(x, mask), masked_sum(torch.ones_like(x), mask)]))
    total, count = sums[0], sums[1]
    needed = 2 if unbiased else 1
    n = int(count)  # host sync: the error below must name the count
    if n < needed:
        raise ValueError(
            f"masked variance needs at least {needed} valid tokens "
            f"({'unbiased' if unbiased else 'biased'}); the mask has {n}"
        )
    mean = total / count
    sq_dev = reduce(masked_sum((x - mean) ** 2, mask).reshape(1))[0]
    # Bessel's correction, as verl's masked_var(unbiased=True).
    return mean, sq_dev / (count - 1 if unbiased else count)


def masked_var(
    x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True, reduce: Reduce | None = None
) -> torch.Tensor:
    """Variance of ``x`` over all valid tokens (a 0-d tensor).

    Raises ValueError naming the count when the mask has fewer than 2 valid
    tokens (1 when ``unbiased`` is False).
    """
    return _global_mean_var(x, mask, unbiased, reduce)[1]


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    reduce: Reduce | None = None,
) -> torch.Tensor:
    """(x − mean) / sqrt(var + eps) over valid tokens; 0 on masked positions.

    Uses the unbiased variance, as verl's masked_whiten. With ``shift_mean``
    False the mean is added back (only the scale changes), as verl and TRL do
    for rewards. Output has the shape of ``x``.
    """
    mean, var = _global_mean_var(x, mask, True, reduce)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, torch.zeros((), dtype=whitened.dtype, device=x.device))
