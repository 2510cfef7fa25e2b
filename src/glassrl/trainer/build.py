"""Build a run's parts from its config: prompts, and the in-process role workers.

Everything that reads TrainConfig to construct models lives here, so that the
loop only sees workers (glassrl.workers.base). A Ray build will sit beside
``build_local_workers`` with the same return type.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from glassrl.data.records import PromptRecord
from glassrl.data.tasks import held_out_split, load_task, parse_task
from glassrl.errors import GlassrlError
from glassrl.trainer.common import make_optimizer
from glassrl.trainer.config import Resolved, TrainConfig, loss_params
from glassrl.trainer.ptx import PtxLoss, load_ptx_examples
from glassrl.trainer.update import actor_forward, actor_terms, critic_forward, critic_terms, run_updates
from glassrl.workers.base import ActorWorker, CriticWorker, ReferenceWorker, RewardWorker, RolloutWorker


@dataclass
class Workers:
    """The roles of a run; reference and critic are None when the config needs none."""

    actor: ActorWorker
    rollout: RolloutWorker
    reward: RewardWorker
    reference: ReferenceWorker | None
    critic: CriticWorker | None


def actor_path(cfg: TrainConfig, console) -> Path:
    """model.actor as a checkpoint directory; "default" builds the embedded default model if missing."""
    from glassrl.trainer.default_model import ensure_default_model

    path = ensure_default_model(console=console) if cfg.model.actor == "default" else Path(cfg.model.actor)
    if not (path / "config.json").is_file():
        raise GlassrlError(f"model.actor = {cfg.model.actor!r}: no Hugging Face checkpoint (config.json) in {path}")
    return path


def critic_path(cfg: TrainConfig, actor: Path) -> Path:
    """Where the critic starts: model.critic; the actor (a fresh scalar head on its body) when
    null; ``reward_model``: the reward_model source's checkpoint, its scalar head included, so
    that V(s_i) starts from the reward model's reading of the text (InstructGPT, Ouyang et al.
    2022, §3.5: "The value function is initialized from the RM"). The config check made sure
    the heads agree."""
    if cfg.model.critic is None:
        return actor
    if cfg.model.critic == "reward_model":
        i, source = next((i, s) for i, s in enumerate(cfg.reward.sources) if s.get("name") == "reward_model")
        if "path" not in source:
            raise GlassrlError(f"reward.sources[{i}].path: missing (model.critic = reward_model loads it)")
        return Path(source["path"])
    return Path(cfg.model.critic)


def build_gold(cfg: TrainConfig):
    """reward.gold as a reward source (glassrl.rewards), or None: scored on the step's responses
    for the metrics only (glassrl.trainer.step_metrics.gold_metrics), never trained on."""
    from glassrl.rewards import build_reward_source

    if cfg.reward.gold is None:
        return None
    arguments = {k: v for k, v in cfg.reward.gold.items() if k != "name"}
    try:
        return build_reward_source(cfg.reward.gold["name"], **arguments)
    except GlassrlError as err:
        raise GlassrlError(f"reward.gold: {err}") from None


def load_records(spec: str, split: str, tokenizer, max_prompt_tokens: int, key: str) -> list[PromptRecord]:
    """Prompts of ``spec``: "task:NAME[/SPLIT]" (``split`` by default) or a dataset path;
    prompts longer than ``max_prompt_tokens`` tokens are dropped."""
    from glassrl.data.datasets import load_prompts, prompt_token_count

    if (ref := parse_task(spec, split=split)) is not None:
        records = load_task(ref.name, ref.split)
        records = [r for r in records if prompt_token_count(r.prompt, tokenizer) <= max_prompt_tokens]
    else:
        records = load_prompts(spec, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens)
    if not records:
        raise GlassrlError(
            f"{key} = {spec!r}: no prompt of at most data.max_prompt_tokens = {max_prompt_tokens} tokens"
        )
    return records


def test_spec(cfg: TrainConfig) -> str | None:
    """data.test, or the test split of a task:NAME training set, or None (no evaluation)."""
    if cfg.data.test is not None:
        return cfg.data.test
    return held_out_split(cfg.data.train)


def build_ptx(cfg: TrainConfig, resolved: Resolved, tokenizer) -> PtxLoss | None:
    """PPO-ptx's supervised term when algo.ptx_coef > 0: one batch of data.ptx pairs, as many as
    the responses of a mini-batch, per actor optimiser step."""
    if cfg.algo.ptx_coef <= 0:
        return None
    max_length = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens  # what the model's positions allow
    examples = load_ptx_examples(cfg.data.ptx, tokenizer, max_length)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return PtxLoss(
        examples,
        cfg.algo.ptx_coef,
        resolved.mini_batch_responses,
        cfg.batch.micro_batch_responses,
        pad_id,
        seed=cfg.seed + 3,
    )


def build_local_workers(
    cfg: TrainConfig, resolved: Resolved, path: Path, tokenizer, ptx: PtxLoss | None = None
) -> Workers:
    """In-process workers; the rollout samples with the actor's own model; ``ptx`` joins the actor's updates."""
    from glassrl.models import load_causal_lm, load_scalar_model
    from glassrl.rewards import build_combined
    from glassrl.rollout.hf import HFRolloutEngine
    from glassrl.workers.local import LocalActor, LocalCritic, LocalReference, LocalReward, LocalRollout

    m, a, r = cfg.model, cfg.algo, cfg.rollout
    micro = cfg.batch.micro_batch_responses
    load_lm = partial(load_causal_lm, dtype=m.dtype, device=m.device)
    model = load_lm(path)
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is not None and cfg.data.max_prompt_tokens + r.max_new_tokens > positions:
        raise GlassrlError(
            f"data.max_prompt_tokens + rollout.max_new_tokens = {cfg.data.max_prompt_tokens} + {r.max_new_tokens} "
            f"is more than the model's {positions} positions ({path})"
        )
    actor_steps = (cfg.steps - a.value_warmup_steps) * resolved.optimizer_steps_per_step
    optimizer, scheduler = make_optimizer(model, cfg.actor_optim, actor_steps)
    terms = actor_terms(
        policy_loss=a.policy_loss,
        params=loss_params(a),
        loss_agg=a.loss_agg,
        norm_length=resolved.norm_length,
        kl_in_loss=a.kl.kind if a.kl.placement == "loss" else None,
        kl_coef=a.kl.coef,
        entropy_coef=a.entropy_coef,
        positive_nll_coef=a.positive_nll_coef,
    )
    update = partial(
        run_updates,
        micro_batch=micro,
        grad_clip=cfg.actor_optim.grad_clip,
        forward=partial(actor_forward, r.temperature, a.entropy_coef > 0),
        terms=terms,
        prefix="actor",
        ptx=ptx,
    )
    actor = LocalActor(
        model,
        tokenizer,
        optimizer,
        scheduler,
        temperature=r.temperature,
        micro_batch=micro,
        update=update,
        load=load_lm,
    )
    device = next(model.parameters()).device
    rollout = LocalRollout(HFRolloutEngine(model, tokenizer), torch.Generator(device).manual_seed(cfg.seed + 1))
    reference = None
    if resolved.uses_reference:
        reference = LocalReference(load_lm(m.reference or path), temperature=r.temperature, micro_batch=micro)
    critic = None
    if resolved.uses_critic:
        load_critic = partial(load_scalar_model, head=m.critic_head, dtype=m.dtype, device=m.device)
        critic_model = load_critic(critic_path(cfg, path))
        c_opt, c_sched = make_optimizer(critic_model, cfg.critic_optim, resolved.total_optimizer_steps)
        c_update = partial(
            run_updates,
            micro_batch=micro,
            grad_clip=cfg.critic_optim.grad_clip,
            forward=critic_forward,
            terms=critic_terms(value_clip=a.value_clip, loss_agg=a.loss_agg, norm_length=resolved.norm_length),
            prefix="critic",
        )
        critic = LocalCritic(
            critic_model, tokenizer, c_opt, c_sched, micro_batch=micro, update=c_update, load=load_critic
        )
    return Workers(actor, rollout, LocalReward(build_combined(cfg.reward.sources)), reference, critic)
