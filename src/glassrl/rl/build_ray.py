"""Build a run's workers on a Ray cluster (``trainer.backend: ray``, docs/scale-out.md).

The driver stays the single controller: it connects to the cluster (``ray.address``, or a
local cluster started here), places one group of Ray actors per role (glassrl.workers.ray:
colocated or separate placement groups) and hands the loop the same :class:`Workers` as
the in-process build (glassrl.rl.build), so the training loop does not change.

What each rank of a group holds is built in its own process by the ``*_rank`` functions
below (module-level, so Ray pickles them by reference), from the same config:

- actor ranks: a DDP replica (or FSDP2 shard) of π_θ (glassrl.workers.data_parallel.DataParallelActor)
  with its optimiser, the rollout sampling with that replica (``ray.rollout.placement:
  with_actor``: the first ``ray.rollout_ranks`` ranks, rank r from the seed ``seed + 1 + r``:
  rank 0 samples as the in-process rollout does) or the sending side of the weight sync
  (``apart``), and under LoRA π_ref (the same model, adapters off);
- rollout ranks (``ray.rollout.placement: apart``): a copy of π_θ loaded from the same checkpoint
  (LoRA: the same adapters on it), sampling from the seed ``seed + 1 + r`` as actor rank r would,
  and the receiving side of the weight sync (glassrl.workers.weight_sync), which actor rank 0
  runs after every actor update and load (glassrl.workers.ray.RayWeightSync); so the apart run
  with k rollout ranks samples what the with_actor run with ``ray.rollout_ranks: k`` samples.
  With ``rollout.max_staleness`` ≥ 1 (asynchronous training) they keep sampling while the actor
  trains: the sync is received in a thread into staged versions, and each batch is sampled with
  the version it names (glassrl.workers.async_rollout; the driver's side: RayAsyncRollout);
- critic ranks: a DDP replica of V (DataParallelCritic); its fresh head is drawn right after
  the rank seeds torch with ``seed``, as the in-process build draws it;
- reference ranks: π_ref, frozen, each rank its rows (no collective);
- reward ranks (``ray.reward``): the reward sources, requests in contiguous chunks.

Checkpoint parts of a trained role: ``actor`` (Hugging Face format, rank 0) and
``actor_state`` (every rank's shards: safetensors and JSON, glassrl.run.sharded); likewise for the critic.

The update: each trained rank receives the one update loop (glassrl.rl.update.run_updates) bound
as the in-process build binds it (glassrl.rl.build.role_update), its ranks being
the rank's DataParallelModel: the same loss, checks (``on_nonfinite``: stop or skip, decided alike
on every rank from values summed over the ranks), on-policy forward outputs (the driver puts each
rank's rows back: glassrl.workers.ray.RayActor.update_on_policy), PPO-ptx (the driver draws
each optimiser step's supervised pairs from its stream and splits them over the ranks) and
model.shared_prefix (every rank's forward passes in the layout; the rows of a prompt that a rank
holds are grouped, so a prompt split over ranks is computed once on each). Not wired
here (the config refuses them: glassrl.rl.checks): FSDP2 with the rollout on the actor's ranks
(sampling from shards is not built; placed apart, the rollout samples from gathered weights).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from glassrl.optim import make_optimizer, optimizer_path, seed_everything
from glassrl.rl.build import (
    Workers,
    build_reward,
    forward_passes,
    lora_settings,
    role_update,
    rollout_engine,
    under_autocast,
    with_lora,
)
from glassrl.rl.config import TrainConfig
from glassrl.rl.config_ray import RayRoleConfig, RayRolloutConfig
from glassrl.rl.loss import actor_forward, critic_forward
from glassrl.rl.ptx import PtxLoss, PtxTerm
from glassrl.rl.resolve import Resolved, critic_path
from glassrl.run import stop
from glassrl.workers.sync_truth import SyncLog

REFERENCE_SYNC = "reference_weights"  # the objects of the reference's weight sync, on both sides


def build_ray_workers(
    cfg: TrainConfig, resolved: Resolved, path: Path, tokenizer, ptx: PtxLoss | None = None
) -> Workers:
    """Groups of Ray actors for the roles ``cfg`` needs, behind the worker interface; ``Workers.close``
    stops them. GlassrlError when the cluster cannot be joined or the groups cannot be placed."""
    from glassrl.models import pad_id
    from glassrl.workers.local import LocalReward
    from glassrl.workers.ray import (
        RayActor,
        RayAsyncRollout,
        RayCritic,
        RayReference,
        RayReward,
        RayRollout,
        RayWeightSync,
    )
    from glassrl.workers.ray_cluster import RayCluster, connect
    from glassrl.workers.ray_nodes import attach_ranks, placement_line

    ray, m = cfg.ray, cfg.model
    ref_sync = cfg.algo.kl.ref_sync_every > 0
    log = SyncLog() if cfg.check.sync else None  # the sync truth check's verdicts (glassrl.workers.sync_truth)
    every = cfg.check.sync_probe_every
    lora_reference = cfg.model.lora is not None and m.reference is None
    apart = ray.rollout.placement == "apart"
    # each rank adds its part of PPO-ptx's term; the driver draws the pairs (RayActor)
    term = None if ptx is None else PtxTerm(ptx.coef, ptx.micro_batch, ptx.pad_id)
    specs = [_spec("actor", ray.actor, partial(actor_rank, cfg, resolved, str(path), term))]
    if apart:
        specs.append(_spec("rollout", ray.rollout, partial(rollout_rank, cfg, str(path))))
    if resolved.uses_reference and not lora_reference:
        specs.append(_spec("reference", ray.reference, partial(reference_rank, cfg, str(m.reference or path))))
    if resolved.uses_critic:
        specs.append(_spec("critic", ray.critic, partial(critic_rank, cfg, resolved, str(path))))
    if ray.reward is not None:
        specs.append(_spec("reward", ray.reward, partial(reward_rank, cfg)))
    with stop.handling():  # ray.init's own SIGTERM handler (sys.exit: the driver aborted with 134) is undone
        connect(ray.address)
    cluster = RayCluster(specs, ray.placement, local=ray.address is None)
    try:
        # every rank sees the run directory (checkpoint shards), and says where it runs (docs/scale-out.md)
        placed = attach_ranks(cluster.groups, Path(cfg.output_dir))
        actors = cluster["actor"]
        pad = pad_id(tokenizer)
        reference = None
        if resolved.uses_reference and lora_reference:
            reference = RayReference(actors)
        elif resolved.uses_reference:  # algo.kl.ref_sync_every: it follows the actor over a weight sync of its own
            group = cluster["reference"]
            device = "cuda" if _device(ray.actor) == _device(ray.reference) == "cuda" else "cpu"
            follows = None
            if ref_sync:
                follows = RayWeightSync(actors, group, device, name=REFERENCE_SYNC, first=False, log=log)
            reference = RayReference(group, sync=follows)
        sync, rollout = None, RayRollout(actors, pad, ranks=ray.rollout_ranks)
        if apart:
            rollouts = cluster["rollout"]
            # NCCL when both sides hold a GPU, else gloo (a GPU actor's buckets staged through the CPU).
            device = "cuda" if _device(ray.actor) == _device(ray.rollout) == "cuda" else "cpu"
            if resolved.max_staleness:  # the ranks sample while the actor trains, and receive in the background
                sync = RayWeightSync(actors, rollouts, device, background=True, log=log, probe_every=every)
                rollout = RayAsyncRollout(rollouts, pad, sync)
            else:
                sync = RayWeightSync(actors, rollouts, device, log=log, probe_every=every)
                rollout = RayRollout(rollouts, pad)
        paths = _rank0(actors, "paths") | (_rank0(cluster["rollout"], "paths") if apart else {})
        if resolved.uses_critic:  # the critic's AdamW kernel, from its rank 0, beside the actor's
            paths["optimiser"] += f"; critic: {_rank0(cluster['critic'], 'paths')['optimiser']}"
        paths["nodes"] = placement_line(placed)
        return Workers(
            actor=RayActor(actors, weight_sync=sync, ptx=ptx),
            rollout=rollout,
            reward=RayReward(cluster["reward"]) if ray.reward is not None else LocalReward(build_reward(cfg)),
            reference=reference,
            critic=RayCritic(cluster["critic"]) if resolved.uses_critic else None,
            stop=cluster.shutdown,
            paths=paths,
            sync_log=log,
        )
    except BaseException:
        cluster.shutdown()
        raise


def _rank0(group, name: str) -> dict[str, str]:
    """Rank 0's object ``name`` of ``group``, a dict (the ranks' "paths": what each built chose)."""
    return group.get([group.hosts[0].call.remote(name, "copy")], ranks=[0])[0]


def _device(group: RayRoleConfig | RayRolloutConfig) -> str:
    return "cuda" if float(group.resources.get("GPU", 0)) > 0 else "cpu"


def _spec(role: str, group: RayRoleConfig | RayRolloutConfig, build):
    from glassrl.workers.ray_cluster import RoleSpec

    resources = {key: float(value) for key, value in group.resources.items()}
    return RoleSpec(role, group.world_size, build, resources=resources, device=_device(group), nodes=group.nodes)


# ---------------------------------------------------------------- what each rank builds (in its process)


def actor_rank(cfg: TrainConfig, resolved: Resolved, path: str, ptx: PtxTerm | None, ctx) -> dict:
    """Rank ``ctx.rank`` of π_θ: "actor" (its replica, optimiser, update; ``ptx``: PPO-ptx's term, on
    the pairs the driver sends), "rollout" (sampling with the replica, on the first ``ray.rollout_ranks``
    ranks) or, with the rollout apart, "weights" (the sending side of the weight sync) and, under LoRA,
    "reference"."""
    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.models.memory import enable_gradient_checkpointing
    from glassrl.models.precision import check_master_weights, compute_dtype
    from glassrl.workers.data_parallel import DataParallelActor, DataParallelModel
    from glassrl.workers.local import LocalRollout
    from glassrl.workers.lora import LoraReference
    from glassrl.workers.weight_sync import WeightSender

    seed_everything(cfg.seed)
    m, a, r = cfg.model, cfg.algo, cfg.rollout
    micro, compute = cfg.batch.micro_batch_responses, compute_dtype(m.compute_dtype)
    tokenizer = load_tokenizer(path)
    load_lm = partial(load_causal_lm, dtype=m.dtype, device=str(ctx.device))
    model, _ = with_lora(load_lm(Path(path)), lora_settings(cfg), Path(path), load_lm)
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    check_master_weights(model, compute)
    _check_layout(cfg, model)
    dp = DataParallelModel(model, ctx, fsdp=cfg.ray.fsdp, compute=m.compute_dtype)
    # After wrapping: under FSDP2 the optimiser must hold the sharded parameters.
    optimizer, scheduler = make_optimizer(dp.module, cfg.actor_optim, resolved.actor_optimizer_steps, "actor_optim")
    shared = m.shared_prefix is True
    # phase 3 logs the entropy
    forward = under_autocast(cfg, partial(actor_forward, r.temperature, True, shared_prefix=shared), dp)
    objects = {
        "actor": DataParallelActor(
            dp,
            tokenizer,
            optimizer,
            scheduler,
            micro_batch=micro,
            update=role_update(cfg, resolved, "actor", ptx, ranks=dp),
            forward=forward,
        )
    }
    # read by the driver's start-up lines
    objects["paths"] = {"optimiser": optimizer_path(optimizer, cfg.actor_optim, "actor_optim")}
    samplers = cfg.ray.rollout_ranks if cfg.ray.rollout_ranks is not None else ctx.world_size
    bucket_bytes, check = int(cfg.ray.rollout.sync_bucket_mb * 2**20), cfg.check.sync
    if cfg.ray.rollout.placement == "apart":
        objects["weights"] = WeightSender(dp.module, ctx.is_main, bucket_bytes, check)
    elif ctx.rank < samplers:
        generator = torch.Generator(ctx.device).manual_seed(cfg.seed + 1 + ctx.rank)
        engine = rollout_engine(cfg, dp.module, tokenizer)
        objects["rollout"] = LocalRollout(engine, generator, compute)
        objects["paths"]["rollout"] = engine.path
    if m.lora is not None and m.reference is None and a.kl.placement != "none":
        objects["reference"] = LoraReference(dp.module, forward_passes(cfg))
    if a.kl.ref_sync_every:  # the sending side of the reference's sync (it follows the actor)
        objects[REFERENCE_SYNC] = WeightSender(dp.module, ctx.is_main, bucket_bytes, check)
    return objects


def rollout_rank(cfg: TrainConfig, path: str, ctx) -> dict:
    """Rank ``ctx.rank`` of the rollout placed apart: "rollout" (sampling with its copy of π_θ, from
    the seed actor rank ``ctx.rank`` would sample from) and "weights" (the copy's side of the sync);
    with rollout.max_staleness ≥ 1 the asynchronous ones (glassrl.workers.async_rollout)."""
    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.models.precision import compute_dtype
    from glassrl.workers.async_rollout import AsyncRolloutRank, BackgroundReceiver, StagedWeights
    from glassrl.workers.local import LocalRollout
    from glassrl.workers.sync_truth import Checker
    from glassrl.workers.weight_sync import ModuleSink, WeightReceiver

    seed_everything(cfg.seed)
    m = cfg.model
    tokenizer = load_tokenizer(path)
    load_lm = partial(load_causal_lm, dtype=m.dtype, device=str(ctx.device))
    model, _ = with_lora(load_lm(Path(path)), lora_settings(cfg), Path(path), load_lm)
    generator = torch.Generator(ctx.device).manual_seed(cfg.seed + 1 + ctx.rank)
    # the sync truth check of this rank's copy (glassrl.workers.sync_truth)
    checker = Checker(model, f"rollout rank {ctx.rank}", tol=cfg.check.sync_probe_tolerance) if cfg.check.sync else None
    k = cfg.max_staleness()
    if k:
        staged = StagedWeights(model, newest_only=cfg.rollout.partial_rollouts, checker=checker)
        engine = rollout_engine(cfg, model, tokenizer, versions=staged)
        rollout = AsyncRolloutRank(LocalRollout(engine, generator, compute_dtype(m.compute_dtype)), staged)
        schedule = "partial rollouts" if cfg.rollout.partial_rollouts else "each batch whole with its version"
        how = f"{engine.path}; asynchronous: up to {k} versions behind, {schedule}"
        return {"rollout": rollout, "weights": BackgroundReceiver(staged), "paths": {"rollout": how}}
    # A vLLM engine samples from its own weights, reloaded from this model when its parameters
    # change (glassrl.rollout.vllm): the sync writes into this model in place.
    engine = rollout_engine(cfg, model, tokenizer)
    rollout = LocalRollout(engine, generator, compute_dtype(m.compute_dtype))
    weights = WeightReceiver(ModuleSink(model), checker)
    return {"rollout": rollout, "weights": weights, "paths": {"rollout": engine.path}}


def critic_rank(cfg: TrainConfig, resolved: Resolved, actor: str, ctx) -> dict:
    """Rank ``ctx.rank`` of V: "critic" (its replica, optimiser, update)."""
    from glassrl.models import load_scalar_model, load_tokenizer
    from glassrl.models.memory import enable_gradient_checkpointing
    from glassrl.models.precision import check_master_weights, compute_dtype
    from glassrl.workers.data_parallel import DataParallelCritic, DataParallelModel

    seed_everything(cfg.seed)  # the fresh head: the draws of the in-process build (glassrl.models.loading)
    m = cfg.model
    load_critic = partial(load_scalar_model, head=m.critic_head, dtype=m.dtype, device=str(ctx.device))
    base = critic_path(cfg, Path(actor))
    model, _ = with_lora(load_critic(base), lora_settings(cfg), base, load_critic)
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    check_master_weights(model, compute_dtype(m.compute_dtype))
    _check_layout(cfg, model)
    dp = DataParallelModel(model, ctx, fsdp=cfg.ray.fsdp, compute=m.compute_dtype)
    optimizer, scheduler = make_optimizer(dp.module, cfg.critic_optim, resolved.total_optimizer_steps, "critic_optim")
    critic = DataParallelCritic(
        dp,
        load_tokenizer(actor),
        optimizer,
        scheduler,
        micro_batch=cfg.batch.micro_batch_responses,
        update=role_update(cfg, resolved, "critic", ranks=dp),
        forward=under_autocast(cfg, partial(critic_forward, shared_prefix=m.shared_prefix is True), dp),
    )
    return {"critic": critic, "paths": {"optimiser": optimizer_path(optimizer, cfg.critic_optim, "critic_optim")}}


def reference_rank(cfg: TrainConfig, path: str, ctx) -> dict:
    """Rank ``ctx.rank`` of π_ref: its rows of each batch; frozen, or (algo.kl.ref_sync_every) following
    the actor: the receiving side of its sync mixes the actor's weights in (MixSink)."""
    from glassrl.models import load_causal_lm
    from glassrl.workers.local import LocalReference
    from glassrl.workers.sync_truth import Checker
    from glassrl.workers.weight_sync import MixSink, WeightReceiver

    m, kl = cfg.model, cfg.algo.kl
    model = load_causal_lm(path, dtype=m.dtype, device=str(ctx.device))
    _check_layout(cfg, model)
    objects = {"reference": LocalReference(model, forward_passes(cfg), synced=kl.ref_sync_every > 0)}
    if kl.ref_sync_every:
        where = f"reference rank {ctx.rank}"
        checker = Checker(model, where, alpha=kl.ref_sync_alpha) if cfg.check.sync else None
        objects[REFERENCE_SYNC] = WeightReceiver(MixSink(model, kl.ref_sync_alpha), checker)
    return objects


def _check_layout(cfg: TrainConfig, model) -> None:
    """model.shared_prefix relies on the model's attention honouring the layout's mask (as in process)."""
    from glassrl.models.shared_prefix import check_shared_prefix

    if cfg.model.shared_prefix is True:
        check_shared_prefix(model)


def reward_rank(cfg: TrainConfig, ctx) -> dict:
    """Rank ``ctx.rank`` of the reward: the combined sources, scoring its chunk of the requests."""
    from glassrl.workers.local import LocalReward

    return {"reward": LocalReward(build_reward(cfg))}
