"""The optimiser of every trainer (RL actor and critic, SFT, reward model): AdamW with its
parameter groups and learning-rate schedule (:class:`OptimConfig`), seeding, and the guard that
keeps NaN and ±inf out of the weights.

NaN and ±inf never reach the weights: checks of losses, gradient norms and parameters.

Every optimiser step of every trainer (RL actor and critic: glassrl.rl.update; SFT;
reward model) checks, before ``optimizer.step()``, its loss terms and the global gradient
norm (one device sync), and after it a float32 sum of every trainable parameter: a NaN or ±inf
makes any sum it enters non-finite, so a finite sum clears every weight at once without copying
them (a float64 sum, as this was, copies every weight: ~1 % of a CPU step of bench_vs_trl's large
model). A sum can also overflow with every weight finite; only then is each weight tested element
by element, and the step stops only when one really is non-finite.
The config key ``on_nonfinite`` chooses what a non-finite loss or gradient does:

    stop   NonFiniteError (a GlassrlError: one line, exit code 2), raised before the weights
           change: the last checkpoint is the last good state, and none holds a NaN;
    skip   that optimiser step is left out (gradients dropped, the schedule still advances)
           and counted in ``<prefix>/skipped_steps``.

Weights that turn non-finite after a step with finite gradients (a learning rate of 1e30)
stop the run under either policy: their previous values are gone, there is nothing to skip to.

Data-parallel ranks (glassrl.workers.data_parallel, bound by glassrl.rl.build_ray) make
the same checks on values summed over the ranks, so every rank skips or stops at the same step.

:func:`guarded_step` is that optimiser step, written once: the RL update (glassrl.rl.update.run_updates)
and the supervised loop (glassrl.supervised.loop) call it after their backward passes.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple

import numpy as np
import torch

from glassrl.config import at_least, fail, option
from glassrl.errors import GlassrlError


@dataclass
class OptimConfig:
    """The optimiser section of every trainer (RL actor and critic, SFT, reward model)."""

    lr: float = option(1e-5, help="peak learning rate of AdamW")
    warmup_steps: int = option(0, help="linear warm-up, in optimiser steps")
    warmup_ratio: float | None = option(
        None,
        help=(
            "warm-up as a fraction of all optimiser steps, ceil(ratio × total) (TRL's warmup_ratio); null = "
            "warmup_steps"
        ),
    )
    decay: Literal["cosine", "linear", "constant"] = option(
        "constant", help="after warm-up: cosine or linear (TRL's default) to 0 at the last optimiser step, or constant"
    )
    weight_decay: float = option(0.0, help="AdamW weight decay on matrices (not on norms and biases)")
    grad_clip: float | None = option(
        1.0, help="clip the global gradient norm to this; null = no clipping (the norm is still logged)"
    )
    kernel: Literal["auto", "fused", "single"] = option(
        "auto",
        help=(
            "AdamW's kernel: fused (torch's fused kernel, every tensor in one pass; refused where it cannot run), "
            "single (torch's one tensor at a time), or auto: fused on CUDA, and on CPU from 256 MiB of trainable "
            "parameters (below that the bundled models keep their figures to the last bit); the run's "
            "start-up line 'optimiser:' says which runs and why"
        ),
    )

    def check(self, prefix: str) -> None:
        """Ranges, naming keys ``{prefix}.lr`` etc.; GlassrlError."""
        if not self.lr > 0:
            fail(f"{prefix}.lr", self.lr, "must be > 0")
        at_least(0, {f"{prefix}.warmup_steps": self.warmup_steps, f"{prefix}.weight_decay": self.weight_decay})
        if self.warmup_ratio is not None:
            if not 0 <= self.warmup_ratio <= 1:
                fail(f"{prefix}.warmup_ratio", self.warmup_ratio, "must be in [0, 1] (or null)")
            if self.warmup_steps:
                fail(f"{prefix}.warmup_ratio", self.warmup_ratio, f"and {prefix}.warmup_steps both set; keep one")
        if self.grad_clip is not None and not self.grad_clip > 0:
            fail(f"{prefix}.grad_clip", self.grad_clip, "must be > 0 (or null)")
        if self.kernel not in KERNELS:
            fail(f"{prefix}.kernel", self.kernel, f"must be one of {', '.join(KERNELS)}")

    def warmup(self, total_steps: int) -> int:
        """Warm-up optimiser steps: ``warmup_steps``, or ceil(``warmup_ratio`` × ``total_steps``) as
        transformers' TrainingArguments.get_warmup_steps counts them."""
        return self.warmup_steps if self.warmup_ratio is None else math.ceil(self.warmup_ratio * total_steps)

    def rows(self, prefix: str = "") -> list[tuple[str, str, str]]:
        """(quantity, value, unit) rows of the resolved table; ``prefix`` names the model ("actor ")."""
        clip = "off" if self.grad_clip is None else f"{self.grad_clip:g}"
        warmup = f"{self.warmup_steps}" if self.warmup_ratio is None else f"{self.warmup_ratio:g} of the"
        schedule = f"peak; {warmup} warm-up optimiser steps, then {self.decay}"
        return [
            (f"{prefix}learning rate", f"{self.lr:g}", schedule),
            (f"{prefix}grad clip / weight decay", f"{clip} / {self.weight_decay:g}", "global norm / AdamW on matrices"),
            (f"{prefix}AdamW kernel", self.kernel, KERNEL_UNITS[self.kernel]),
        ]


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch, and ask torch for deterministic kernels.

    Same seed, same machine, same thread count -> bit-identical training.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    # Needed by cuBLAS for deterministic matmuls (PyTorch "Reproducibility" notes).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new uninitialised tensor with NaN, a check for code that
    # reads memory it never wrote: none here does (the KV cache, the largest, is written before it
    # is read), and the fills cost ~2.5 % of a CPU step of bench_vs_trl's large model (BENCHMARKS.md).
    torch.utils.deterministic.fill_uninitialized_memory = False


