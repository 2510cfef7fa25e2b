"""Data parallelism inside a role: N ranks of one torch.distributed group train one model.

Shapes: B responses, T response width, W ranks (the group's world size). Batches
are the dicts of glassrl.workers.base.

Each rank holds a replica (DDP, CPU or GPU) or a shard (FSDP2, GPU only) of the
model. The driver stays the single controller: it splits every batch by rows
(glassrl.workers.sharding) and each rank runs :func:`run_dp_updates`
on its part. What must be global is global across ranks:

- token-mean normalisation: each aggregate is weighted by its micro-batch's share
  of the *global* mini-batch units (valid tokens for "token-mean", non-empty rows
  for the sequence modes), the unit totals summed over ranks first, so the summed
  gradient equals the one of the whole mini-batch in one pass (as
  glassrl.rl.update.run_updates does across micro-batches);
- gradients: DDP / FSDP2 average them over ranks; the loss is multiplied by W so
  that the average is the sum of the ranks' shares;
- metrics: term values, KL/entropy/clip diagnostics and their counts are summed
  over ranks before they are divided (one all-reduce per update);
- whitening: :func:`all_reduce_sum` is the ``reduce`` hook of glassrl.algos.masked.

Mini-batches are split by tokens, not rows only (glassrl.workers.sharding).

Mixed precision: DDP runs forward passes under autocast (glassrl.models.precision)
with float32 master weights; FSDP2 keeps float32 sharded parameters and
all-gathers them in bfloat16, reducing gradients in float32 (MixedPrecisionPolicy,
PyTorch FSDP2 ``fully_shard``).

Checkpoints: :func:`save_sharded` / :func:`load_sharded` write and read the
trainable weights, optimiser and schedule with torch.distributed.checkpoint (DCP):
every rank writes its own part, and a later run may load it with another world size.
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from glassrl.algos.aggregation import aggregate
from glassrl.algos.masked import masked_sum
from glassrl.models.precision import compute_dtype, compute_precision
from glassrl.workers.base import Batch

Forward = dict[str, torch.Tensor]  # outputs of one forward pass: "logprobs", "entropy", "values"


@dataclass(frozen=True)
class DistContext:
    """Where a rank stands: its role's group (the default process group of its process)."""

    role: str
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port free on this machine now (for rank 0's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_group(role: str, rank: int, world_size: int, address: str, port: int, device: str = "cpu") -> DistContext:
    """Join the group of ``role``: gloo on CPU, NCCL on GPU; rank 0 listens on ``address:port``."""
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world_size)
    return DistContext(role, rank, world_size, dev)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the ranks of the default group (in place); the ``reduce`` hook of glassrl.algos.masked."""
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


# ---------------------------------------------------------------- the replica


class _Replica(nn.Module):
    """The module DDP / FSDP2 wrap: its forward runs a glassrl forward function on the model,
    so the wrapper's hooks (gradient sync, all-gather of shards) see every pass."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[[nn.Module, Batch], Forward], micro: Batch) -> Forward:
        return fn(self.model, micro)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    # Hugging Face names its transformer blocks *DecoderLayer (LlamaDecoderLayer, Qwen2DecoderLayer, ...).
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


class DataParallelModel:
    """One rank's replica (DDP) or shard (FSDP2) of ``model``.

    ``module`` is the model itself (what glassrl.models reads); ``wrapped`` the DDP or
    FSDP2 module through which training forward passes go; ``dtype`` the compute dtype
    (bfloat16: autocast under DDP, the MixedPrecisionPolicy under FSDP2; weights stay float32).
    """

    def __init__(self, model: nn.Module, ctx: DistContext, *, fsdp: bool = False, compute: str = "float32") -> None:
        self.module, self.ctx, self.fsdp, self.dtype = model, ctx, fsdp, compute_dtype(compute)
        replica = _Replica(model)
        if fsdp:
            self.wrapped = _fully_shard(replica, model, self.dtype)
        else:
            # Buffers (rotary frequencies) are constants: no broadcast, so ranks may run
            # different numbers of forward passes. Unused parameters (an untied LM head
            # under a value head) have no gradient on any rank.
            self.wrapped = nn.parallel.DistributedDataParallel(
                replica, broadcast_buffers=False, find_unused_parameters=True
            )

    def __call__(self, fn: Callable[[nn.Module, Batch], Forward], micro: Batch) -> Forward:
        if self.fsdp:  # the policy casts parameters; autocast would cast twice
            return self.wrapped(fn, micro)
        with compute_precision(self.ctx.device, self.dtype):
            return self.wrapped(fn, micro)

    @contextlib.contextmanager
    def gradient_sync(self, on: bool) -> Iterator[None]:
        """Gradients are reduced over ranks in this backward only when ``on`` (the last micro-batch)."""
        if self.fsdp:
            self.wrapped.set_requires_gradient_sync(on)
            yield
        elif on:
            yield
        else:
            with self.wrapped.no_sync():
                yield

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.wrapped.parameters() if p.requires_grad]


