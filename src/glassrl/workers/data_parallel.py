"""Data parallelism inside a role: N ranks of one torch.distributed group train one model.

Shapes: B responses, T response width, W ranks (the group's world size). Batches
are the dicts of glassrl.workers.base.

Each rank holds a replica (DDP, CPU or GPU) or a shard (FSDP2, GPU only) of the
model. The driver stays the single controller: it splits every batch by rows, balancing
tokens (glassrl.workers.sharding), and each rank runs the one update loop,
glassrl.rl.update.run_updates, on its part; this module holds only what that loop asks of
the ranks (:class:`DataParallelModel`, its ``Ranks``: in one process every one is the
identity) and the DDP / FSDP2 wrapping. What must be global is global across ranks:

- token-mean normalisation: each aggregate is weighted by its micro-batch's share
  of the *global* mini-batch units (valid tokens for "token-mean", non-empty rows
  for the sequence modes): the loop sums the unit totals over the ranks first
  (``sum``), so the summed gradient equals the one of the whole mini-batch in one pass;
- gradients: DDP / FSDP2 average them over ranks (reduced in the step's last pass only,
  ``gradient_sync``); the loop multiplies the loss by W so that the average is the sum of
  the ranks' shares;
- the non-finite decision and the metrics: each optimiser step's term values are summed over
  the ranks before they are checked (``combine``), so every rank skips or stops alike;
  KL/entropy/clip diagnostics and their counts are summed over ranks before they are divided
  (one all-reduce per update);
- FSDP2 all-gathers shards in every forward: every rank runs as many passes (``passes``);
- whitening: :func:`all_reduce_sum` is the ``reduce`` hook of glassrl.algos.masked.

One update, followed from the trainer: Trainer.step (glassrl.rl.loop, phase 6: Trainer._update)
calls ``workers.actor.update(batch, plan)``; on the Ray backend that is glassrl.workers.ray.RayActor,
which splits the batch and plan (and PPO-ptx's pairs) over the ranks and calls each rank's
:class:`DataParallelActor` ``update``; that calls the loop glassrl.rl.build_ray bound for it
(run_updates with the role's loss and ``ranks`` this rank's :class:`DataParallelModel`), which
runs the forward and backward passes through the wrapper and steps this rank's optimiser.

Mixed precision: under DDP the forward functions carry their autocast (glassrl.models.precision,
bound by glassrl.rl.build_ray) over float32 master weights, as in one process; FSDP2 keeps
float32 sharded parameters and all-gathers them in bfloat16, reducing gradients in float32
(MixedPrecisionPolicy, PyTorch FSDP2 ``fully_shard``).

Checkpoints: :func:`save_sharded` / :func:`load_sharded` write and read the
trainable weights, optimiser and schedule with torch.distributed.checkpoint (DCP) as safetensors
and JSON, nothing pickled (glassrl.run.sharded): every rank writes its own part, and a later run
may load it with another world size.
"""

from __future__ import annotations

import contextlib
import socket
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from glassrl.models.precision import compute_dtype
from glassrl.run import sharded
from glassrl.workers.base import Batch
from glassrl.workers.local import no_grad_passes

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


def _max_over_ranks(n: int, device: torch.device) -> int:
    t = torch.tensor([n], device=device)  # NCCL reduces GPU tensors only
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: an FSDP2 DTensor (the gradient norm of shards) gathered."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# ---------------------------------------------------------------- the replica: the ranks of the update loop


