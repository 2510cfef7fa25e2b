"""Mixed precision: float32 master weights and optimiser state, bfloat16 compute.

Weights stored in bfloat16 and stepped by AdamW lose small updates: bfloat16 keeps
8 significant bits, so ``w + Δ`` rounds back to ``w`` whenever ``|Δ| < |w|·2⁻⁹``
(for ``|w| ≈ 0.02`` and lr 1e-6 that is every update). Mixed-precision training
keeps an fp32 master copy of the weights that the optimiser updates and runs the
matrix products in half precision (Micikevicius et al. 2018, "Mixed Precision
Training", §3.1; bfloat16 needs no loss scaling: Kalamkar et al. 2019, §2).
Measured in tests/models/test_models_precision.py: one AdamW step at lr 1e-6 on
the tiny model changes ~100 % of the weights with fp32 masters and bf16 autocast,
as in fp32, and a few % with the weights themselves in bf16.

Here: the weights stay float32 (``model.dtype``), and forward passes run under
``torch.autocast(device_type, dtype=torch.bfloat16)`` (:func:`compute_precision`,
:class:`Autocast`). Log-probs and values are returned in float32 (the heads in
glassrl.models cast their outputs), so the losses are computed in float32. Under
FSDP2 the same split is the MixedPrecisionPolicy (glassrl.workers.data_parallel).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from glassrl.errors import GlassrlError

COMPUTE_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def compute_dtype(name: str) -> torch.dtype:
    """``model.compute_dtype`` by name: float32 (no autocast) or bfloat16 (autocast)."""
    if name not in COMPUTE_DTYPES:
        raise GlassrlError(f"model.compute_dtype: unknown {name!r}; valid: {', '.join(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[name]


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes matrix products in on this device type ("cpu", "cuda"), or None where it is
    off (``torch.is_autocast_enabled()`` without an argument reads CUDA's state only)."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


@contextmanager
def compute_precision(device: torch.device | str, dtype: torch.dtype) -> Iterator[None]:
    """Run the enclosed forward pass with matrix products in ``dtype`` (autocast); float32: unchanged."""
    if dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        yield


def check_master_weights(model: nn.Module, dtype: torch.dtype, key: str = "model.dtype") -> None:
    """With half-precision compute, every trainable weight must be a float32 master copy."""
    if dtype == torch.float32:
        return
    stored = {p.dtype for p in model.parameters() if p.requires_grad}
    if stored - {torch.float32}:
        found = ", ".join(sorted(str(d).removeprefix("torch.") for d in stored))
        raise GlassrlError(
            f"{key}: trainable weights are stored in {found}; with model.compute_dtype = "
            f"{str(dtype).removeprefix('torch.')} they must be float32 (AdamW on half-precision weights "
            "loses small updates); set model.dtype: float32"
        )


class Autocast:
    """``forward(model, micro)`` run under :func:`compute_precision` on the model's device.

    A class rather than a closure so that a remote (Ray) worker can receive it pickled,
    like the forward functions of glassrl.rl.update it wraps.
    """

    def __init__(self, forward: Callable[[nn.Module, Any], Any], dtype: str) -> None:
        self.forward, self.dtype = forward, compute_dtype(dtype)

    def __call__(self, model: nn.Module, micro: Any) -> Any:
        device = next(model.parameters()).device
        with compute_precision(device, self.dtype):
            return self.forward(model, micro)
