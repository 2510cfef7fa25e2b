"""The Ray cluster a run's role workers live on: joining or starting it, placing each role's ranks
(placement groups), and each rank's process and its torch.distributed group.

A group is W Ray actors (:class:`RankHost`), one process each, forming one torch.distributed
group (gloo on CPU, NCCL on GPU; rank 0's address and a free port are handed to the others:
glassrl.workers.data_parallel.init_group). What a rank holds is built in its process by a
picklable ``build(ctx) -> {name: object}`` (the trainer binds it from the config), and the
driver calls its objects' methods by name (:meth:`RankGroup.call_all`, :meth:`RankGroup.call_each`).
The role workers that split the trainer's calls over these groups are glassrl.workers.ray.

Placement (Ray placement groups): "colocate" puts rank r of every role in bundle r
of one group (the bundle holds their summed resources); "separate" gives each role
its own group. ``resources`` per rank, e.g. {"CPU": 1, "GPU": 1}. On a local cluster
(started here: its size is all there is) the ranks left at the default {"CPU": 1} share the
CPUs the others leave when there are fewer than ranks, and a demand that cannot be met
is an error at once, naming the keys to set (:func:`fit_local`). Over the nodes of a cluster
each placement group packs its bundles or spreads them (``RoleSpec.nodes``: Ray's PACK or SPREAD;
a spread group's torch.distributed group then spans nodes, rank 0's node address its rendezvous).

A worker that dies (killed, out of memory, its node lost) ends the call with a
GlassrlError naming the role, the rank and its node (and whether Ray counts the node lost); the
group's other processes are then stopped (they would wait in a collective for the dead one).
Where each rank runs, and the run directory each must share: glassrl.workers.ray_nodes.

Ray is an optional extra (``pip install glassrl[ray]``), imported here only.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from glassrl.errors import GlassrlError
from glassrl.workers.data_parallel import DistContext, free_port, init_group
from glassrl.workers.ray_nodes import RankFiles, node_alive, node_name, where

PLACEMENTS = ("colocate", "separate")
STRATEGIES = {"pack": "PACK", "spread": "SPREAD"}  # ray.<role>.nodes → Ray's placement group strategy


def import_ray():
    """The ray package, or one GlassrlError line saying how to install it."""
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

    A local cluster keeps Ray's default, token authentication, without Ray's warning about that
    default at every start (issue 44): the one record is filtered from Ray's logger
    (:class:`_DefaultAuthNotice`); a user's ``RAY_AUTH_MODE`` is Ray's to read, untouched.
    """
    ray = import_ray()
    if ray.is_initialized():
        return
    try:
        if address is None:
            _quiet_default_auth_notice()
            ray.init(**{"address": "local", "include_dashboard": False, **init_kwargs})
        else:
            ray.init(address=address)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise GlassrlError(f"ray.address = {address!r}: cannot join the Ray cluster: {err}") from None


