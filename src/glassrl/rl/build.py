"""Build a run's parts from its config: the in-process role workers (the prompts: glassrl.rl.prompts).

Everything that reads TrainConfig to construct models lives here, so that the
loop only sees workers (glassrl.workers.base). It builds; the config it reads was made concrete,
and the sizes and schedule lengths derived, by glassrl.rl.resolve. The Ray backend's build,
glassrl.rl.build_ray, returns the same :class:`Workers` and reuses the loss and LoRA
helpers below.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from glassrl.algos.kl import AdaptiveKLController, FixedKLController
from glassrl.data.tasks import held_out_split
from glassrl.errors import GlassrlError
from glassrl.optim import make_optimizer, optimizer_path
from glassrl.rl.checks import loss_params
from glassrl.rl.config import (
    AgentConfig,
    KLConfig,
    TrainConfig,
    agent_config,
    off_policy_correction,
)
from glassrl.rl.loss import actor_forward, actor_terms, critic_forward, critic_terms
from glassrl.rl.ptx import PtxLoss, PtxTerm, load_ptx_examples
from glassrl.rl.resolve import Resolved, critic_path
from glassrl.rl.sampling import DynamicSampler, OneRound
from glassrl.rl.update import RoleUpdate
from glassrl.workers.base import ActorWorker, CriticWorker, ReferenceWorker, RewardWorker, RolloutWorker
from glassrl.workers.sync_truth import SyncLog

if TYPE_CHECKING:
    from glassrl.agents import Environment
    from glassrl.data.records import PromptRecord


@dataclass
class Workers:
    """The roles of a run; reference and critic are None when the config needs none."""

    actor: ActorWorker
    rollout: RolloutWorker
    reward: RewardWorker
    reference: ReferenceWorker | None
    critic: CriticWorker | None
    stop: Callable[[], None] | None = None  # releases what the workers hold elsewhere (the Ray backend's processes)
    # the faster paths taken or refused, for the start-up lines ("rollout", "optimiser": an account of each)
    paths: dict[str, str] = field(default_factory=dict)
    # the sync truth check's verdicts, where weights move to a sampler or the reference (glassrl.workers.sync_truth)
    sync_log: SyncLog | None = None

    def close(self) -> None:
        """Release the workers' resources (idempotent); in-process workers hold none."""
        stop, self.stop = self.stop, None
        if stop is not None:
            stop()


def actor_path(cfg: TrainConfig, console) -> Path:
    """model.actor as a checkpoint directory (a directory, or a hub id in the local Hugging Face cache:
    glassrl.models.resolve_model_path); "default", "default-agent" and "default-research" build the
    embedded model if missing."""
    from glassrl.builtin.registry import BUILTIN_MODELS
    from glassrl.models.loading import resolve_model_path

    actor = cfg.model.actor
    path = (
        BUILTIN_MODELS[actor](console=console) if actor in BUILTIN_MODELS else resolve_model_path(actor, "model.actor")
    )
    if not (path / "config.json").is_file():
        raise GlassrlError(f"model.actor = {cfg.model.actor!r}: no Hugging Face checkpoint (config.json) in {path}")
    return path


def kl_controller(kl: KLConfig) -> FixedKLController | AdaptiveKLController:
    """β of the KL term: fixed, or adapted towards ``kl.target`` (Ziegler et al. 2019, §2.2)."""
    return FixedKLController(kl.coef) if kl.target is None else AdaptiveKLController(kl.coef, kl.target, kl.horizon)


def step_sampler(cfg: TrainConfig, pad_id: int) -> OneRound | DynamicSampler:
    """What fills a step's batch: one round of prompts, or DAPO's dynamic sampling (glassrl.rl.sampling)."""
    if cfg.algo.dynamic_sampling:
        return DynamicSampler(cfg.batch.prompts_per_step, cfg.algo.dynamic_sampling_max_rounds, pad_id)
    return OneRound()


def build_reward(cfg: TrainConfig):
    """reward.sources combined (glassrl.rewards.build_combined), a relative file path in them read
    from reward.base_dir (the config file's directory, filled in when the config was loaded)."""
    from glassrl.rewards import build_combined

    return build_combined(cfg.reward.sources, base_dir=cfg.reward.base_dir or ".")


def teacher(workers: Workers, tokenizer):
    """The reward's teacher source and its weight (glassrl.rewards.teacher), checked against the
    policy's tokenizer, or None. In-process only: rl.checks refuses a teacher on Ray."""
    from glassrl.rewards.teacher import find_teacher

    found = find_teacher(getattr(workers.reward, "source", None))
    if found is not None:
        found[0].check_tokenizer(tokenizer)
    return found


