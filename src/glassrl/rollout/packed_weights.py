"""Decoding on a CPU with each linear layer's weight reordered once per rollout for oneDNN's matrix
product: the decoding loop's faster path for models whose weights stream from memory (issue 40).

Why: a decoding step multiplies a few rows (the responses still writing, B ≤ ~16) by every weight
matrix, so it reads all the weights once per token and is bound by memory bandwidth. At B = 8 and
one thread, MKL's ``sgemm`` (what ``F.linear`` runs) reads Qwen2.5-0.5B's weights at 4.9 GB/s, a
third of the 15 GB/s its matrix-vector kernel gets at B = 1; oneDNN with the weights reordered into
its blocked layout beforehand (``torch.ops.mkldnn._reorder_linear_weight``, the prepacking that
PyTorch's inductor does for frozen CPU models) reads them at 9.4 GB/s: a decoding step of the 0.5 B
model takes 0.25 s instead of 0.44 s, 59 → ~34 s of a GRPO step's generation
(benchmarks/bench_packed_decoding.py, BENCHMARKS.md). The reordering costs ~1 s per rollout at
0.5 B (the weights change after every optimiser step, so each rollout reorders them again) and
holds a second copy of the linear weights while it runs; the gradients are freed by then
(glassrl.optim.guarded_step clears them after each optimiser step), which makes room for it.

Where it runs (:func:`why_not_packed`): on the CPU, float32 weights (or bfloat16 where the CPU has
AVX-512 BF16), when the linear layers' weights are larger than the last-level cache, so that each
step streams them from memory. A small model's weights stay in the cache, where MKL's kernels are
faster than oneDNN's per-call set-up (the default model's decoding: 0.08 → 0.11 s, measured); it
then decodes exactly as before, its figures unchanged to the last bit. Per call, a product of fewer
than ``MIN_ROWS`` rows goes to ``F.linear`` (MKL's matrix-vector kernel beats oneDNN there) and so
does any call under autograd. Under the CPU's bfloat16 autocast (``model.compute_dtype: bfloat16``)
the weights are reordered in bfloat16 and the inputs cast, as autocast's ``F.linear`` would.

The numbers: the same products summed in another order, so the log-probs differ from ``F.linear``'s
in the last bits (≤ 5e-6 at 0.5 B over 128 steps, benchmarks/bench_packed_decoding.py; the tests allow
2e-5) and a token at a near tie can differ from ``model.generate``'s; the trainer's log-probs come from
its own forward pass either way (as with vLLM, a sampler with its own kernels; ``explain --mismatch`` measures the
difference).

Only ``torch.nn.Linear`` itself is reordered (not subclasses, whose forward may differ: quantised
layers); a PEFT LoRA layer's frozen base is one, its adapters run as they are. A layer whose
``forward`` was already replaced on the instance (accelerate's offloading hooks) refuses the path.
"""

from __future__ import annotations

import types
from pathlib import Path

import torch
import torch.nn.functional as F

from glassrl.models.precision import autocast_dtype

