"""Role workers as groups of Ray actors, behind the interface of glassrl.workers.base.

Shapes and batch keys: glassrl.workers.base. W: the ranks of a group.

The driver stays the single controller (DESIGN §2): the trainer calls the same
methods with the same arguments as on the in-process workers, and the classes
here split each call over a role's ranks and put the answers back together:

- forward passes without gradient (log-probs, values): rows split by token count
  (glassrl.workers.sharding.shard_rows), outputs re-assembled in batch order;
- updates: every mini-batch of the plan split by token count (shard_plan), and PPO-ptx's
  pairs of each optimiser step too; each rank runs the one update loop
  (glassrl.rl.update.run_updates) on its part; the ranks reduce gradients and metrics among
  themselves and return the same metrics; an on-policy update's log-probs and entropy come
  back per rank and are put back in batch order;
- reward scoring and sampling: requests and prompts split in contiguous chunks.

Each role is a group of W ranks, one Ray actor process each, forming one torch.distributed
group (glassrl.workers.ray_cluster: the cluster, placement, the ranks' processes and a dead
rank named). What a rank holds is built in its process by a picklable ``build(ctx)``: an actor
group may hold "actor", "rollout" (sampling with the same replica) and, under LoRA, "reference"
(glassrl.workers.lora: the actor's model, adapters off).

A rollout placed apart is a group of its own, each rank sampling with its copy of π_θ;
:class:`RayWeightSync` keeps those copies equal to the actor's after every update and load
(glassrl.workers.weight_sync: actor rank 0 broadcasts to the rollout ranks over a process group
of their own), and :class:`RayActor` runs it, so the training loop does not see it. In
asynchronous training (``rollout.max_staleness`` ≥ 1) the rollout ranks receive in a thread of
their own while they sample (glassrl.workers.async_rollout), and :class:`RayAsyncRollout` hands the
trainer batches requested ahead: each sampled with the weights of the version it names.

Every such sync is checked on its receiving ranks (``check.sync``: glassrl.workers.sync_truth): their
verdicts come back to the driver with the sync (or, asynchronous, with the batch sampled) into the
run's :class:`~glassrl.workers.sync_truth.SyncLog`, which the loop reads once a step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rollout.base import RolloutBatch, SamplingParams, concat_rollouts
from glassrl.workers.base import Batch
from glassrl.workers.ray_cluster import RankGroup, import_ray, ray_errors
from glassrl.workers.sharding import balanced_partitions, gather_rows, shard_plan, shard_rows
from glassrl.workers.sync_truth import SyncLog, Verdict


def _select(batch: Batch, rows: torch.Tensor) -> Batch:
    return {k: v[rows.to(v.device)] for k, v in batch.items()}


class _Collective:
    """A checkpoint part ("hf" kind: ``save_pretrained(dir)``) that every rank of a group writes."""

    def __init__(self, group: RankGroup, name: str, method: str) -> None:
        self.group, self.name, self.method = group, name, method

    def save_pretrained(self, path: str | Path) -> None:
        self.group.call_all(self.name, self.method, str(path))


_ROW = "_row"  # a column that travels with the rows into shard_plan: each rank's rows of the batch


class _RayTrainee:
    """Parts: "<role>" (the model, Hugging Face format: export, from_pretrained) and
    "<role>_state" (trainable weights, optimiser and schedule, sharded: glassrl.run.sharded; resume)."""

    role = ""

    def __init__(self, group: RankGroup, name: str | None = None) -> None:
        self.group, self.name = group, name or self.role
        self.part_names = (self.role, f"{self.role}_state")

    def update(self, batch: Batch, plan: list[torch.Tensor]) -> dict[str, float]:
        return self.group.call_each(self.name, "update", self._parts(batch, plan)[0])[0]

    def _parts(self, batch: Batch, plan: list[torch.Tensor]) -> tuple[list[tuple], list[torch.Tensor]]:
        """Each rank's arguments of an update (its rows of ``batch``, its plan: shard_plan), and the
        rows each holds (B_r,), indices into ``batch``, in the order of its part."""
        parts = shard_plan({**batch, _ROW: torch.arange(batch["input_ids"].shape[0])}, plan, self.group.world_size)
        rows = [part.pop(_ROW) for part, _ in parts]
        return parts, rows

    def save_pretrained(self, path: str) -> None:
        self.group.call_all(self.name, "save_pretrained", str(path))

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return {
            self.role: ("hf", _Collective(self.group, self.name, "save_pretrained")),
            f"{self.role}_state": ("hf", _Collective(self.group, self.name, "save_sharded")),
        }

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.group.call_all(self.name, "load_sharded", str(parts[f"{self.role}_state"]))

    def _forward(self, method: str, batch: Batch) -> list[Any]:
        shards = shard_rows(batch, self.group.world_size)
        return shards, self.group.call_each(self.name, method, [(_select(batch, s),) for s in shards])


class RayWeightSync:
    """The rollout group's copies of π_θ made equal to the actor's (glassrl.workers.weight_sync).

    Actor rank 0 and the W rollout ranks form a process group of their own (NCCL on ``device``
    cuda, else gloo; rank 0's address and a free port from actor rank 0). A call sends the weights
    and ``version`` (the actor updates they hold: :class:`RayActor` counts them; a resume sets it):
    every actor rank runs ``send`` (under FSDP2 they gather each parameter together), every rollout
    rank ``receive``, or, ``background`` (asynchronous training), receives in a thread of its own
    while it samples (glassrl.workers.async_rollout.BackgroundReceiver); the answer is the wall time
    in seconds. The group is formed, and a first sync run, on construction (LoRA adapters are drawn
    at random on each side); not with ``first`` False (a reference that follows the actor: its
    receiving side mixes in, and moves only when the trainer says).

    With ``log`` (the sync truth check, built into both sides by the config) the receiving ranks'
    verdicts are added to it; the probe runs on the syncs of the versions that are multiples of
    ``probe_every`` (0: never), the first included.
    """

    def __init__(
        self,
        actors: RankGroup,
        rollouts: RankGroup,
        device: str = "cpu",
        name: str = "weights",
        background: bool = False,
        first: bool = True,
        log: SyncLog | None = None,
        probe_every: int = 0,
    ) -> None:
        self.actors, self.rollouts, self.name, self.background = actors, rollouts, name, background
        self.log, self.probe_every = log, probe_every
        self.version = 0
        address, port = actors.get([actors.hosts[0].rendezvous.remote()], ranks=[0])[0]
        world = 1 + rollouts.world_size
        self._run(
            [("join", address, port, world, device)] * actors.world_size,
            [("join", address, port, 1 + r, world, device) for r in range(rollouts.world_size)],
        )
        if first:
            self()

    def __call__(self) -> float:
        start = time.perf_counter()
        receive = [] if self.background else [("receive_checked",)] * self.rollouts.world_size
        probe = self.log is not None and self.probe_every > 0 and self.version % self.probe_every == 0
        try:
            answers = self._run([("send", self.version, probe)] * self.actors.world_size, receive)
        except ray_errors() as err:  # a send cut off: a rollout rank may have died under it
            self.rollouts.probe()
            raise err
        if self.log is not None:
            self.log.add(answers)
        return time.perf_counter() - start

    def _run(self, actor_calls: list[tuple], rollout_calls: list[tuple]) -> list[Any]:
        """Both groups' calls at once (a collective across them); a dead rank is named as soon as known,
        whichever group it is in (the ranks of the other would wait for it). The rollout ranks' answers."""
        ray = import_ray()
        owner = {}
        for group, calls in ((self.actors, actor_calls), (self.rollouts, rollout_calls)):
            for rank, (method, *args) in enumerate(calls):
                owner[group.hosts[rank].call.remote(self.name, method, *args)] = (group, rank)
        pending, answers = list(owner), {}
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            group, rank = owner[done[0]]
            answer = group.get(done, ranks=[rank])[0]
            if group is self.rollouts:
                answers[rank] = answer
        return [answers[rank] for rank in sorted(answers)]


class RayActor(_RayTrainee):
    """π_θ on W data-parallel ranks (glassrl.workers.data_parallel.DataParallelActor in each).

    With a rollout placed apart (``weight_sync``), its copies of π_θ follow every update and
    every load; the update's metrics then carry ``perf/weight_sync_s``. With ``ptx`` (PPO-ptx's
    glassrl.rl.ptx.PtxLoss, whose stream the driver checkpoints) an update draws the supervised
    pairs of each optimiser step here and splits them over the ranks by tokens, as the rows.
    """

    role = "actor"

    def __init__(
        self, group: RankGroup, name: str | None = None, weight_sync: RayWeightSync | None = None, ptx=None
    ) -> None:
        super().__init__(group, name)
        self.weight_sync, self.ptx = weight_sync, ptx

    def update(self, batch: Batch, plan: list[torch.Tensor]) -> dict[str, float]:
        return self._synced(super().update(batch, plan))

    def update_on_policy(
        self, batch: Batch, plan: list[torch.Tensor]
    ) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
        """glassrl.workers.base.OnPolicyActor: each rank's log π_θ and H of its rows, put back in batch order."""
        parts, rows = self._parts(batch, plan)
        outs = self.group.call_each(self.name, "update_on_policy", parts)
        logprobs, entropy = (gather_rows([out[i] for out in outs], rows) for i in (1, 2))
        return self._synced(outs[0][0]), logprobs, entropy

    def _parts(self, batch: Batch, plan: list[torch.Tensor]) -> tuple[list[tuple], list[torch.Tensor]]:
        parts, rows = super()._parts(batch, plan)
        if self.ptx is None:
            return parts, rows
        steps = [self.ptx.take() for _ in plan]  # the pairs of each optimiser step, as one process draws them
        split = [balanced_partitions([len(p) + len(r) for p, r in pairs], self.group.world_size) for pairs in steps]
        mine = [[[pairs[i] for i in cut[rank]] for pairs, cut in zip(steps, split)] for rank in range(len(parts))]
        return [(*part, pairs) for part, pairs in zip(parts, mine)], rows

    def _synced(self, metrics: dict[str, float]) -> dict[str, float]:
        if self.weight_sync is not None:
            self.weight_sync.version += 1  # the weights now hold one more actor update
            metrics["perf/weight_sync_s"] = self.weight_sync()
        return metrics

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        super().load_state_dict(parts)
        if self.weight_sync is not None:
            self.weight_sync()

    def compute_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        shards, outs = self._forward("compute_logprobs", batch)
        return gather_rows([o[0] for o in outs], shards), gather_rows([o[1] for o in outs], shards)


class RayCritic(_RayTrainee):
    """V on W data-parallel ranks (DataParallelCritic in each)."""

    role = "critic"

    def compute_values(self, batch: Batch) -> torch.Tensor:
        shards, outs = self._forward("compute_values", batch)
        return gather_rows(outs, shards)


class RayReference:
    """π_ref on the ranks of ``group`` under ``name``: its own group, or the actor's (LoRA: adapters off).

    With ``sync`` (algo.kl.ref_sync_every) it follows the actor: :meth:`follow_actor` runs that weight
    sync, actor rank 0 broadcasting to the reference ranks, each mixing the weights in
    (glassrl.workers.weight_sync.MixSink); its weights, rank 0's (every rank holds them whole), are then
    checkpoint part "reference", as in one process (glassrl.workers.local.LocalReference)."""

    def __init__(self, group: RankGroup, name: str = "reference", sync: RayWeightSync | None = None) -> None:
        self.group, self.name, self.sync = group, name, sync
        self.part_names: tuple[str, ...] = ("reference",) if sync is not None else ()

    def follow_actor(self) -> None:
        self.sync.version += 1  # the syncs so far: the version the sync truth check names
        self.sync()

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        if self.sync is None:
            return {}
        return self.group.get([self.group.hosts[0].call.remote(self.name, "state_dict")], ranks=[0])[0]

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        if self.sync is not None:
            self.group.call_all(self.name, "load_state_dict", parts)

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        shards = shard_rows(batch, self.group.world_size)
        outs = self.group.call_each(self.name, "compute_logprobs", [(_select(batch, s),) for s in shards])
        return gather_rows(outs, shards)


def _chunks(n: int, parts: int) -> list[range]:
    """Contiguous ranges of range(n), sizes differing by at most one."""
    bounds = [n * p // parts for p in range(parts + 1)]
    return [range(bounds[p], bounds[p + 1]) for p in range(parts)]


class RayReward:
    """Reward sources scored on W ranks, requests in contiguous chunks (the driver only waits)."""

    def __init__(self, group: RankGroup, name: str = "reward") -> None:
        self.group, self.name = group, name

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        chunks = _chunks(len(requests), self.group.world_size)
        outs = self.group.call_each(self.name, "score", [([requests[i] for i in c],) for c in chunks])
        return [result for out in outs for result in out]


class RayRollout:
    """Sampling on the first ``ranks`` ranks of ``group`` (all by default; each with its replica or
    copy of π_θ and its own RNG), prompts in contiguous chunks: the actor's group, or a rollout
    group of its own (placed apart, its copies kept in sync by :class:`RayWeightSync`).

    Checkpoint part "rollout_rng": every sampling rank's RNG state, in rank order (a resume
    needs the same number of sampling ranks).
    """

    part_names = ("rollout_rng",)

    def __init__(self, group: RankGroup, pad_id: int, name: str = "rollout", ranks: int | None = None) -> None:
        self.group, self.pad_id, self.name = group, pad_id, name
        self.ranks = group.world_size if ranks is None else ranks

    def generate(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> RolloutBatch:
        return self._gather(self._submit(prompts, n=n, params=params, records=records))

    def _submit(self, prompts, *, n, params, records, **more) -> list[tuple[int, int, Any]]:
        """Each busy rank's chunk of ``prompts`` sent to it: (rank, first prompt index, future)."""
        chunks = _chunks(len(prompts), self.ranks)
        busy = [r for r, c in enumerate(chunks) if len(c)]  # fewer prompts than ranks: some rest
        return [
            (
                r,
                chunks[r].start,
                self.group.hosts[r].call.remote(
                    self.name,
                    "generate",
                    [prompts[i] for i in chunks[r]],
                    n=n,
                    params=params,
                    records=None if records is None else [records[i] for i in chunks[r]],
                    **more,
                ),
            )
            for r in busy
        ]

    def _results(self, pending: list[tuple[int, int, Any]]) -> list[Any]:
        return self.group.get([future for _, _, future in pending], ranks=[r for r, _, _ in pending])

    def _gather(self, pending: list[tuple[int, int, Any]], outs: list[RolloutBatch] | None = None) -> RolloutBatch:
        """The ranks' batches as one, group indices into the whole prompt list."""
        outs = self._results(pending) if outs is None else outs
        for (_, start, _), out in zip(pending, outs):
            out.group_index = out.group_index + start
        return concat_rollouts(outs, self.pad_id)

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        answers = self.group.call_each(self.name, "state_dict", [()] * self.ranks)
        return {"rollout_rng": ("torch", [parts["rollout_rng"][1] for parts in answers])}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        states = parts["rollout_rng"]
        if len(states) != self.ranks:
            raise GlassrlError(
                f"checkpoint part rollout_rng holds {len(states)} ranks' RNG states; this run samples on "
                f"{self.ranks} (resume with the same ray.rollout.placement and ray.actor.world_size and "
                "ray.rollout_ranks, or ray.rollout.world_size when apart)"
            )
        self.group.call_each(self.name, "load_state_dict", [({"rollout_rng": s},) for s in states])


class RayAsyncRollout(RayRollout):
    """Rollout ranks that sample while the actor trains (asynchronous training; their side:
    glassrl.workers.async_rollout.AsyncRolloutRank), fed by ``sync`` in the background.

    :meth:`submit` sends a batch's prompts at once and returns; each rank queues it behind the
    batches it holds and samples it with the weights of ``version`` (the actor updates now), or newer
    with partial rollouts; :meth:`result` waits for it. A rank runs its calls in the order sent, so
    :meth:`generate` (evaluation) and ``state_dict`` (its RNG) come after every batch sent before.
    """

    def __init__(self, group: RankGroup, pad_id: int, sync: RayWeightSync, name: str = "rollout") -> None:
        super().__init__(group, pad_id, name)
        self.sync = sync

    @property
    def version(self) -> int:
        """The actor updates the weights hold now (what the last sync sent)."""
        return self.sync.version

    def publish(self, version: int) -> None:
        """The actor's weights, restored from a checkpoint, are version ``version``: sent as such."""
        self.sync.version = version
        self.sync()

    def submit(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> list[tuple[int, int, Any]]:
        """Queue len(prompts) × n responses on the ranks (contiguous chunks), sampled with this version."""
        return self._submit(prompts, n=n, params=params, records=records, version=self.version)

    def result(self, pending: list[tuple[int, int, Any]]) -> tuple[RolloutBatch, dict[str, float], list[Verdict]]:
        """The batch of :meth:`submit` (waiting for it), the ranks' seconds (the most of any rank), and
        the ranks' checks of the weights they sampled it with (the caller logs them)."""
        answers = self._results(pending)
        timings: dict[str, float] = {}
        checks: list[Verdict] = []
        for _, seconds, verdicts in answers:
            for key, value in seconds.items():
                timings[key] = max(timings.get(key, 0.0), value)
            checks.extend(v for v in verdicts if v is not None)
        return self._gather(pending, [batch for batch, _, _ in answers]), timings, checks

    def generate(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> RolloutBatch:
        batch, _, verdicts = self.result(self.submit(prompts, n=n, params=params, records=records))
        if self.sync.log is not None:
            self.sync.log.add(verdicts)
        return batch