def _fully_shard(replica: _Replica, model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """FSDP2: each decoder layer one unit, the rest (embeddings, head) the root unit (GPU only)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in _decoder_layers(model):
        fully_shard(layer, mp_policy=policy)
    return fully_shard(replica, mp_policy=policy)


# ---------------------------------------------------------------- the update


def _units(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """What ``mode`` averages over: valid tokens (token-mean) or non-empty rows (sequence modes)."""
    return mask.sum() if mode == "token-mean" else mask.any(-1).sum()


def _max_over_ranks(n: int, device: torch.device) -> int:
    t = torch.tensor([n], device=device)  # NCCL reduces GPU tensors only
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def _over_ranks(ctx: DistContext, mine: torch.Tensor) -> torch.Tensor:
    """(W, n) float64 on the CPU: row r is rank r's ``mine`` (n,).

    One all-reduce of a table whose row r only rank r fills: every entry has one non-zero
    addend, so the sum is exact and every rank reads the same table, and decides alike.
    """
    table = torch.zeros(ctx.world_size, mine.numel(), dtype=torch.float64, device=ctx.device)
    table[ctx.rank] = mine.double()
    return all_reduce_sum(table).cpu()


def run_dp_updates(
    dp: DataParallelModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: Batch,
    plan: list[torch.Tensor],
    *,
    micro_batch: int,
    grad_clip: float | None,
    forward: Callable[[nn.Module, Batch], Forward],
    terms: Sequence[Any],
    prefix: str,
    diagnostics: dict[str, str],
    on_bad_step: Callable[[dict[str, float], str], None],
    check_weights: Callable[..., None],
) -> dict[str, float]:
    """This rank's part of one optimiser step per mini-batch; every rank returns the same metrics.

    ``batch`` and ``plan`` are this rank's part (glassrl.workers.sharding.shard_plan): ``plan[k]`` its rows
    of mini-batch k. ``terms`` are glassrl.rl.update.Term (name, coef, mode,
    norm_length, mask, per_token); ``diagnostics`` maps diagnostic keys to metric names.
    The metrics are those of run_updates, computed over all ranks: each term's global
    mini-batch aggregate averaged over optimiser steps, each diagnostic's masked mean
    per micro-batch averaged over every rank's micro-batches with valid tokens,
    ``{prefix}/grad_norm`` (of the summed gradient) and ``{prefix}/lr``.

    Non-finite checks, as run_updates makes them, on global values: before each optimiser step
    every term's global value and the gradient norm; a NaN or ±inf one goes to ``on_bad_step(bad,
    where)`` (glassrl.optim.on_bad_step bound to the policy), which raises to stop the
    run or returns to skip the step, counted in ``{prefix}/skipped_steps``; ``where`` names the
    ranks whose own share is non-finite. After the step, ``check_weights(model, params, where,
    reduce=all_reduce_sum)`` (glassrl.optim.check_weights). Every rank reads the same
    summed values, so all skip or stop together: none waits alone in a collective.
    """
    W = dp.ctx.world_size
    params = dp.parameters()
    device = dp.ctx.device
    names = [t.name for t in terms]
    sums: dict[str, torch.Tensor] = {}  # diagnostics of the steps taken
    counts: dict[str, torch.Tensor] = {}
    step_sums: dict[str, float] = {}  # global values of the steps taken: terms and grad norm
    skipped = 0
    dp.wrapped.train()
    for n, index in enumerate(plan, 1):
        micros = [{k: v[part.to(v.device)] for k, v in batch.items()} for part in index.split(micro_batch)]
        local = torch.stack(
            [
                sum((_units(t.mask(m), t.mode) for m in micros), torch.zeros((), dtype=torch.long, device=device))
                for t in terms
            ]
        )
        totals = all_reduce_sum(local.double()).clamp(min=1)  # (terms,) units of the global mini-batch
        # FSDP2 all-gathers shards in every forward: every rank must run as many passes.
        n_passes = _max_over_ranks(len(micros), dp.ctx.device) if dp.fsdp else len(micros)
        shares = torch.zeros(len(terms), dtype=torch.float64, device=device)  # (terms,) this rank's part of each
        step_diagnostics = []  # (name, micro mean, count), kept when the step is taken
        optimizer.zero_grad(set_to_none=True)
        for j in range(n_passes):
            micro = micros[min(j, len(micros) - 1)]
            weight = 1.0 if j < len(micros) else 0.0  # a padding pass adds nothing
            with dp.gradient_sync(j == n_passes - 1):
                out = dp(forward, micro)
                loss = torch.zeros((), device=device)
                for i, term in enumerate(terms):
                    mask = term.mask(micro)
                    per_token, diags = term.per_token(out, micro)
                    value = (
                        weight
                        * _units(mask, term.mode)
                        / totals[i]
                        * aggregate(per_token, mask, term.mode, term.norm_length)
                    )
                    loss = loss + term.coef * value
                    shares[i] += value.detach().double()
                    tokens = mask.sum()
                    for key in sorted(diags):
                        if key in diagnostics and weight:
                            micro_mean = masked_sum(diags[key].double(), mask) / tokens.clamp(min=1)
                            step_diagnostics.append((f"{prefix}/{diagnostics[key]}", micro_mean, (tokens > 0).double()))
                # DDP and FSDP2 average gradients over ranks; the global loss is their sum.
                (loss * W).backward()
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip is not None else math.inf)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        # The step's global values: each term (the ranks' shares summed) and the norm of the summed gradient.
        table = _over_ranks(dp.ctx, torch.cat([shares, norm.detach().double().reshape(1)]))  # (W, terms + 1)
        values = dict(zip(names, table[:, :-1].sum(0).tolist())) | {f"{prefix}/grad_norm": table[0, -1].item()}
        where = f"{prefix} update, optimiser step {n} of {len(plan)}"
        if bad := {name: value for name, value in values.items() if not math.isfinite(value)}:
            # The ranks whose own share is non-finite; for the gradient norm alone, all (it is of their sum).
            ranks = [r for r in range(W) if not bool(torch.isfinite(table[r, :-1]).all())] or range(W)
            on = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} of {W}"
            on_bad_step(bad, f"{prefix} update on {on}, optimiser step {n} of {len(plan)}")
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()  # the schedule keeps its length: a skipped step is a step not taken
            skipped += 1
            continue
        optimizer.step()
        scheduler.step()
        check_weights(dp.module, params, where, reduce=all_reduce_sum)
        for name, value in values.items():
            step_sums[name] = step_sums.get(name, 0.0) + value
        for name, micro_mean, count in step_diagnostics:
            sums[name] = sums.get(name, 0.0) + micro_mean.detach()
            counts[name] = counts.get(name, 0.0) + count
    taken = len(plan) - skipped
    metrics = {name: total / taken for name, total in step_sums.items()}
    # One all-reduce for every diagnostic (the steps taken are the same on every rank, so are the keys).
    keys = sorted(sums)
    if keys:
        packed = torch.stack(
            [torch.as_tensor(sums[k], dtype=torch.float64, device=device) for k in keys]
            + [torch.as_tensor(counts[k], dtype=torch.float64, device=device) for k in keys]
        )  # on the device: sums of GPU tensors and Python counts side by side
        summed = all_reduce_sum(packed).cpu()
        for i, key in enumerate(keys):
            if summed[len(keys) + i] > 0:
                metrics[key] = float(summed[i]) / float(summed[len(keys) + i])
    metrics[f"{prefix}/lr"] = scheduler.get_last_lr()[0]
    if skipped:
        metrics[f"{prefix}/skipped_steps"] = skipped
    return metrics


def forward_no_grad(
    dp: DataParallelModel, fn: Callable[[nn.Module, Batch], Forward], batch: Batch, micro_batch: int
) -> Forward:
    """``fn`` over this rank's rows in micro-batches, without gradient; outputs concatenated (B, ...)."""
    micros = [
        {k: v[s : s + micro_batch] for k, v in batch.items()}
        for s in range(0, batch["input_ids"].shape[0], micro_batch)
    ]
    n_passes = _max_over_ranks(len(micros), dp.ctx.device) if dp.fsdp else len(micros)
    outs = []
    dp.wrapped.eval()
    with torch.no_grad():
        for j in range(n_passes):
            out = dp(fn, micros[min(j, len(micros) - 1)])
            if j < len(micros):  # FSDP2 padding passes are dropped
                outs.append(out)
    if dp.fsdp:  # the root unit stays gathered after a forward (no backward comes to reshard it); an
        # update would read its parameters (gathered, later freed) instead of the shards the optimiser holds
        dp.wrapped.reshard()
    return {key: torch.cat([o[key] for o in outs]) for key in outs[0]}