# kernel auto runs torch's fused AdamW on CPU from this many bytes of trainable parameters. Below it
# are the bundled models (default 4.15 MiB, agent and rg ~2.2 MiB, research, bench_vs_trl's large
# ~40 MB: float32), whose figures (README, demos, docs) are those of the one-tensor kernel: fused
# rounds the last bits differently, so they keep that kernel and their numbers to the last bit (a
# step is milliseconds there: 23 -> 7.5 ms on the large model). Above it the step matters:
# Qwen2.5-0.5B's 1.98 GB take 2.31 s one tensor at a time (each op allocates a full-size temporary,
# 1 GiB a step, a fresh mmap above glibc's 32 MiB heap limit) against 0.60 s fused, the 2-layer
# 0.5B-width test model's 0.66 GB 1.0-1.1 s against 0.21 s (one thread; BENCHMARKS.md, "fused AdamW
# on CPU", benchmarks/bench_adamw.py). 256 MiB sits between, a factor ~6 from each.
FUSED_ON_CPU_FROM = 256 * 2**20

KERNELS = ("auto", "fused", "single")
KERNEL_UNITS = {
    "auto": "fused on CUDA, and on CPU from 256 MiB of trainable parameters",
    "fused": "torch's fused kernel",
    "single": "one tensor at a time",
}


def _size(nbytes: int) -> str:
    """``16.6 KiB``, ``256 MiB``, ``1.84 GiB``: three digits."""
    for unit, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= unit:
            return f"{nbytes / unit:.3g} {name}"
    return f"{nbytes} bytes"


class Kernel(NamedTuple):
    fused: bool  # torch's fused AdamW; else torch's default (one tensor at a time on CPU) or, kernel single, that
    why: str  # the start-up line's account: which kernel, and why


def choose_kernel(params: list[torch.Tensor], kernel: str, key: str = "optim") -> Kernel:
    """The AdamW kernel ``kernel`` (OptimConfig.kernel) picks for ``params``, and why.

    torch's fused kernel runs on floating-point tensors of CPU or CUDA (torch.optim.optimizer.
    _device_dtype_check_for_fused, at the first step); glassrl fuses plain ``nn.Parameter``s only (an FSDP2
    DTensor shard is not one). ``fused`` where it cannot run is a GlassrlError naming ``{key}.kernel``.
    """
    if not params:
        return Kernel(False, "no trainable parameters")
    size = sum(p.numel() * p.element_size() for p in params)
    blocked = sorted(
        {
            f"{type(p).__name__} ({p.dtype}, {p.device.type})"
            for p in params
            if type(p) is not torch.nn.Parameter or p.device.type not in ("cpu", "cuda") or not p.is_floating_point()
        }
    )
    needs = "the fused kernel needs plain floating-point parameters on CPU or CUDA, these are also " + ", ".join(
        blocked
    )
    if kernel == "single":
        return Kernel(False, f"one tensor at a time ({key}.kernel single)")
    if kernel == "fused":
        if blocked:
            fail(f"{key}.kernel", kernel, f"{needs}; use auto or single")
        return Kernel(True, f"fused kernel ({key}.kernel fused)")
    if any(p.is_cuda for p in params):
        if blocked:
            return Kernel(False, f"torch's default kernel; {needs}")
        return Kernel(True, "fused kernel (CUDA)")
    if size < FUSED_ON_CPU_FROM:
        below = f"{_size(size)} of trainable parameters < {_size(FUSED_ON_CPU_FROM)}"
        auto = f"from which {key}.kernel auto fuses"
        return Kernel(False, f"one tensor at a time (torch's default on CPU: {below}, {auto})")
    if blocked:
        return Kernel(False, f"one tensor at a time (torch's default on CPU); {needs}")
    return Kernel(True, f"fused kernel (CPU: {_size(size)} of trainable parameters >= {_size(FUSED_ON_CPU_FROM)})")