def build_gold(cfg: TrainConfig):
    """reward.gold as a reward source (glassrl.rewards), or None: scored on the step's responses
    for the metrics only (glassrl.rl.metrics.gold_metrics), never trained on."""
    from glassrl.rewards.registry import build_source

    if cfg.reward.gold is None:
        return None
    arguments = {k: v for k, v in cfg.reward.gold.items() if k != "name"}
    try:
        return build_source(cfg.reward.gold["name"], arguments, cfg.reward.base_dir or ".")
    except GlassrlError as err:
        raise GlassrlError(f"reward.gold: {err}") from None


def test_spec(cfg: TrainConfig) -> str | None:
    """data.test, or the test split of a task:NAME training set, or None (no evaluation; a
    mixture has no test split of its own)."""
    if cfg.data.test is not None:
        return cfg.data.test
    return held_out_split(cfg.data.train) if isinstance(cfg.data.train, str) else None


def build_ptx(cfg: TrainConfig, resolved: Resolved, tokenizer, max_length: int) -> PtxLoss | None:
    """PPO-ptx's supervised term when algo.ptx_coef > 0: one batch of data.ptx pairs, as many as
    the responses of a mini-batch, per actor optimiser step; a pair is at most ``max_length``
    tokens (the prompt limit + rollout.max_new_tokens: what the model's positions allow)."""
    if cfg.algo.ptx_coef <= 0:
        return None
    from glassrl.models import pad_id

    examples = load_ptx_examples(cfg.data.ptx, tokenizer, max_length)
    return PtxLoss(
        examples,
        cfg.algo.ptx_coef,
        resolved.mini_batch_responses,
        cfg.batch.micro_batch_responses,
        pad_id(tokenizer),
        seed=cfg.seed + 3,
    )


def environment_maker(cfg: TrainConfig, agent: AgentConfig) -> Callable[[], Environment]:
    """A fresh environment per episode (docs/agentic.md): rollout.agent.environment (a bundled
    task's, or the user's ``module:function``), else a ToolEnvironment of rollout.agent.tools, else
    the environment of data.train's agentic task. Relative ``file.py`` paths are read from the
    working directory, as data and reward files are. A bad spec fails here, naming its key."""
    from glassrl.agents import ToolEnvironment, build_tools, environment_factory, task_environment
    from glassrl.cores import usable_cores

    try:
        if agent.environment is not None:
            return environment_factory(
                agent.environment, in_process=agent.environment_in_process, timeout_s=agent.environment_timeout_s
            )
        if agent.tools:
            # built once, every spec checked now; a user's tool runs in worker processes, one per
            # environment stepped at once and at most one per usable core (glassrl.cores)
            processes = max(1, min(agent.tool_workers, usable_cores()))
            tools = build_tools(agent.tools, call_timeout_s=agent.call_timeout_s, processes=processes)
            return partial(
                ToolEnvironment,
                tools,
                call_timeout_s=agent.call_timeout_s,
                max_calls=agent.max_calls,
                max_result_chars=agent.max_result_chars,
                valid_call_reward=agent.valid_call_reward,
            )
    except GlassrlError as err:
        key = "rollout.agent.environment" if agent.environment is not None else "rollout.agent.tools"
        raise GlassrlError(f"{key}: {err}") from None
    return task_environment(cfg.agentic_tasks()[0])