# ---------------------------------------------------------------- sharded checkpoints (DCP)


def _dcp_state(dp: DataParallelModel, optimizer: torch.optim.Optimizer, scheduler) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    # Frozen weights (a LoRA base) come back from their own checkpoint, not from here.
    model, optim = get_state_dict(dp.wrapped, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    return {"model": model, "optim": optim, "scheduler": scheduler.state_dict()}


def save_sharded(dp: DataParallelModel, optimizer: torch.optim.Optimizer, scheduler, path: str | Path) -> None:
    """Trainable weights, optimiser and schedule of every rank into directory ``path`` (collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_dcp_state(dp, optimizer, scheduler), checkpoint_id=str(path))


def load_sharded(dp: DataParallelModel, optimizer: torch.optim.Optimizer, scheduler, path: str | Path) -> None:
    """Inverse of :func:`save_sharded`, in place; the saving world size may differ (collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = _dcp_state(dp, optimizer, scheduler)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        dp.wrapped,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=StateDictOptions(ignore_frozen_params=True),
    )
    scheduler.load_state_dict(state["scheduler"])


# ---------------------------------------------------------------- one rank of a role


class DataParallelTrainee:
    """One rank of a trained role (actor or critic): its model, optimiser and schedule.

    Bound by the trainer, as for the in-process workers: ``update(dp, optimizer,
    scheduler, batch, plan)`` is :func:`run_dp_updates` with the role's loss, and
    ``forward(model, micro)`` the role's forward pass (glassrl.rl.update.actor_forward
    with entropy, or critic_forward). Inputs are this rank's part of the driver's batch
    (glassrl.workers.sharding).
    """

    def __init__(
        self, dp: DataParallelModel, tokenizer, optimizer, scheduler, *, micro_batch: int, update, forward
    ) -> None:
        self.dp, self.tokenizer = dp, tokenizer
        self.optimizer, self.scheduler = optimizer, scheduler
        self.micro_batch, self._update, self._forward = micro_batch, update, forward

    def _to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.dp.ctx.device) for k, v in batch.items()}

    def update(self, batch: Batch, plan: list[torch.Tensor]) -> dict[str, float]:
        return self._update(self.dp, self.optimizer, self.scheduler, self._to_device(batch), plan)

    def save_pretrained(self, path: str | Path) -> None:
        """The model (LoRA: its adapters) and tokenizer in Hugging Face format, written by rank 0 (collective)."""
        if self.dp.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            full = get_model_state_dict(self.dp.wrapped, options=options)
            if self.dp.ctx.is_main:
                self.dp.module.save_pretrained(path, state_dict={k.removeprefix("model."): v for k, v in full.items()})
        elif self.dp.ctx.is_main:
            self.dp.module.save_pretrained(path)
        if self.dp.ctx.is_main and self.tokenizer is not None:
            self.tokenizer.save_pretrained(path)
        dist.barrier()

    def save_sharded(self, path: str | Path) -> None:
        save_sharded(self.dp, self.optimizer, self.scheduler, path)

    def load_sharded(self, path: str | Path) -> None:
        load_sharded(self.dp, self.optimizer, self.scheduler, path)


class DataParallelActor(DataParallelTrainee):
    """A rank of π_θ: log-probs and entropy of its rows (``forward`` with entropy), its part of the updates."""

    def compute_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        out = forward_no_grad(self.dp, self._forward, self._to_device(batch), self.micro_batch)
        return out["logprobs"], out["entropy"]  # (B, T) each


class DataParallelCritic(DataParallelTrainee):
    """A rank of V: values of its rows, its part of the updates."""

    def compute_values(self, batch: Batch) -> torch.Tensor:
        return forward_no_grad(self.dp, self._forward, self._to_device(batch), self.micro_batch)["values"]  # (B, T)
