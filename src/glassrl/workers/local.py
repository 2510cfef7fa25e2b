"""In-process role workers: each holds its model (and optimiser) in this process.

The rollout worker samples with the actor's own model object (weights shared in
memory, nothing to synchronise). Tensors come back on the model's device.
See glassrl.workers.base for the protocol and the batch keys.

An update is not written here: :class:`LocalActor` and :class:`LocalCritic` call the ``update``
the build injects (glassrl.rl.build.role_update: the one update loop, glassrl.rl.update.RoleUpdate,
with the config's loss), in one process, where every collective of the loop is the identity; the
Ray ranks call the same loop (glassrl.workers.data_parallel). One update: Trainer.step →
Trainer._update → ``LocalActor.update`` → that loop → ``optimizer.step()``.

How a run's forward passes without gradient run is one :class:`Passes`, the same for every role
(glassrl.rl.build.forward_passes): micro-batches of ``micro_batch`` rows, log-probs at the
sampling ``temperature``; ``compute`` is the dtype of the matrix products (``model.compute_dtype``): bfloat16 runs
every forward pass and the sampling under autocast over float32 weights
(glassrl.models.precision); the training forward is wrapped by the trainer (``Autocast``).
``packed``: the forward passes see each micro-batch's real tokens only (``model.padding_free``,
glassrl.models.packing). ``shared_prefix``: each distinct prompt of a micro-batch runs once per chunk
(``model.shared_prefix``, glassrl.models.shared_prefix); the log-prob and value passes then take the
rows grouped by prompt, so a micro-batch holds whole groups where it can, and return them in row order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glassrl.data.records import PromptRecord
from glassrl.models.logprobs import response_logprobs
from glassrl.models.micro_batches import micro_batches, row_tokens, trim_left
from glassrl.models.precision import compute_precision
from glassrl.models.shared_prefix import prompt_order
from glassrl.models.values import response_values
from glassrl.rewards.base import RewardRequest, RewardResult, RewardSource
from glassrl.rollout.base import RolloutBatch, RolloutEngine, SamplingParams, close_engine
from glassrl.workers.base import Batch
from glassrl.workers.sync_truth import Checker, SyncLog, fingerprints
from glassrl.workers.weight_sync import lerp_into

# update(model, optimizer, scheduler, batch, plan, **more) -> metrics: the one update loop,
# glassrl.rl.update.RoleUpdate, made by glassrl.rl.build.role_update
UpdateFn = Callable[[nn.Module, torch.optim.Optimizer, Any, Batch, list[torch.Tensor]], dict[str, float]]
# path of an "hf" checkpoint part -> a freshly loaded module of the same kind
LoadFn = Callable[[Path], nn.Module]


@dataclass(frozen=True)
class Passes:
    """How a run's forward passes run (module docstring); a value pass reads all but ``temperature``."""

    micro_batch: int
    max_tokens: int | None = None  # batch.max_tokens_per_micro_batch (glassrl.models.micro_batches)
    temperature: float = 1.0
    compute: torch.dtype = torch.float32
    packed: bool = False
    shared_prefix: bool = False


def _to(batch: Batch, device: torch.device) -> Batch:
    return {key: value.to(device) for key, value in batch.items()}


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def no_grad_passes(
    forward: Callable[[Batch], dict[str, torch.Tensor]],
    batch: Batch,
    micro_batch: int,
    *,
    group_prompts: bool = False,
    passes: Callable[[int], int] = lambda n: n,
    max_tokens: int | None = None,
) -> dict[str, torch.Tensor]:
    """``forward(micro)`` over ``batch`` in micro-batches of ``micro_batch`` rows, without gradient; each
    output concatenated (B, ...) in the batch's own row order. The one no-grad pass of every worker, in
    this process and on a data-parallel rank.

    ``group_prompts`` (model.shared_prefix): the rows of each prompt are taken together, so that a
    micro-batch holds whole groups where it can (each distinct prompt then runs once per chunk).
    ``passes(n)``: how many passes this worker runs for its n micro-batches; more than n on an FSDP2
    rank, which must run as many as the busiest rank (every pass gathers shards): the extra passes
    repeat the last micro-batch and their outputs are dropped. ``max_tokens``: micro-batches under a
    token budget instead (glassrl.models.micro_batches), longest rows first.
    """
    rows = batch["input_ids"].shape[0]
    order = torch.arange(rows, device=batch["input_ids"].device)
    if group_prompts:
        order = prompt_order(batch["input_ids"], batch["attention_mask"], batch["response_mask"].shape[1])  # (B,)
    parts = micro_batches(
        order, row_tokens(batch["attention_mask"]), rows=micro_batch, max_tokens=max_tokens, keep_order=group_prompts
    )
    micros = [{key: value[part] for key, value in batch.items()} for part in parts]
    if max_tokens is not None:  # as the update cuts them (glassrl.rl.update.run_updates)
        micros = [trim_left(micro) for micro in micros]
    outs = [forward(micros[min(j, len(micros) - 1)]) for j in range(passes(len(micros)))][: len(micros)]
    joined = {key: torch.cat([out[key] for out in outs]) for key in outs[0]}  # (B, ...) each, in parts' order
    if group_prompts or max_tokens is not None:  # back to the batch's row order
        placed = torch.cat(parts)
        joined = {key: torch.empty_like(value).index_copy(0, placed, value) for key, value in joined.items()}
    return joined