def rollout_engine(cfg: TrainConfig, model, tokenizer, versions=None, shared=None):
    """The RolloutEngine sampling with ``model``: multi-turn with tools when the run is agentic
    (:func:`glassrl.rl.config.agent_config`), else Hugging Face decoding, or vLLM with
    ``rollout.engine: vllm`` (its weights synchronised from ``model`` before each rollout).
    Responses stop at the tokenizer's, the model's and the chat template's stop tokens and at
    ``rollout.stop`` (glassrl.rollout.stops). It keeps its own log-probs (``rollout_logprobs``) when
    an off-policy correction reads them, or when it samples for asynchronous training: ``versions``
    (glassrl.rollout.base.PolicyVersions), whose version it records on each token. ``shared``: a
    VLLMRolloutEngine whose vLLM engine samples for this one too, its weights following ``model``
    (VLLMRolloutEngine.following: one KV cache) instead of a second one; the vLLM engine always keeps
    its log-probs."""
    from glassrl.agents import AgentRolloutEngine, HFTurnSampler
    from glassrl.rollout.hf import HFRolloutEngine
    from glassrl.rollout.stops import stop_set

    agent = agent_config(cfg)
    stops = stop_set(tokenizer, getattr(model, "generation_config", None), cfg.rollout.stop)
    vllm = None
    if cfg.rollout.engine == "vllm":
        from glassrl.rollout.vllm import VLLMRolloutEngine

        v = cfg.rollout.vllm
        vllm = (
            shared.following(model, versions)
            if shared is not None
            else VLLMRolloutEngine.colocated(
                model,
                tokenizer,
                gpu_memory_utilization=v.gpu_memory_utilization,
                sleep=v.sleep,
                seed=cfg.seed,
                stops=stops,
                versions=versions,
            )
        )
        if agent is None:
            return vllm
    # the engine's log-probs log μ: rollout/logprob_diff_*, the corrections, a stale batch's π_old
    keep = (
        off_policy_correction(cfg.algo) is not None
        or versions is not None
        or vllm is not None
        or cfg.rollout.sampling_logprobs
    )
    if agent is None:
        return HFRolloutEngine(model, tokenizer, sampling_logprobs=keep, stops=stops, versions=versions)
    if vllm is not None:  # multi-turn episodes, each turn sampled by vLLM (glassrl.agents.vllm_turns)
        from glassrl.agents.vllm_turns import VLLMTurnSampler

        sampler = VLLMTurnSampler(vllm)
    elif versions is None:
        sampler = HFTurnSampler(model, tokenizer, stops)
    else:
        sampler = HFTurnSampler(model, tokenizer, stops, versions)
    if agent.endpoint is not None:
        return endpoint_engine(cfg, agent, sampler, tokenizer, keep)
    return AgentRolloutEngine(
        sampler,
        tokenizer,
        environment_maker(cfg, agent),
        call_format=agent.call_format,
        describe_tools=agent.describe_tools,
        max_turns=agent.max_turns,
        tool_workers=agent.tool_workers,
        sampling_logprobs=keep,
    )


def endpoint_engine(cfg: TrainConfig, agent: AgentConfig, sampler, tokenizer, keep: bool):
    """The user's agent program over the OpenAI-compatible endpoint (rollout.agent.endpoint), served by
    ``sampler``; the agent function is loaded here, so that a bad spec fails at once, naming its key."""
    from glassrl.agents.endpoint import EndpointRolloutEngine
    from glassrl.agents.registry import load_attribute
    from glassrl.models.chat_rendering import applies_template

    e = agent.endpoint
    program = e.command
    if e.agent is not None:
        try:
            program = load_attribute(e.agent, ".", "agent")
        except GlassrlError as err:
            raise GlassrlError(f"rollout.agent.endpoint.agent: {err}") from None
        if not callable(program):
            raise GlassrlError(
                f"rollout.agent.endpoint.agent: {e.agent!r} is a {type(program).__name__}, not a function"
            )
    return EndpointRolloutEngine(
        sampler,
        tokenizer,
        program,
        call_format=agent.call_format,
        describe_tools=agent.describe_tools,
        chat=applies_template(tokenizer, cfg.data.chat_template),
        on_rewrite=e.on_rewrite,
        timeout_s=e.timeout_s,
        sampling_logprobs=keep,
    )


def prompt_format(cfg: TrainConfig, tokenizer) -> Callable[[Sequence[PromptRecord]], list[list[int]]] | None:
    """How the run's prompts become token ids when the run is agentic: with the environment's tools
    rendered in, as the call format writes them (glassrl.agents.agent_prompt_ids); None for
    a single-turn run (the prompt alone, glassrl.data.formatting.format_prompts)."""
    from glassrl.agents import agent_prompt_ids, build_call_format

    agent = agent_config(cfg)
    if agent is None or agent.endpoint is not None and agent.environment is None and not cfg.agentic_tasks():
        return None  # single-turn, or the agent brings its tools: the prompt alone
    call_format = build_call_format(tokenizer, agent.call_format, describe_tools=agent.describe_tools)
    return partial(agent_prompt_ids, call_format, environment_maker(cfg, agent))


def lora_settings(cfg: TrainConfig):
    """model.lora as glassrl.models.lora.LoraSettings, or None (every weight trains)."""
    return None if cfg.model.lora is None else cfg.model.lora.settings()


def with_lora(model, settings, base: Path, load_base: Callable[[Path], torch.nn.Module]):
    """(``model`` with LoRA adapters, the ``load`` of its checkpoint part: the saved adapters on a
    fresh base); without ``settings``, ``model`` and ``load_base`` unchanged."""
    from glassrl.models.lora import apply_lora, load_lora_model

    if settings is None:
        return model, load_base
    try:
        adapted = apply_lora(model, settings, base)
    except GlassrlError as err:  # "lora.target_modules = ..." -> the config's key
        raise GlassrlError(f"model.{err}") from None
    return adapted, partial(load_lora_model, settings=settings, load_base=load_base)