class _Replica(nn.Module):
    """The module DDP / FSDP2 wrap: its forward runs a glassrl forward function on the model,
    so the wrapper's hooks (gradient sync, all-gather of shards) see every pass."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[[nn.Module, Batch], Any], micro: Batch) -> Any:
        return fn(self.model, micro)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    # Hugging Face names its transformer blocks *DecoderLayer (LlamaDecoderLayer, Qwen2DecoderLayer, ...).
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


class DataParallelModel:
    """One rank's replica (DDP) or shard (FSDP2) of ``model``: the ranks of the update loop
    (glassrl.rl.ranks.Ranks; in one process, glassrl.rl.ranks.OneProcess).

    ``module`` is the model itself (what glassrl.models reads, and the optimiser's parameters);
    ``wrapped`` the DDP or FSDP2 module through which training forward passes go; ``dtype`` the
    compute dtype of FSDP2's MixedPrecisionPolicy (bfloat16: parameters gathered in bf16, float32
    shards). Under DDP a forward function carries its own autocast (glassrl.models.precision.Autocast,
    bound by glassrl.rl.build_ray), as in one process.
    """

    def __init__(self, model: nn.Module, ctx: DistContext, *, fsdp: bool = False, compute: str = "float32") -> None:
        self.module, self.ctx, self.fsdp, self.dtype = model, ctx, fsdp, compute_dtype(compute)
        self.world_size = ctx.world_size
        replica = _Replica(model)
        if fsdp:
            self.wrapped = _fully_shard(replica, model, self.dtype)
        else:
            # Buffers (rotary frequencies) are constants: no broadcast, so ranks may run
            # different numbers of forward passes. Unused parameters (an untied LM head
            # under a value head) have no gradient on any rank.
            # torch 2.13 deprecates broadcast_buffers, yet tells those who need no sync at init
            # (as here) to keep it: its FutureWarning is not the user's to read.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
                self.wrapped = nn.parallel.DistributedDataParallel(
                    replica, broadcast_buffers=False, find_unused_parameters=True
                )

    def forward(self, fn: Callable[[nn.Module, Batch], Any], micro: Batch) -> Any:
        """``fn(model, micro)`` through the wrapper, whose hooks (gradient reduction, the gathering
        of shards) see the pass."""
        return self.wrapped(fn, micro)

    @contextlib.contextmanager
    def gradient_sync(self, on: bool) -> Iterator[None]:
        """Gradients are reduced over ranks in this backward only when ``on`` (the step's last pass)."""
        if self.fsdp:
            self.wrapped.set_requires_gradient_sync(on)
            yield
        elif on:
            yield
        else:
            with self.wrapped.no_sync():
                yield

    def passes(self, n: int) -> int:
        """FSDP2 all-gathers shards in every forward: every rank runs as many passes as the busiest."""
        return _max_over_ranks(n, self.ctx.device) if self.fsdp else n

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks (on the rank's device for the reduction: NCCL reduces GPU tensors only)."""
        return all_reduce_sum(t.to(self.ctx.device)).to(t.device)

    def combine(self, values: dict[str, torch.Tensor], alike: str) -> tuple[dict[str, torch.Tensor], str]:
        """The step's values: the ranks' shares summed, ``alike`` (the norm of the summed gradient) rank 0's.

        One all-reduce of a (W, n) table whose row r only rank r fills: every entry has one
        non-zero addend, so every rank reads the same table exactly, and decides alike.
        """
        names = list(values)
        mine = torch.stack([_whole(values[n]).detach().double().reshape(()) for n in names])  # (n,)
        table = torch.zeros(self.world_size, len(names), dtype=torch.float64, device=self.ctx.device)
        table[self.ctx.rank] = mine.to(self.ctx.device)
        table = all_reduce_sum(table).cpu()  # (W, n)
        summed = table.sum(0)
        combined = {n: table[0, i] if n == alike else summed[i] for i, n in enumerate(names)}
        shares = torch.tensor([n != alike for n in names])
        # The ranks whose own share is non-finite; for the gradient norm alone, all (it is of their sum).
        ranks = [r for r in range(self.world_size) if not bool(torch.isfinite(table[r, shares]).all())]
        ranks = ranks or list(range(self.world_size))
        return combined, f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} of {self.world_size}"


def _fully_shard(replica: _Replica, model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """FSDP2: each decoder layer one unit, the rest (embeddings, head) the root unit (GPU only)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in _decoder_layers(model):
        fully_shard(layer, mp_policy=policy)
    return fully_shard(replica, mp_policy=policy)


def forward_no_grad(
    dp: DataParallelModel, fn: Callable[[nn.Module, Batch], Forward], batch: Batch, micro_batch: int
) -> Forward:
    """``fn`` over this rank's rows in micro-batches, without gradient (glassrl.workers.local.no_grad_passes,
    as many passes as the busiest rank under FSDP2); outputs concatenated (B, ...)."""
    dp.wrapped.eval()
    out = no_grad_passes(partial(dp.forward, fn), batch, micro_batch, passes=dp.passes)
    if dp.fsdp:  # the root unit stays gathered after a forward (no backward comes to reshard it); an
        # update would read its parameters (gathered, later freed) instead of the shards the optimiser holds
        dp.wrapped.reshard()
    return out


# ---------------------------------------------------------------- sharded checkpoints (DCP)


def _dcp_state(dp: DataParallelModel, optimizer: torch.optim.Optimizer, scheduler) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    # Frozen weights (a LoRA base) come back from their own checkpoint, not from here.
    model, optim = get_state_dict(dp.wrapped, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    return {"model": model, "optim": optim, "scheduler": scheduler.state_dict()}


def save_sharded(dp: DataParallelModel, optimizer: torch.optim.Optimizer, scheduler, path: str | Path) -> None:
    """Trainable weights, optimiser and schedule of every rank into directory ``path``, nothing pickled
    (glassrl.run.sharded; collective)."""
    sharded.save(_dcp_state(dp, optimizer, scheduler), path, main=dp.ctx.is_main)


def load_sharded(dp: DataParallelModel, optimizer: torch.optim.Optimizer, scheduler, path: str | Path) -> None:
    """Inverse of :func:`save_sharded`, in place; the saving world size may differ (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = sharded.load(_dcp_state(dp, optimizer, scheduler), path)
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

    Bound by the trainer's build (glassrl.rl.build_ray), as for the in-process workers:
    ``update(model, optimizer, scheduler, batch, plan, ptx_pairs=None)`` is the one update loop,
    glassrl.rl.update.run_updates, with the role's loss and this rank's ``dp`` as its ranks; and
    ``forward(model, micro)`` the role's forward pass (glassrl.rl.loss.actor_forward with entropy,
    or critic_forward). Inputs are this rank's part of the driver's batch (glassrl.workers.sharding)
    and, for PPO-ptx, of each optimiser step's supervised pairs (glassrl.workers.ray.RayActor).
    """

    def __init__(
        self, dp: DataParallelModel, tokenizer, optimizer, scheduler, *, micro_batch: int, update, forward
    ) -> None:
        self.dp, self.tokenizer = dp, tokenizer
        self.optimizer, self.scheduler = optimizer, scheduler
        self.micro_batch, self._update, self._forward = micro_batch, update, forward

    def _to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.dp.ctx.device) for k, v in batch.items()}

    def update(self, batch: Batch, plan: list[torch.Tensor], ptx_pairs: list | None = None) -> dict[str, float]:
        batch = self._to_device(batch)
        return self._update(self.dp.module, self.optimizer, self.scheduler, batch, plan, ptx_pairs=ptx_pairs)

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

    def update_on_policy(
        self, batch: Batch, plan: list[torch.Tensor], ptx_pairs: list | None = None
    ) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
        """Its part of the on-policy update (glassrl.workers.base.OnPolicyActor): the metrics, and the
        update's log π_θ and H of its rows, (B, T) each in the order of ``batch``."""
        outputs: dict[str, torch.Tensor] = {}
        batch = self._to_device(batch)
        metrics = self._update(
            self.dp.module, self.optimizer, self.scheduler, batch, plan, ptx_pairs=ptx_pairs, forward_outputs=outputs
        )
        return metrics, outputs["logprobs"], outputs["entropy"]


class DataParallelCritic(DataParallelTrainee):
    """A rank of V: values of its rows, its part of the updates."""

    def compute_values(self, batch: Batch) -> torch.Tensor:
        return forward_no_grad(self.dp, self._forward, self._to_device(batch), self.micro_batch)["values"]  # (B, T)