def micro_batched_logprobs(
    model: nn.Module, batch: Batch, passes: Passes, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(a_i|s_i) (B, T) at ``passes.temperature``, and H(π(·|s_i)) (B, T) or None."""
    model.eval()
    device = _device(model)

    def forward(micro: Batch) -> dict[str, torch.Tensor]:
        with compute_precision(device, passes.compute):
            logprobs, entropy = response_logprobs(
                model,
                micro["input_ids"],
                micro["attention_mask"],
                micro["response_mask"].shape[1],
                temperature=passes.temperature,
                with_entropy=with_entropy,
                packed=passes.packed,
                shared_prefix=passes.shared_prefix,
            )
        return {"logprobs": logprobs} if entropy is None else {"logprobs": logprobs, "entropy": entropy}

    out = no_grad_passes(
        forward,
        _to(batch, device),
        passes.micro_batch,
        group_prompts=passes.shared_prefix,
        max_tokens=passes.max_tokens,
    )
    return out["logprobs"], out.get("entropy")


def _values(model: nn.Module, batch: Batch, passes: Passes) -> torch.Tensor:
    """V(s_i) (B, T), read before each token."""
    model.eval()
    device = _device(model)

    def forward(micro: Batch) -> dict[str, torch.Tensor]:
        with compute_precision(device, passes.compute):
            T = micro["response_mask"].shape[1]
            return {
                "values": response_values(
                    model,
                    micro["input_ids"],
                    micro["attention_mask"],
                    T,
                    packed=passes.packed,
                    shared_prefix=passes.shared_prefix,
                )
            }

    return no_grad_passes(
        forward,
        _to(batch, device),
        passes.micro_batch,
        group_prompts=passes.shared_prefix,
        max_tokens=passes.max_tokens,
    )["values"]


class PretrainedExport:
    """A model and its tokenizer as one ``save_pretrained`` (a self-contained HF directory)."""

    def __init__(self, model: nn.Module, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer

    def save_pretrained(self, path: str | Path) -> None:
        self.model.save_pretrained(path)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(path)


class _Trained:
    """A model trained by an optimiser and a schedule; checkpointed as "<role>" (HF) and "<role>_optim"."""

    role = ""

    def __init__(
        self,
        model,
        tokenizer,
        optimizer,
        scheduler,
        *,
        passes: Passes,
        update: UpdateFn,
        load: LoadFn,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.optimizer, self.scheduler = optimizer, scheduler
        self.passes, self._update, self._load = passes, update, load
        self.part_names = (self.role, f"{self.role}_optim")

    def update(self, batch: Batch, plan: list[torch.Tensor]) -> dict[str, float]:
        return self._update(self.model, self.optimizer, self.scheduler, _to(batch, _device(self.model)), plan)

    def save_pretrained(self, path: str | Path) -> None:
        PretrainedExport(self.model, self.tokenizer).save_pretrained(path)

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        optim = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        return {self.role: ("hf", PretrainedExport(self.model, self.tokenizer)), f"{self.role}_optim": ("torch", optim)}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        # Load into the live module (the optimiser holds its parameters; the rollout shares it).
        self.model.load_state_dict(self._load(Path(parts[self.role])).state_dict())
        optim = parts[f"{self.role}_optim"]
        self.optimizer.load_state_dict(optim["optimizer"])
        self.scheduler.load_state_dict(optim["scheduler"])


class LocalActor(_Trained):
    """π_θ: log-probs at the sampling temperature, updates through ``update``."""

    role = "actor"
    version = 0  # the updates taken: the version of its weights (rounds sampled ahead name it: glassrl.workers.overlap)

    def compute_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return micro_batched_logprobs(self.model, batch, self.passes, with_entropy=True)

    def update(self, batch: Batch, plan: list[torch.Tensor]) -> dict[str, float]:
        self.version += 1
        return super().update(batch, plan)

    def update_on_policy(
        self, batch: Batch, plan: list[torch.Tensor]
    ) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
        self.version += 1
        outputs: dict[str, torch.Tensor] = {}
        batch = _to(batch, _device(self.model))
        metrics = self._update(self.model, self.optimizer, self.scheduler, batch, plan, forward_outputs=outputs)
        return metrics, outputs["logprobs"], outputs["entropy"]


class LocalCritic(_Trained):
    """V: values read before each token, updates through ``update``."""

    role = "critic"

    def compute_values(self, batch: Batch) -> torch.Tensor:
        return _values(self.model, batch, self.passes)


class LocalReference:
    """π_ref: frozen, so nothing to checkpoint (it is reloaded from its path), unless it follows
    the actor (``synced``: algo.kl.ref_sync_every), when its weights are checkpoint part "reference".
    ``actor``: the actor's model, which :meth:`follow_actor` mixes in with ``alpha`` (in one process;
    on Ray the weight sync brings the actor's weights: glassrl.workers.weight_sync.MixSink). With ``log``
    each mix is checked (the sync truth check: glassrl.workers.sync_truth.mixed), its verdict added there."""

    def __init__(
        self,
        model: nn.Module,
        passes: Passes,
        *,
        synced: bool = False,
        actor: nn.Module | None = None,
        alpha=1.0,
        log: SyncLog | None = None,
    ) -> None:
        self.model, self.passes = model.eval().requires_grad_(False), passes
        self.part_names: tuple[str, ...] = ("reference",) if synced else ()
        self.actor, self.alpha, self.log = actor, alpha, log
        self.checker = Checker(model, "reference", alpha=alpha) if log is not None and synced else None
        self.syncs = 0

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        return micro_batched_logprobs(self.model, batch, self.passes, with_entropy=False)[0]

    def follow_actor(self) -> None:
        """glassrl.workers.base.SyncedReference: the actor's weights of now mixed in (α = ``alpha``)."""
        self.syncs += 1
        if self.checker is None:
            self.mix_in(self.actor, self.alpha)
            return
        start = time.perf_counter()
        names = [name for name, _ in self.actor.named_parameters()]
        sent = fingerprints(self.actor.named_parameters())
        self.checker.ahead()
        self.checker.observe(self.actor.named_parameters())  # what the mix must make of each tensor
        self.mix_in(self.actor, self.alpha)
        self.log.add([self.checker.verdict(self.syncs, names, sent, None, start)])

    def mix_in(self, actor: nn.Module, alpha: float) -> None:
        """θ_ref ← α·θ + (1 − α)·θ_ref, parameter by parameter (glassrl.workers.weight_sync.lerp_into)."""
        lerp_into(dict(self.model.named_parameters()), actor.named_parameters(), alpha)

    def state_dict(self) -> dict[str, tuple[str, object]]:
        if not self.part_names:  # frozen: loaded again from its path
            return {}
        weights = {name: p.detach().cpu().contiguous() for name, p in self.model.named_parameters()}
        return {"reference": ("safetensors", weights)}

    @torch.no_grad()
    def load_state_dict(self, parts: dict[str, object]) -> None:
        if not self.part_names:
            return
        saved = parts["reference"]
        for name, mine in self.model.named_parameters():
            mine.copy_(saved[name])


class FrozenActor:
    """π_θ of a checkpoint, evaluated but not trained (``glassrl explain --model``): log-probs
    and entropy exactly as :class:`LocalActor` computes them."""

    def __init__(self, model: nn.Module, passes: Passes) -> None:
        self.model, self.passes = model, passes

    def compute_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return micro_batched_logprobs(self.model, batch, self.passes, with_entropy=True)


class FrozenCritic:
    """V of a checkpoint, evaluated but not trained: values exactly as :class:`LocalCritic` computes them."""

    def __init__(self, model: nn.Module, passes: Passes) -> None:
        self.model, self.passes = model, passes

    def compute_values(self, batch: Batch) -> torch.Tensor:
        return _values(self.model, batch, self.passes)


class LocalReward:
    """The configured reward (a CombinedReward) called in this process."""

    def __init__(self, source: RewardSource) -> None:
        self.source = source

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        return self.source.score(requests)


class LocalRollout:
    """Samples with ``engine`` (sharing the actor's model) from the RNG in ``generator``, its
    forward passes under ``compute`` precision (on the generator's device, the model's)."""

    part_names = ("rollout_rng",)

    def __init__(self, engine: RolloutEngine, generator: torch.Generator, compute: torch.dtype = torch.float32) -> None:
        self.engine, self.generator, self.compute = engine, generator, compute

    def generate(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> RolloutBatch:
        with compute_precision(self.generator.device, self.compute):
            return self.engine.generate(prompts, n=n, params=params, generator=self.generator, records=records)

    def close(self) -> None:
        close_engine(self.engine)

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return {"rollout_rng": ("torch", self.generator.get_state())}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.generator.set_state(parts["rollout_rng"])