def actor_loss(cfg: TrainConfig, resolved: Resolved) -> list:
    """The actor's loss terms (glassrl.rl.loss.actor_terms) as the config chooses them."""
    a = cfg.algo
    return actor_terms(
        policy_loss=a.policy_loss,
        params=loss_params(a),
        loss_agg=a.loss_agg,
        norm_length=resolved.norm_length,
        kl_in_loss=a.kl.kind if a.kl.placement == "loss" else None,
        kl_coef=a.kl.coef,
        entropy_coef=a.entropy_coef,
        positive_nll_coef=a.positive_nll_coef,
    )


def critic_loss(cfg: TrainConfig, resolved: Resolved) -> list:
    """The critic's loss terms (glassrl.rl.loss.critic_terms)."""
    a = cfg.algo
    return critic_terms(value_clip=a.value_clip, loss_agg=a.loss_agg, norm_length=resolved.norm_length)


def role_update(cfg: TrainConfig, resolved: Resolved, role: str, ptx: PtxTerm | None = None, ranks=None) -> RoleUpdate:
    """The update of ``role`` ("actor" or "critic"): the one update loop (glassrl.rl.update.RoleUpdate)
    with the config's loss, micro-batch, clipping, forward layout, PPO-ptx term (the actor's) and
    non-finite policy. ``ranks``: a Ray rank's data-parallel group (glassrl.rl.build_ray), None in one
    process. What a worker calls to update (LocalActor, LocalCritic; DataParallelActor, DataParallelCritic)."""
    shared = cfg.model.shared_prefix is True
    layout = dict(packed=cfg.model.padding_free, shared_prefix=shared)
    if role == "actor":
        forward = partial(actor_forward, cfg.rollout.temperature, cfg.algo.entropy_coef > 0, **layout)
        terms, optim = actor_loss(cfg, resolved), cfg.actor_optim
    else:
        forward, terms, optim = partial(critic_forward, **layout), critic_loss(cfg, resolved), cfg.critic_optim
    return RoleUpdate(
        prefix=role,
        forward=under_autocast(cfg, forward, ranks),
        terms=terms,
        micro_batch=cfg.batch.micro_batch_responses,
        max_tokens=cfg.batch.max_tokens_per_micro_batch,
        packed=cfg.model.padding_free or shared,
        grad_clip=optim.grad_clip,
        on_nonfinite=cfg.on_nonfinite,
        shared_prefix=shared,
        ptx=ptx,
        ranks=ranks,
    )


def under_autocast(cfg: TrainConfig, forward: Callable, ranks=None) -> Callable:
    """``forward`` under model.compute_dtype's autocast (glassrl.models.precision.Autocast), in one
    process and on DDP ranks; on the ranks of ``ray.fsdp`` as it is (FSDP2's MixedPrecisionPolicy
    casts the parameters; autocast would cast twice)."""
    from glassrl.models.precision import Autocast

    return forward if ranks is not None and cfg.ray.fsdp else Autocast(forward, cfg.model.compute_dtype)


def forward_passes(cfg: TrainConfig):
    """The run's :class:`~glassrl.workers.local.Passes`: every role's forward passes without gradient
    (micro-batch, sampling temperature, model.compute_dtype, padding_free, shared_prefix); also what
    ``glassrl explain --model`` recomputes with."""
    from glassrl.models.precision import compute_dtype
    from glassrl.workers.local import Passes

    m = cfg.model
    return Passes(
        micro_batch=cfg.batch.micro_batch_responses,
        max_tokens=cfg.batch.max_tokens_per_micro_batch,
        temperature=cfg.rollout.temperature,
        compute=compute_dtype(m.compute_dtype),
        packed=m.padding_free,
        shared_prefix=m.shared_prefix is True,  # "auto" is made concrete first (with_shared_prefix)
    )