class _DefaultAuthNotice(logging.Filter):
    """Drops Ray's "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt
    out…" (ray._private.authentication.authentication_token_setup), printed at every new local cluster whose
    mode is unset: the default kept, not a problem to report. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def _quiet_default_auth_notice() -> None:
    logger = logging.getLogger(AUTH_LOGGER)
    if not any(isinstance(f, _DefaultAuthNotice) for f in logger.filters):
        logger.addFilter(_DefaultAuthNotice())


@dataclass(frozen=True)
class RoleSpec:
    """One role's group: W ranks, each with ``resources``, building its objects with ``build``."""

    role: str
    world_size: int
    build: Callable[[DistContext], dict[str, Any]]
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    device: str = "cpu"  # "cuda" when the ranks hold a GPU each (NCCL)
    nodes: str = "pack"  # over the nodes: "pack" or "spread" (STRATEGIES)

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
        self.files: RankFiles | None = None  # its files in the run directory, once attached

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port (asked of rank 0)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def where(self) -> dict[str, Any]:
        """This rank's node (glassrl.workers.ray_nodes.where)."""
        return where()

    def attach(self, run_dir: str, token: str) -> tuple[str, dict[str, Any]]:
        """The run directory's check (glassrl.workers.ray_nodes.attach_ranks): "" when this rank reads
        ``token`` there and writes its files, else what failed; and this rank's node."""
        self.files, place, problem = RankFiles.open(run_dir, token, self.role, self.rank)
        return problem, place

    def setup(self, build: Callable[[DistContext], dict[str, Any]], address: str, port: int, device: str) -> None:
        ctx = init_group(self.role, self.rank, self.world_size, address, port, device)
        self.objects = build(ctx)

    def call(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        answer = getattr(self.objects[name], method)(*args, **kwargs)
        if self.files is not None:
            self.files.record(f"{name}.{method}", time.perf_counter() - start)
        return answer

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


DEATH_WAIT_S = 30.0  # how long a failed collective waits to learn whether a rank died under it
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
        ray = import_ray()
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
        self.places: list[dict[str, Any]] = [{} for _ in self.hosts]  # each rank's node, asked next
        self.places = self.get([h.where.remote() for h in self.hosts])
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
        ray = import_ray()
        ranks = list(range(len(futures))) if ranks is None else list(ranks)
        rank_of = {f: r for f, r in zip(futures, ranks)}
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except ray.exceptions.RayActorError as err:
                raise self._died(rank_of[done[0]], err) from None
            except ray.exceptions.RayTaskError as err:
                # A rank's GlassrlError (a non-finite step, which every rank raises alike, naming the
                # ranks) reaches the driver as itself: one line, without the worker's traceback.
                if not isinstance(err.cause, GlassrlError):
                    # A collective cut off ("Connection reset by peer") by a rank that died under it,
                    # often before Ray says that rank is dead: that rank named instead, once known.
                    self._named_death(pending, rank_of)
                    raise
                # The other ranks' answers are taken too, else Ray prints them later as unhandled errors.
                for other in ray.wait(pending, num_returns=len(pending), timeout=30)[0] if pending else []:
                    try:
                        ray.get(other)
                    except ray.exceptions.RayError:
                        pass
                raise err.cause from None
        return ray.get(futures)

    def _died(self, rank: int, err: BaseException | None) -> GlassrlError:
        """The error of a dead rank (the group's other processes stopped: they would wait for it in
        their next collective)."""
        self.shutdown()
        text = str(err).strip() if err is not None else ""
        reason = text.splitlines()[0] if text else "its node stopped answering Ray's health checks"
        return GlassrlError(f"{self.role} worker rank {rank} of {self.world_size} died{self._on_node(rank)}: {reason}")

    def _named_death(self, pending: list, rank_of: dict, wait_s: float = DEATH_WAIT_S) -> None:
        """After a rank's call failed: a GlassrlError naming a rank of this group that died, should one
        be known within ``wait_s`` (its call fails as a dead actor's, or Ray counts its node lost: after
        its health checks fail, 5 × 3 s by default); else nothing (the failure is the rank's own)."""
        ray = import_ray()
        deadline = time.monotonic() + wait_s
        while True:
            for rank, place in enumerate(self.places):
                if place and node_alive(place["node_id"]) is False:
                    raise self._died(rank, None) from None
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5) if pending else ([], [])
            for future in done:
                try:
                    ray.get(future)
                except ray.exceptions.RayActorError as err:
                    raise self._died(rank_of[future], err) from None
                except ray.exceptions.RayError:
                    pass
            if not pending or time.monotonic() > deadline:
                return

    def _on_node(self, rank: int) -> str:
        """ " on node 3eb2b867 (10.0.0.5), lost" for a rank whose node is known ("" before it is)."""
        place = self.places[rank]
        if not place:
            return ""
        return f" on {node_name(place)}" + (", lost with it" if node_alive(place["node_id"]) is False else "")

    def probe(self, timeout_s: float = 10.0) -> None:
        """A GlassrlError naming the first rank found dead (within ``timeout_s``); nothing when none is
        (a rank busy with queued calls answers late, and counts as alive)."""
        ray = import_ray()
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
        ray = import_ray()
        for host in self.hosts:
            ray.kill(host)


def ray_errors() -> tuple[type[BaseException], ...]:
    """Ray's exception classes (for ``except``), Ray imported now."""
    return (import_ray().exceptions.RayError,)


class RayCluster:
    """The groups of a run, placed together ("colocate") or apart ("separate")."""

    def __init__(self, specs: Sequence[RoleSpec], placement: str = "colocate", local: bool = False) -> None:
        """``local``: the cluster was started for this run (ray.address null): fitted (:func:`fit_local`)."""
        ray = import_ray()
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
            pg = placement_group(bundles, strategy=STRATEGIES[specs[0].nodes])  # the actor's (specs[0])
            self.placement_groups.append(pg)
            self._ready(pg, bundles)
            for s in specs:
                self.groups[s.role] = RankGroup(s, pg, range(s.world_size))
        else:
            for s in specs:
                bundles = [_bundle([s.resources])] * s.world_size
                pg = placement_group(bundles, strategy=STRATEGIES[s.nodes])
                self.placement_groups.append(pg)
                self._ready(pg, bundles)
                self.groups[s.role] = RankGroup(s, pg, range(s.world_size))

    @staticmethod
    def _ready(pg: Any, bundles: list[dict[str, float]], timeout_s: float = 120.0) -> None:
        ray = import_ray()
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
