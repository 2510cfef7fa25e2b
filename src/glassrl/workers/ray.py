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

A group is W Ray actors (:class:`RankHost`), one process each, forming one
torch.distributed group (gloo on CPU, NCCL on GPU; rank 0's address and a free
port are handed to the others). What a rank holds is built in its process by a
picklable ``build(ctx) -> {name: object}`` (the trainer binds it from the config):
an actor group may hold "actor", "rollout" (sampling with the same replica) and,
under LoRA, "reference" (glassrl.workers.lora: the actor's model, adapters off).

A rollout placed apart is a group of its own, each rank sampling with its copy of π_θ;
:class:`RayWeightSync` keeps those copies equal to the actor's after every update and load
(glassrl.workers.weight_sync: actor rank 0 broadcasts to the rollout ranks over a process group
of their own), and :class:`RayActor` runs it, so the training loop does not see it. In
asynchronous training (``rollout.max_staleness`` ≥ 1) the rollout ranks receive in a thread of
their own while they sample (glassrl.workers.async_rollout), and :class:`RayAsyncRollout` hands the
trainer batches requested ahead: each sampled with the weights of the version it names.

Placement (Ray placement groups): "colocate" puts rank r of every role in bundle r
of one group (the bundle holds their summed resources); "separate" gives each role
its own group. ``resources`` per rank, e.g. {"CPU": 1, "GPU": 1}. On a local cluster
(started here: its size is all there is) the ranks left at the default {"CPU": 1} share the
CPUs the others leave when there are fewer than ranks, and a demand that cannot be met
is an error at once, naming the keys to set (:func:`fit_local`).

A worker that dies (killed, out of memory, its node lost) ends the call with a
GlassrlError naming the role and the rank; the group's other processes are then
stopped (they would wait in a collective for the dead one).

Ray is an optional extra (``pip install glassrl[ray]``), imported here only.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rollout.base import RolloutBatch, SamplingParams, concat_rollouts
from glassrl.workers.base import Batch
from glassrl.workers.data_parallel import DistContext, free_port, init_group
from glassrl.workers.sharding import balanced_partitions, gather_rows, shard_plan, shard_rows

PLACEMENTS = ("colocate", "separate")


def _ray():
    try:
        import ray
    except ImportError:
        raise GlassrlError("trainer.backend = ray needs the ray package: pip install 'glassrl[ray]'") from None
    return ray


def connect(address: str | None = None, **init_kwargs: Any) -> None:
    """Join the Ray cluster at ``address`` (``ray.address``), or start a local one of its own when None.

    ``init_kwargs`` go to ``ray.init`` for a local cluster (num_cpus, object_store_memory, ...).
    Nothing happens when this process is already connected. ``ray.init()`` without an address would
    join a cluster it finds (``RAY_ADDRESS``, or the last one ``ray start`` left on this machine);
    ``address="local"`` starts a new one whatever the environment says.
    """
    ray = _ray()
    if ray.is_initialized():
        return
    try:
        if address is None:
            ray.init(**{"address": "local", "include_dashboard": False, **init_kwargs})
        else:
            ray.init(address=address)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise GlassrlError(f"ray.address = {address!r}: cannot join the Ray cluster: {err}") from None


@dataclass(frozen=True)
class RoleSpec:
    """One role's group: W ranks, each with ``resources``, building its objects with ``build``."""

    role: str
    world_size: int
    build: Callable[[DistContext], dict[str, Any]]
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    device: str = "cpu"  # "cuda" when the ranks hold a GPU each (NCCL)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise GlassrlError(f"{self.role}.world_size = {self.world_size}: need at least 1")
        if not any(v > 0 for v in self.resources.values()):
            raise GlassrlError(f"{self.role}.resources = {self.resources}: a rank needs some resource (e.g. CPU: 1)")


class RankHost:
    """One rank of a role, in its own process (a Ray actor): its group membership and objects."""

    def __init__(self, role: str, rank: int, world_size: int) -> None:
        self.role, self.rank, self.world_size = role, rank, world_size
        self.objects: dict[str, Any] = {}

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port (asked of rank 0)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, build: Callable[[DistContext], dict[str, Any]], address: str, port: int, device: str) -> None:
        ctx = init_group(self.role, self.rank, self.world_size, address, port, device)
        self.objects = build(ctx)

    def call(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.objects[name], method)(*args, **kwargs)

    def ping(self) -> bool:
        return True