def build_local_workers(
    cfg: TrainConfig, resolved: Resolved, path: Path, tokenizer, ptx: PtxLoss | None = None
) -> Workers:
    """In-process workers; the rollout samples with the actor's own model; ``ptx`` joins the actor's updates.

    model.compute_dtype: forward passes under autocast over float32 master weights
    (glassrl.models.precision). model.lora: adapters on the actor (and critic); π_ref is then the
    actor's own model with its adapters off (glassrl.workers.lora), unless model.reference names one.
    model.padding_free: every forward pass on the real tokens only (glassrl.models.packing), once
    checked on each model (check_packing). model.shared_prefix: every forward pass computes each
    distinct prompt once per chunk (glassrl.models.shared_prefix), once checked on each model
    (check_shared_prefix). rollout.max_staleness 1 (rollout.overlap): the rollout worker samples the
    rounds requested ahead with a copy of the policy, in a thread (glassrl.workers.overlap).
    """
    from glassrl.models import load_causal_lm, load_scalar_model
    from glassrl.models.memory import enable_gradient_checkpointing
    from glassrl.models.packing import check_packing
    from glassrl.models.precision import check_master_weights
    from glassrl.models.shared_prefix import check_shared_prefix
    from glassrl.workers.local import LocalActor, LocalCritic, LocalReference, LocalReward, LocalRollout
    from glassrl.workers.lora import LoraReference
    from glassrl.workers.overlap import OverlapRollout

    m = cfg.model
    passes = forward_passes(cfg)
    compute, packed, shared = passes.compute, passes.packed, passes.shared_prefix
    lora = lora_settings(cfg)

    def check_layout(model) -> None:  # the packed layouts rely on the model's attention honouring them
        if packed:
            check_packing(model)
        if shared:
            check_shared_prefix(model)

    load_lm = partial(load_causal_lm, dtype=m.dtype, device=m.device)
    # prompt limit + rollout.max_new_tokens fit its positions: glassrl.rl.prompts
    model, load_actor = with_lora(load_lm(path), lora, path, load_lm)
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    check_master_weights(model, compute)
    check_layout(model)
    optimizer, scheduler = make_optimizer(model, cfg.actor_optim, resolved.actor_optimizer_steps, "actor_optim")
    actor = LocalActor(
        model,
        tokenizer,
        optimizer,
        scheduler,
        passes=passes,
        update=role_update(cfg, resolved, "actor", ptx),
        load=load_actor,
    )
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(cfg.seed + 1)
    engine = rollout_engine(cfg, model, tokenizer)
    rollout = LocalRollout(engine, generator, compute)
    paths = {"rollout": engine.path, "optimiser": optimizer_path(optimizer, cfg.actor_optim, "actor_optim")}
    stop = rollout.close  # the engine's environment workers or endpoint server (glassrl.rollout.base.close_engine)
    log = SyncLog() if cfg.check.sync else None  # the sync truth check: what moves here is checked
    if log is not None and hasattr(engine, "last_sync"):  # vLLM: the engine's own verified syncs, counted
        log.follow(engine)
    if resolved.max_staleness == 1:  # a copy of the policy samples rounds ahead in a thread (glassrl.workers.overlap)
        own = partial(rollout_engine, cfg, tokenizer=copy.deepcopy(tokenizer))  # its own tokenizer: no sharing
        if cfg.rollout.engine == "vllm":  # the same vLLM engine, its weights following the copy (one KV cache)
            own = partial(own, shared=getattr(getattr(engine, "sampler", None), "engine", engine))  # agents: the turns'
        rollout = OverlapRollout(rollout, actor, own, passes, log=log)
        stop = rollout.close
        paths["rollout"] += "; asynchronous: 1 version behind, a copy of the policy sampling in a thread"
    reference = None
    if resolved.uses_reference and lora is not None and m.reference is None:
        reference = LoraReference(model, passes)
    elif resolved.uses_reference:
        ref_model = load_lm(m.reference or path)
        if m.reference is not None:  # otherwise the actor's own checkpoint, checked above
            check_layout(ref_model)
        kl = cfg.algo.kl  # ref_sync_every: π_ref follows the actor's model
        reference = LocalReference(
            ref_model, passes, synced=kl.ref_sync_every > 0, actor=model, alpha=kl.ref_sync_alpha, log=log
        )
    critic = None
    if resolved.uses_critic:
        load_critic = partial(load_scalar_model, head=m.critic_head, dtype=m.dtype, device=m.device)
        base = critic_path(cfg, path)
        critic_model, load_critic_part = with_lora(load_critic(base), lora, base, load_critic)
        if m.gradient_checkpointing:
            enable_gradient_checkpointing(critic_model)
        check_master_weights(critic_model, compute)
        check_layout(critic_model)
        c_opt, c_sched = make_optimizer(critic_model, cfg.critic_optim, resolved.total_optimizer_steps, "critic_optim")
        critic = LocalCritic(
            critic_model,
            tokenizer,
            c_opt,
            c_sched,
            passes=passes,
            update=role_update(cfg, resolved, "critic"),
            load=load_critic_part,
        )
        paths["optimiser"] += f"; critic: {optimizer_path(c_opt, cfg.critic_optim, 'critic_optim')}"
    return Workers(actor, rollout, LocalReward(build_reward(cfg)), reference, critic, stop, paths, log)