# A product of fewer rows runs F.linear: at 1 thread, Qwen2.5-0.5B's matrices took 0.14 s by F.linear
# and 0.17 s by oneDNN at 1 row, 0.17 / 0.19 s at 3, 0.30 / 0.20 s at 5, 0.41 / 0.23 s at 8.
MIN_ROWS = 4
# Assumed when the CPU does not say (sysfs): a server's last-level cache is larger, so the path runs on
# fewer models than it could rather than on models it slows down.
UNKNOWN_CACHE_BYTES = 32 * 2**20
_DTYPES = (torch.float32, torch.bfloat16)


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest CPU cache (the last level: L3 on servers), in bytes, as Linux's sysfs reports it;
    None where it does not."""
    sizes = []
    for index in root.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if text[-1:] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes) if sizes else None


def linear_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's ``torch.nn.Linear`` layers (that exact type), each once."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def _weight_bytes(layers: list[torch.nn.Linear]) -> int:
    weights = {id(layer.weight): layer.weight for layer in layers}  # a tied weight counted once
    return sum(w.numel() * w.element_size() for w in weights.values())


def why_not_packed(model: torch.nn.Module, cache_bytes: int | None = None) -> str | None:
    """Why decoding ``model`` does not reorder its weights (None when it does): the module docstring's
    conditions, each named. ``cache_bytes``: the last-level cache (default: :func:`last_level_cache_bytes`)."""
    layers = linear_layers(model)
    if not layers:
        return "the model has no torch.nn.Linear layer"
    devices = {layer.weight.device.type for layer in layers}
    if devices != {"cpu"}:
        return f"its weights are on {', '.join(sorted(devices))}, not the CPU alone"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch has no oneDNN (mkldnn) linear operators"
    dtypes = {layer.weight.dtype for layer in layers}
    if not dtypes <= set(_DTYPES):
        return (
            f"its weights are {', '.join(sorted(str(d).removeprefix('torch.') for d in dtypes))}: float32 or bfloat16"
        )
    if torch.bfloat16 in dtypes and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "bfloat16 weights, and this CPU has no AVX-512 BF16 for oneDNN"
    if any("forward" in vars(layer) for layer in layers):
        return "a linear layer's forward is replaced on the instance (accelerate's hooks)"
    cache = cache_bytes if cache_bytes is not None else last_level_cache_bytes()
    known = cache is not None
    cache = cache if known else UNKNOWN_CACHE_BYTES
    weights = _weight_bytes(layers)
    if weights <= cache:
        size = f"the last-level cache ({_mib(cache)})" if known else f"{_mib(cache)} (the CPU's cache size unknown)"
        return f"its linear weights ({_mib(weights)}) fit in {size}, where MKL's own kernels are faster"
    return None


def packed_path(model: torch.nn.Module, cache_bytes: int | None = None) -> str:
    """The decoding loop's start-up words for this path: that it runs, or why not."""
    refused = why_not_packed(model, cache_bytes)
    if refused is None:
        weights = _mib(_weight_bytes(linear_layers(model)))
        return f"linear weights ({weights}) reordered for oneDNN at each rollout"
    return f"MKL's matrix products as they are: {refused}"


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by oneDNN with the reordered weight (module docstring); under the
    autocast it was reordered for, in that dtype, as autocast computes it (input, weight and bias cast)."""
    cast = self._glassrl_autocast
    if x.numel() < MIN_ROWS * x.shape[-1] or torch.is_grad_enabled() or autocast_dtype("cpu") != cast:
        return F.linear(x, self.weight, self.bias)
    bias = self.bias if self.bias is None or cast is None else self.bias.to(cast)
    x = x.to(cast) if cast is not None else x
    return _onednn_linear(x.contiguous(), self._glassrl_packed, bias)


def _onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedWeights:
    """Reorders ``model``'s linear weights (:meth:`pack`) and routes their forward through them until
    :meth:`restore`; as a context manager, both. ``rows``: the batch the products are reordered for
    (oneDNN's hint; any row count runs). Call :meth:`pack` again after the weights change (a newer
    policy version loaded mid-rollout)."""

    def __init__(self, model: torch.nn.Module, rows: int) -> None:
        self.layers, self.rows = linear_layers(model), rows

    def pack(self) -> None:
        """Reorder the weights as they are now, in the dtype the CPU's autocast computes in when it is on
        (bfloat16: ``model.compute_dtype``), else their own; nothing under a float16 autocast."""
        cast = autocast_dtype("cpu")
        if cast is not None and cast != torch.bfloat16:
            return
        reordered: dict[int, torch.Tensor] = {}  # a tied weight reordered once
        for layer in self.layers:
            if id(layer.weight) not in reordered:
                weight = layer.weight.detach()
                weight = weight.to(cast) if cast is not None else weight
                reordered[id(layer.weight)] = torch.ops.mkldnn._reorder_linear_weight(weight, self.rows)
            layer._glassrl_packed, layer._glassrl_autocast = reordered[id(layer.weight)], cast
            layer.forward = types.MethodType(_packed_forward, layer)

    def restore(self) -> None:
        for layer in self.layers:
            vars(layer).pop("forward", None)
            vars(layer).pop("_glassrl_packed", None)
            vars(layer).pop("_glassrl_autocast", None)

    def __enter__(self) -> PackedWeights:
        self.pack()
        return self

    def __exit__(self, *exc) -> None:
        self.restore()