def _options(resources: dict[str, float]) -> dict[str, Any]:
    other = {k: v for k, v in resources.items() if k not in ("CPU", "GPU") and v > 0}
    return {
        "num_cpus": resources.get("CPU", 0),
        "num_gpus": resources.get("GPU", 0),
        "resources": other,
        "runtime_env": {"env_vars": rank_env()},
    }


def rank_env() -> dict[str, str]:
    """A rank's environment variables. Its output is the driver's (Ray forwards it): glassrl's
    lines, not the libraries' notes. Hugging Face's progress bars off; torch's C++ warnings only
    when asked for (DDP's reducer: "find_unused_parameters=True was specified ... but did not find
    any unused parameters", which the actor's rank cannot help: a critic's rank has them). Either
    variable set in the driver's environment is kept."""
    return {
        "HF_HUB_DISABLE_PROGRESS_BARS": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
        "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
    }


def _bundle(resource_sets: Sequence[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for resources in resource_sets:
        for key, value in resources.items():
            total[key] = total.get(key, 0.0) + value
    return {k: v for k, v in total.items() if v > 0}


DEFAULT_RESOURCES = {"CPU": 1.0}  # a rank's resources unless the config says otherwise (RayRoleConfig)


def fit_local(specs: Sequence[RoleSpec], total: dict[str, float]) -> list[RoleSpec]:
    """``specs`` placed on a local cluster of ``total`` resources (ray.cluster_resources()).

    Ranks at :data:`DEFAULT_RESOURCES` share the CPUs the other ranks leave, each an equal
    fraction, when there are fewer than they ask (Ray's CPU is a unit of scheduling, not a
    pinned core: 2 cores run 3 ranks); any other shortfall is a GlassrlError naming the
    ``ray.<role>`` keys, at once, where the placement group would wait for a node that never
    comes. A cluster that was joined may grow (autoscaling): it is not fitted.
    """
    demand = _bundle([s.resources for s in specs for _ in range(s.world_size)])
    short = {k: v for k, v in demand.items() if v > total.get(k, 0.0) + 1e-9}
    if not short:
        return list(specs)
    fitted = [s for s in specs if s.resources == DEFAULT_RESOURCES]
    others = _bundle([s.resources for s in specs if s not in fitted for _ in range(s.world_size)])
    ranks = sum(s.world_size for s in fitted)
    # floored to Ray's resource precision (1e-4), so that the shares never sum past the cores
    share = math.floor((total.get("CPU", 0.0) - others.get("CPU", 0.0)) / max(ranks, 1) * 1e4) / 1e4
    others_fit = all(v <= total.get(k, 0.0) + 1e-9 for k, v in others.items())
    if fitted and others_fit and share > 0:
        return [replace(s, resources={"CPU": share}) if s in fitted else s for s in specs]
    have = {k: total.get(k, 0.0) for k in demand}
    keys = ", ".join(f"ray.{s.role}.resources (×{s.world_size} ranks: {s.resources})" for s in specs)
    raise GlassrlError(
        f"ray: the local Ray cluster started for this run has {have}, the ranks ask for {demand}; "
        f"lower {keys} or the world sizes, or join a larger cluster with ray.address"
    )


class RankGroup:
    """The W Ray actors of one role; rank r is ``hosts[r]``."""

    def __init__(self, spec: RoleSpec, placement_group: Any, bundles: Sequence[int]) -> None:
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.role, self.world_size = spec.role, spec.world_size
        remote = ray.remote(RankHost)
        self.hosts = [
            remote.options(
                **_options(spec.resources),
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=b),
            ).remote(spec.role, rank, spec.world_size)
            for rank, b in enumerate(bundles)
        ]
        address, port = self.get([self.hosts[0].rendezvous.remote()], ranks=[0])[0]
        # Every rank at once: init_process_group returns when all have joined.
        self.get([h.setup.remote(spec.build, address, port, spec.device) for h in self.hosts])

    def call_each(self, name: str, method: str, args: Sequence[tuple]) -> list[Any]:
        """Rank r runs ``objects[name].method(*args[r])``; the answers in rank order."""
        return self.get([h.call.remote(name, method, *a) for h, a in zip(self.hosts, args)])

    def call_all(self, name: str, method: str, *args: Any) -> list[Any]:
        """Every rank runs ``objects[name].method(*args)`` (a collective: all must take part)."""
        return self.call_each(name, method, [args] * self.world_size)

    def get(self, futures: list, ranks: Sequence[int] | None = None) -> list[Any]:
        """The results of ``futures`` (rank order); a dead rank → GlassrlError naming it, as soon as it is known."""
        ray = _ray()
        ranks = list(range(len(futures))) if ranks is None else list(ranks)
        rank_of = {f: r for f, r in zip(futures, ranks)}
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except ray.exceptions.RayActorError as err:
                self.shutdown()  # the others would wait for it in their next collective
                reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise GlassrlError(
                    f"{self.role} worker rank {rank_of[done[0]]} of {self.world_size} died: {reason}"
                ) from None
            except ray.exceptions.RayTaskError as err:
                # A rank's GlassrlError (a non-finite step, which every rank raises alike, naming the
                # ranks) reaches the driver as itself: one line, without the worker's traceback.
                if not isinstance(err.cause, GlassrlError):
                    raise
                # The other ranks' answers are taken too, else Ray prints them later as unhandled errors.
                for other in ray.wait(pending, num_returns=len(pending), timeout=30)[0] if pending else []:
                    try:
                        ray.get(other)
                    except ray.exceptions.RayError:
                        pass
                raise err.cause from None
        return ray.get(futures)

    def probe(self, timeout_s: float = 10.0) -> None:
        """A GlassrlError naming the first rank found dead (within ``timeout_s``); nothing when none is
        (a rank busy with queued calls answers late, and counts as alive)."""
        ray = _ray()
        futures = [h.ping.remote() for h in self.hosts]
        done, _ = ray.wait(futures, num_returns=len(futures), timeout=timeout_s)
        for future in done:
            try:
                ray.get(future)
            except ray.exceptions.RayActorError:
                self.get([future], ranks=[futures.index(future)])
            except ray.exceptions.RayError:
                pass

    def shutdown(self) -> None:
        ray = _ray()
        for host in self.hosts:
            ray.kill(host)


def ray_errors() -> tuple[type[BaseException], ...]:
    """Ray's exception classes (for ``except``), Ray imported now."""
    return (_ray().exceptions.RayError,)


class RayCluster:
    """The groups of a run, placed together ("colocate") or apart ("separate")."""

    def __init__(self, specs: Sequence[RoleSpec], placement: str = "colocate", local: bool = False) -> None:
        """``local``: the cluster was started for this run (ray.address null): fitted (:func:`fit_local`)."""
        ray = _ray()
        from ray.util.placement_group import placement_group

        if placement not in PLACEMENTS:
            raise GlassrlError(f"ray.placement: unknown {placement!r}; valid: {', '.join(PLACEMENTS)}")
        if local:
            specs = fit_local(specs, ray.cluster_resources())
        self.placement_groups = []
        self.groups: dict[str, RankGroup] = {}
        if placement == "colocate":
            width = max(s.world_size for s in specs)
            bundles = [_bundle([s.resources for s in specs if s.world_size > r]) for r in range(width)]
            pg = placement_group(bundles, strategy="PACK")
            self.placement_groups.append(pg)
            self._ready(pg, bundles)
            for s in specs:
                self.groups[s.role] = RankGroup(s, pg, range(s.world_size))
        else:
            for s in specs:
                bundles = [_bundle([s.resources])] * s.world_size
                pg = placement_group(bundles, strategy="PACK")
                self.placement_groups.append(pg)
                self._ready(pg, bundles)
                self.groups[s.role] = RankGroup(s, pg, range(s.world_size))

    @staticmethod
    def _ready(pg: Any, bundles: list[dict[str, float]], timeout_s: float = 120.0) -> None:
        ray = _ray()
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            available = ray.available_resources()
            raise GlassrlError(
                f"ray: the cluster cannot place bundles {bundles} within {timeout_s:g} s "
                f"(available: { {k: v for k, v in available.items() if k in ('CPU', 'GPU')} }); "
                "lower the roles' resources or world sizes, or add nodes"
            )

    def __getitem__(self, role: str) -> RankGroup:
        return self.groups[role]

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        """Stop every rank and free the placement groups (idempotent)."""
        groups, self.groups = self.groups, {}
        placement_groups, self.placement_groups = self.placement_groups, []
        for group in groups.values():
            group.shutdown()
        for pg in placement_groups:
            remove_placement_group(pg)


# ---------------------------------------------------------------- the worker interface


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
    at random on each side).
    """

    def __init__(
        self,
        actors: RankGroup,
        rollouts: RankGroup,
        device: str = "cpu",
        name: str = "weights",
        background: bool = False,
    ) -> None:
        self.actors, self.rollouts, self.name, self.background = actors, rollouts, name, background
        self.version = 0
        address, port = actors.get([actors.hosts[0].rendezvous.remote()], ranks=[0])[0]
        world = 1 + rollouts.world_size
        self._run(
            [("join", address, port, world, device)] * actors.world_size,
            [("join", address, port, 1 + r, world, device) for r in range(rollouts.world_size)],
        )
        self()

    def __call__(self) -> float:
        start = time.perf_counter()
        receive = [] if self.background else [("receive",)] * self.rollouts.world_size
        try:
            self._run([("send", self.version)] * self.actors.world_size, receive)
        except ray_errors() as err:  # a send cut off: a rollout rank may have died under it
            self.rollouts.probe()
            raise err
        return time.perf_counter() - start

    def _run(self, actor_calls: list[tuple], rollout_calls: list[tuple]) -> None:
        """Both groups' calls at once (a collective across them); a dead rank is named as soon as known,
        whichever group it is in (the ranks of the other would wait for it)."""
        ray = _ray()
        owner = {}
        for group, calls in ((self.actors, actor_calls), (self.rollouts, rollout_calls)):
            for rank, (method, *args) in enumerate(calls):
                owner[group.hosts[rank].call.remote(self.name, method, *args)] = (group, rank)
        pending = list(owner)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            group, rank = owner[done[0]]
            group.get(done, ranks=[rank])


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
    """π_ref on the ranks of ``group`` under ``name``: its own group, or the actor's (LoRA: adapters off)."""

    def __init__(self, group: RankGroup, name: str = "reference") -> None:
        self.group, self.name = group, name

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

    def result(self, pending: list[tuple[int, int, Any]]) -> tuple[RolloutBatch, dict[str, float]]:
        """The batch of :meth:`submit` (waiting for it) and the ranks' seconds, the most of any rank."""
        answers = self._results(pending)
        timings: dict[str, float] = {}
        for _, seconds in answers:
            for key, value in seconds.items():
                timings[key] = max(timings.get(key, 0.0), value)
        return self._gather(pending, [batch for batch, _ in answers]), timings

    def generate(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> RolloutBatch:
        return self.result(self.submit(prompts, n=n, params=params, records=records))[0]