def make_optimizer(
    model: torch.nn.Module, optim: OptimConfig, total_steps: int, key: str = "optim"
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (Loshchilov & Hutter 2019) as ``optim`` says, with its learning-rate schedule
    (:func:`lr_lambda`: linear warm-up, then ``optim.decay``) over ``total_steps`` optimiser steps.

    Weight decay applies to matrices only, not to norms and biases (1-D tensors), as in
    GPT-2/nanoGPT. The kernel is ``optim.kernel``'s (:func:`choose_kernel`; ``key`` names the section in
    its error, "actor_optim"). Call ``scheduler.step()`` after each ``optimizer.step()``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    # fused: every tensor in one pass (transformers' default optimiser, "adamw_torch_fused", on CUDA and,
    # since torch 2.8, on CPU); otherwise torch's default, one tensor at a time on CPU (foreach measured
    # slower there: BENCHMARKS.md), and kernel single keeps that on CUDA too (foreach off).
    fused = choose_kernel(params, optim.kernel, key).fused
    foreach = False if optim.kernel == "single" else None
    optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=(0.9, 0.95), fused=fused or None, foreach=foreach)
    schedule = lr_lambda(optim.decay, optim.warmup(total_steps), total_steps)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def optimizer_path(optimizer: torch.optim.Optimizer, optim: OptimConfig, key: str = "optim") -> str:
    """Which AdamW kernel :func:`make_optimizer`'s ``optimizer`` (built from ``optim``) runs, and why, for
    the start-up line ``optimiser: ...``."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    kernel = choose_kernel(params, optim.kernel, key)
    assert kernel.fused == bool(optimizer.defaults.get("fused")), "optimizer not built by make_optimizer from optim"
    return f"AdamW, {kernel.why}"


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the peak learning rate at optimiser step ``step`` (0-based), decay "cosine".

    Linear warmup over ``warmup_steps`` (Goyal et al. 2017, §2.2), then half a cosine
    down to 0 at ``total_steps`` (Loshchilov & Hutter 2017, SGDR, eq. 5 without restarts).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def constant_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Decay "constant": linear warm-up (Goyal et al. 2017, §2.2), then the peak rate."""
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0


def linear_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Decay "linear": linear warm-up, then a straight line down to 0 at ``total_steps``
    (transformers' get_linear_schedule_with_warmup, TRL's default, after the warm-up)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


# OptimConfig.decay -> multiplier of the peak rate at (step, warmup_steps, total_steps)
LR_SCHEDULES: dict[str, Callable[[int, int, int], float]] = {
    "cosine": lr_factor,
    "linear": linear_factor,
    "constant": constant_factor,
}


