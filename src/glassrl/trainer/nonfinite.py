"""NaN and ±inf never reach the weights: checks of losses, gradient norms and parameters.

Every optimiser step of every trainer (RL actor and critic: glassrl.trainer.update; SFT;
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

Data-parallel ranks (glassrl.workers.data_parallel, bound by glassrl.trainer.build_ray) make
the same checks on values summed over the ranks, so every rank skips or stops at the same step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from glassrl.errors import GlassrlError

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
