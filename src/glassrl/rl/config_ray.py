"""Where a run's roles run: ``trainer.backend`` (in this process, or Ray) and the Ray backend's
``ray.*`` sections (glassrl.workers.ray, glassrl.rl.build_ray; docs/scale-out.md). Sections of
glassrl.rl.config.TrainConfig, which checks them (glassrl.rl.checks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from glassrl.config import option


@dataclass
class TrainerConfig:
    backend: Literal["local", "ray"] = option(
        "local", help="local: every role in this process; ray: roles as groups of Ray actors (docs/scale-out.md)"
    )


@dataclass
class RayRoleConfig:
    """One role's group on the Ray cluster: data-parallel ranks, each with its resources."""

    world_size: int = option(
        1, help="ranks of the role (one process each; one torch.distributed group: gloo on CPU, NCCL on GPU)"
    )
    resources: dict[str, float] = option(
        factory=lambda: {"CPU": 1.0}, help="per rank, Ray resources: {CPU: 1}, {GPU: 1, CPU: 4}, ..."
    )
    nodes: Literal["pack", "spread"] = option(
        "pack",
        help=(
            "over the cluster's nodes (Ray's placement group strategy): pack = as few nodes as hold the ranks; "
            "spread = each rank on another node where there are enough (the gloo/NCCL group then spans them); "
            "under ray.placement = colocate one placement group holds every role: ray.actor.nodes places it"
        ),
    )


@dataclass
class RayRolloutConfig:
    """Where π_θ samples under the Ray backend: on the actor's ranks, with their replicas, or on
    ranks of its own, each with a copy of π_θ that the actor updates after every change (weight
    sync, glassrl.workers.weight_sync; docs/scale-out.md)."""

    placement: Literal["with_actor", "apart"] = option(
        "with_actor",
        help=(
            "with_actor (the default, except with rollout.max_staleness >= 1, which samples apart): the first "
            "ray.rollout_ranks actor ranks sample with their replicas; apart: the ranks below, each with its copy of "
            "π_θ, which actor rank 0 broadcasts to after every update and load"
        ),
    )
    world_size: int = option(
        1,
        help=(
            "apart: sampling ranks (prompts in contiguous chunks; rank r samples as actor rank r would with "
            "ray.rollout_ranks = world_size)"
        ),
    )
    resources: dict[str, float] = option(
        factory=lambda: {"CPU": 1.0},
        help=(
            "apart: per rank, Ray resources; NCCL for the weight sync when actor and rollout ranks hold a GPU each, "
            "else gloo"
        ),
    )
    nodes: Literal["pack", "spread"] = option(
        "pack",
        help=(
            "over the cluster's nodes (Ray's placement group strategy): pack = as few nodes as hold the ranks; "
            "spread = each rank on another node where there are enough (the gloo/NCCL group then spans them); "
            "with ray.placement = separate (under colocate, ray.actor.nodes places every role)"
        ),
    )
    sync_bucket_mb: float = option(
        256.0,
        help=(
            "apart: the weight sync packs parameters into flat buffers of at most this size, one broadcast each "
            "(fewer collectives against a buffer of this size on both sides)"
        ),
    )


@dataclass
class RayConfig:
    """The Ray backend (glassrl.workers.ray, glassrl.rl.build_ray); read when trainer.backend = ray."""

    address: str | None = option(
        None, help="null: start a Ray cluster of its own (never RAY_ADDRESS's); \"auto\", \"HOST:6379\": join one"
    )
    placement: Literal["colocate", "separate"] = option(
        "colocate", help="colocate: rank r of every role shares bundle r; separate: a placement group per role"
    )
    fsdp: bool = option(
        False,
        help=(
            "FSDP2 shards instead of DDP replicas (needs ray.rollout.placement = apart: sampling from shards is not "
            "built)"
        ),
    )
    rollout_ranks: int | None = option(
        None,
        help=(
            "with ray.rollout.placement = with_actor: actor ranks that sample (the first k); null = all; 1 = rank 0 "
            "samples with the in-process seed (same responses as trainer.backend = local)"
        ),
    )
    rollout: RayRolloutConfig = option(
        factory=RayRolloutConfig, help="where π_θ samples: on the actor's ranks, or on ranks of its own kept in sync"
    )
    actor: RayRoleConfig = option(
        factory=RayRoleConfig,
        help="the policy's ranks (they sample too unless ray.rollout.placement = apart, and hold π_ref under LoRA)",
    )
    critic: RayRoleConfig = option(
        factory=RayRoleConfig, help="the value model's ranks (when the estimator reads values)"
    )
    reference: RayRoleConfig = option(
        factory=RayRoleConfig, help="π_ref's ranks (when a KL term needs it and LoRA does not give it)"
    )
    reward: RayRoleConfig | None = option(
        None,
        help=(
            "reward sources scored on these ranks; null = in the driver (user functions still run in their timeout "
            "workers)"
        ),
    )