def lr_lambda(decay: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The multiplier of the peak learning rate at optimiser step s (0-based), for LambdaLR.

    A partial of a module-level function, not a closure: a remote worker can receive it pickled.
    """
    return partial(_schedule_at, decay, warmup_steps, total_steps)


def _schedule_at(decay: str, warmup_steps: int, total_steps: int, step: int) -> float:
    return LR_SCHEDULES[decay](step, warmup_steps, total_steps)


# ---------------------------------------------------------------- the non-finite guard

POLICIES = ("stop", "skip")


class NonFiniteError(GlassrlError):
    """A loss, gradient norm or weight is NaN or ±inf; the message names it and where."""


def nonfinite(named: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """The scalars of ``named`` that are NaN or ±inf, by name (one device sync for all)."""
    if not named:
        return {}
    values = torch.stack([torch.as_tensor(v).detach().double().cpu().reshape(()) for v in named.values()]).tolist()
    return {name: value for name, value in zip(named, values) if not math.isfinite(value)}


def describe(bad: dict[str, float]) -> str:
    """``actor/policy_loss = nan, actor/grad_norm = inf``."""
    return ", ".join(f"{name} = {value}" for name, value in bad.items())


def params_sum(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """0-d float32 sum of every element of ``params`` (no sync, no copy of a float32 weight):
    non-finite when an element is; possibly non-finite by overflow when none is."""
    sums = [p.detach().sum(dtype=torch.float32) for p in params]
    return torch.stack(sums).sum() if sums else torch.zeros((), dtype=torch.float32)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's elements of a shard (an FSDP2 DTensor); any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def check_weights(
    model: torch.nn.Module,
    params: list[torch.Tensor],
    where: str,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """NonFiniteError naming the first non-finite trainable weight of ``model`` when there is one.

    ``reduce`` (data parallelism: the sum over ranks, glassrl.workers.data_parallel.all_reduce_sum)
    makes the test global, so every rank raises or none does; a shard is tested by its own elements.
    """
    total = params_sum(_local(p) for p in params)
    if math.isfinite((total if reduce is None else reduce(total)).item()):
        return
    # The sum is NaN or ±inf: a weight is, or finite weights overflowed float32. Decide exactly.
    name = next(
        (n for n, p in model.named_parameters() if p.requires_grad and not bool(torch.isfinite(_local(p)).all())),
        None,
    )
    if reduce is not None:
        if reduce(total.new_tensor(float(name is not None))).item() == 0:
            return
        name = name or "a weight of another rank's shard"
    elif name is None:
        return
    raise NonFiniteError(
        f"{where}: weight {name} is non-finite after the optimiser step (finite gradients, so the step "
        "itself overflowed: lower the learning rate)"
    )


def on_bad_step(policy: str, bad: dict[str, float], where: str) -> None:
    """Under ``stop`` raise NonFiniteError for the non-finite values ``bad``; under ``skip`` return
    (the caller drops the step)."""
    if policy not in POLICIES:
        raise ValueError(f"on_nonfinite must be one of {POLICIES}, got {policy!r}")
    if policy == "stop":
        raise NonFiniteError(
            f"{where}: {describe(bad)}; the weights were not changed (on_nonfinite=stop; "
            "on_nonfinite=skip drops such steps instead)"
        )


class Step(NamedTuple):
    taken: bool  # False: dropped as non-finite (on_nonfinite = skip)
    values: dict[str, torch.Tensor]  # the values checked (over every rank), the gradient norm among them


def guarded_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    values: dict[str, torch.Tensor],
    *,
    max_norm: float | None,
    norm_key: str,
    policy: str,
    where: Callable[[str], str],
    also: dict[str, torch.Tensor] | None = None,
    combine: Callable[[dict[str, torch.Tensor], str], tuple[dict[str, torch.Tensor], str]] | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Step:
    """The optimiser step after the backward passes, guarded (module docstring).

    The gradients are clipped to ``max_norm`` (None: no limit, the norm still computed: clip at +inf is a no-op),
    the global norm before clipping (Pascanu et al. 2013) joining ``values`` (the step's loss terms) as
    ``norm_key``, then ``also`` (PPO-ptx's loss). ``combine`` (data parallelism: glassrl.rl.ranks.Ranks.combine)
    sums them over the ranks and names the ranks whose own share is not finite. A non-finite value raises
    NonFiniteError (``policy`` stop) or drops the step (skip: the gradients cleared); otherwise the optimiser steps
    and the weights are checked (``reduce``: over the ranks). The schedule advances either way: a skipped step is a
    step not taken. ``where(on)``: the step named in a message, ``on`` the ranks named by ``combine`` ("" in one
    process)."""
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else math.inf)
    values = {**values, norm_key: norm, **(also or {})}
    checked, on = combine(values, norm_key) if combine is not None else (values, "")
    if bad := nonfinite(checked):
        on_bad_step(policy, bad, where(on))
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        return Step(False, checked)
    optimizer.step()
    # Freed now, not at the next backward: the rollout between holds no gradient (at 0.5 B, 1.98 GB; the
    # decoding loop's reordered weights take that room, glassrl.rollout.packed_weights).
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    check_weights(model, params, where(""), reduce=reduce)
    return Step(True, checked)
