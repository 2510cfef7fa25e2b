"""The one resolve step: a checked TrainConfig made concrete, and everything derived from it.

    cfg = load_config(TrainConfig, "examples/grpo.yaml")  # checked by the loader
    resolved = resolve(cfg)        # checked again, made concrete, every size derived
    print_resolved(resolved, console)
    resolved = resolve_layout(resolved, actor_path, resumed)  # model.shared_prefix, once the actor is on disk

Concrete: what the config leaves to glassrl becomes what runs, so that config.yaml and every
checkpoint record it: a model named by a run or checkpoint becomes that model's directory (a warm
start), ray.rollout.placement where π_θ samples, model.dtype and model.compute_dtype "auto" the
precision of the policy's device, model.shared_prefix "auto" on or off (it reads the models'
checkpoints, so it comes last: :func:`resolve_layout`). :func:`saved_in_todays_terms` reads a
checkpoint's config written before one of these existed as what it meant then.

Sizes have units (DESIGN §3: one way to say a batch size):
- ``batch.prompts_per_step`` prompts per training step (global); each is sampled
  ``rollout.n`` times, so a step holds ``prompts_per_step × n`` responses;
- ``batch.mini_batch_prompts`` prompts per optimiser step (× n responses);
- ``batch.micro_batch_responses`` responses per forward/backward pass (per worker);
  micro-batches of one mini-batch accumulate gradients.
Optimiser settings count optimiser steps (``epochs × mini-batches`` per training step): the critic's
schedule runs every step's, the actor's all but the value warm-up's.

The checks (glassrl.rl.checks) only check and the build (glassrl.rl.build) only builds: each reads
the config this step made concrete, and the settings derived here (:class:`Resolved`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from transformers import AutoConfig

from glassrl import config_paths
from glassrl.config import flatten, safe_load, to_dict
from glassrl.errors import GlassrlError
from glassrl.models.loading import resolve_device, resolve_model_path
from glassrl.models.shared_prefix import full_attention
from glassrl.rl.config import KLConfig, ModelConfig, TrainConfig, off_policy_correction
from glassrl.run.open import ACTOR, CRITIC, model_in_run

DATA_PATHS = ("data.train", "data.test", "data.ptx")  # the config keys naming data files (glassrl.config_paths)
# reward sources whose ``path`` names a model, and the part of a run's checkpoint it means
MODEL_SOURCES = {"reward_model": CRITIC, "teacher": ACTOR}


@dataclass(frozen=True)
class Resolved:
    """The run's config made concrete, and every size and derived setting the run uses, derived once
    (see module docstring)."""

    cfg: TrainConfig  # made concrete (module docstring); model.shared_prefix once resolve_layout has run
    responses_per_step: int  # prompts_per_step × n
    mini_batch_responses: int  # mini_batch_prompts × n
    mini_batches_per_epoch: int  # prompts_per_step / mini_batch_prompts
    grad_accum_steps: int  # mini_batch_responses / micro_batch_responses
    optimizer_steps_per_step: int  # epochs × mini_batches_per_epoch
    total_optimizer_steps: int  # steps × optimizer_steps_per_step
    uses_critic: bool  # the estimator reads values
    uses_reference: bool  # a KL term needs π_ref
    norm_length: int  # L of seq-mean-token-sum-norm
    actor_optimizer_steps: int  # the actor's schedule: (steps − value warm-up steps) × optimizer_steps_per_step
    max_staleness: int  # policy versions a sampled token may lag (rollout.overlap: 1)
    correction: tuple[str, dict[str, float]] | None  # the off-policy correction (name, knobs); None = none
    warm_start: tuple[str, ...] = ()  # start-up lines: the models loaded from a run or checkpoint
    layout: str = ""  # why model.shared_prefix is what it is (resolve_layout), for the start-up lines

    title = "glassrl train: resolved sizes"

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, value, unit) for the resolved table."""
        c = self.cfg
        rows = [
            ("training steps", f"{c.steps}", "steps"),
            ("prompts per step", f"{c.batch.prompts_per_step}", "prompts, global"),
            ("samples per prompt (n)", f"{c.rollout.n}", "responses per prompt"),
            ("responses per step", f"{self.responses_per_step}", "responses, global"),
            ("mini-batch", f"{c.batch.mini_batch_prompts}", "prompts, per optimiser step"),
            ("mini-batch", f"{self.mini_batch_responses}", "responses, per optimiser step"),
            ("mini-batches per epoch", f"{self.mini_batches_per_epoch}", "optimiser steps per epoch"),
            ("epochs", f"{c.batch.epochs}", "passes over a step's responses"),
            ("micro-batch", f"{c.batch.micro_batch_responses}", "responses, per micro-batch, per worker"),
            ("gradient accumulation", f"{self.grad_accum_steps}", "micro-batches per optimiser step"),
            ("optimiser steps per step", f"{self.optimizer_steps_per_step}", "optimiser steps, per training step"),
            ("optimiser steps in all", f"{self.total_optimizer_steps}", "optimiser steps, whole run"),
            ("max response length", f"{c.rollout.max_new_tokens}", "tokens, per response"),
            ("max prompt length", _prompt_limit_text(c), f"tokens, per prompt; longer: {c.data.overlong_prompts}"),
            ("advantage estimator", c.algo.advantage, "critic: " + ("yes" if self.uses_critic else "no")),
            ("policy loss", f"{c.algo.policy_loss} / {c.algo.loss_agg}", "loss / aggregation"),
            ("KL", _kl_text(c.algo.kl), "placement (estimator, β)"),
            *c.actor_optim.rows("actor "),
        ]
        return rows + (c.critic_optim.rows("critic ") if self.uses_critic else [])


def resolve(cfg: TrainConfig) -> Resolved:
    """``cfg`` checked (:meth:`TrainConfig.validate`), made concrete (:func:`with_warm_start`,
    :func:`with_placement`, :func:`with_precision`), and every size and derived setting.

    Raises GlassrlError naming the key, its value and the rule it breaks.
    """
    cfg.validate()
    cfg, warm = with_warm_start(cfg)
    cfg = with_precision(with_placement(cfg))
    b, n = cfg.batch, cfg.rollout.n
    mini_responses = b.mini_batch_prompts * n
    mini_batches = b.prompts_per_step // b.mini_batch_prompts
    a = cfg.algo
    return Resolved(
        cfg=cfg,
        responses_per_step=b.prompts_per_step * n,
        mini_batch_responses=mini_responses,
        mini_batches_per_epoch=mini_batches,
        grad_accum_steps=mini_responses // b.micro_batch_responses,
        optimizer_steps_per_step=b.epochs * mini_batches,
        total_optimizer_steps=cfg.steps * b.epochs * mini_batches,
        uses_critic=a.uses_critic(),
        uses_reference=a.kl.placement != "none",
        norm_length=a.norm_length if a.norm_length is not None else cfg.rollout.max_new_tokens,
        actor_optimizer_steps=(cfg.steps - a.value_warmup_steps) * b.epochs * mini_batches,
        max_staleness=cfg.max_staleness(),
        correction=off_policy_correction(a),
        warm_start=tuple(warm),
    )


def resolve_layout(resolved: Resolved, actor: Path, resumed: Path | None = None) -> Resolved:
    """``resolved`` with model.shared_prefix made concrete (:func:`with_shared_prefix`), the one
    setting that reads the models' checkpoints (``actor``: the policy's, which may have to be built
    first), and why (``layout``)."""
    cfg, why = with_shared_prefix(resolved.cfg, actor, resumed)
    return dataclasses.replace(resolved, cfg=cfg, layout=why)


def with_placement(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with ray.rollout.placement where π_θ samples (:meth:`TrainConfig.rollout_placement`:
    apart when sampling ahead on Ray), so that config.yaml records it."""
    ray = cfg.ray
    rollout = dataclasses.replace(ray.rollout, placement=cfg.rollout_placement())
    return dataclasses.replace(cfg, ray=dataclasses.replace(ray, rollout=rollout))


def _prompt_limit_text(cfg: TrainConfig) -> str:
    value = cfg.data.max_prompt_tokens
    return f"auto (positions − {cfg.rollout.max_new_tokens})" if value == "auto" else f"{value}"


def _kl_text(kl: KLConfig) -> str:
    if kl.placement == "none":
        return "none"
    beta = f"β={kl.coef:g}" + (f" → target KL {kl.target:g}" if kl.target is not None else "")
    return f"{kl.placement} ({kl.kind}, {beta})"


def with_warm_start(cfg: TrainConfig) -> tuple[TrainConfig, list[str]]:
    """``cfg`` with every model key that names a run or one of its checkpoints (model.actor,
    model.reference: its policy; model.critic: its critic; a reward_model or teacher source's
    path) replaced by that model's directory (glassrl.run.open.model_in_run), so that config.yaml
    records what was loaded; and the start-up lines that say so. A warm start: the weights only,
    a fresh optimiser and schedule (``--resume`` continues a run instead)."""
    lines: list[str] = []

    def resolved(name: str | None, key: str, part: str = ACTOR) -> str | None:
        found = None if name is None else model_in_run(name, key, part)
        if found is None:
            return name
        lines.append(found[1])
        return str(found[0])

    m = cfg.model
    critic = m.critic if m.critic == "reward_model" else resolved(m.critic, "model.critic", CRITIC)
    model = dataclasses.replace(
        m,
        actor=resolved(m.actor, "model.actor"),
        reference=resolved(m.reference, "model.reference"),
        critic=critic,
    )
    sources = [
        {**s, "path": resolved(s["path"], f"reward.sources[{i}].path", MODEL_SOURCES[s["name"]])}
        if s.get("name") in MODEL_SOURCES and isinstance(s.get("path"), str)
        else s
        for i, s in enumerate(cfg.reward.sources)
    ]
    reward = dataclasses.replace(cfg.reward, sources=sources)
    return dataclasses.replace(cfg, model=model, reward=reward), lines


def with_precision(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with model.dtype and model.compute_dtype "auto" made concrete for where the policy
    runs, so that config.yaml and every checkpoint record the precision that ran.

    Weights: float32, the optimiser's master copy (AdamW on bfloat16 weights loses small
    updates: glassrl.models.precision). Compute: bfloat16 autocast on CUDA (the policy's device,
    or ``ray.actor.resources`` naming a GPU), float32 on CPU, where bfloat16 matmuls are slower
    than float32 ones. A frozen π_ref runs exactly as the actor does, so KL is 0 until the first update.
    """
    m = cfg.model
    dtype = "float32" if m.dtype == "auto" else m.dtype
    on_gpu = _policy_on_gpu(cfg)
    compute = m.compute_dtype
    if compute == "auto":
        compute = "bfloat16" if on_gpu and dtype == "float32" else "float32"
    return dataclasses.replace(cfg, model=dataclasses.replace(m, dtype=dtype, compute_dtype=compute))


def with_shared_prefix(cfg: TrainConfig, actor: Path, resumed: Path | None = None) -> tuple[TrainConfig, str]:
    """``cfg`` with model.shared_prefix "auto" made concrete (config.yaml and checkpoints record it),
    and why, for the start-up lines (:func:`layout_path`): on for the in-process backend on CPU
    without padding_free, when the actor's, the reference's and the critic's checkpoints have full
    attention in every layer (a sliding window cannot be kept in the layout's own mask:
    glassrl.models.shared_prefix). Off on a GPU, where it has not been measured since it became one
    pass, and on Ray, where it has not been measured (``true`` runs it there). ``resumed``: the
    config.yaml of the run being resumed; one written before model.shared_prefix existed ran padded, and goes on so."""
    m = cfg.model
    if m.shared_prefix != "auto":
        return cfg, f"set to {str(m.shared_prefix).lower()}"
    off = None
    if cfg.trainer.backend != "local":
        off = f"trainer.backend is {cfg.trainer.backend}, where the layout has not been measured yet"
    elif m.padding_free:
        off = "model.padding_free packs without padding already"
    elif _policy_on_gpu(cfg):
        off = "the policy is on a GPU, where the layout has not been measured yet"
    elif resumed is not None and resumed.is_file():
        saved = _saved_model_section(resumed)
        if saved is not None and "shared_prefix" not in saved:
            off = "the run being resumed began before model.shared_prefix existed, padded"
    if off is None:
        paths = [actor, critic_path(cfg, actor)] + ([resolve_model_path(m.reference)] if m.reference else [])
        windowed = [p for p in paths if not full_attention(AutoConfig.from_pretrained(p, local_files_only=True))]
        if windowed:
            off = f"{windowed[0]} has layers that are not full attention"
    why = "auto: in-process on CPU, full attention in every model" if off is None else f"auto, off: {off}"
    return dataclasses.replace(cfg, model=dataclasses.replace(m, shared_prefix=off is None)), why


def _saved_model_section(path: Path) -> dict | None:
    """The ``model`` section of a run's config.yaml (glassrl.config.safe_load: no aliases), or None when
    the file cannot be read as one (the trainer then writes it again from the checkpoint's config)."""
    try:
        tree = safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return None
    if not isinstance(tree, dict):
        return None
    return tree["model"] if isinstance(tree.get("model"), dict) else {}


def layout_path(model: ModelConfig, why: str) -> str:
    """The start-up line's account of the forward passes' layout; ``why``: :func:`with_shared_prefix`'s."""
    if model.padding_free:
        return "packed without padding (model.padding_free)"
    if model.shared_prefix is True:
        return f"packed, each distinct prompt once per chunk (model.shared_prefix {why})"
    return f"padded (model.shared_prefix {why})"


def _policy_on_gpu(cfg: TrainConfig) -> bool:
    """Whether the policy trains on CUDA: its device, or ``ray.actor.resources`` naming a GPU."""
    if cfg.trainer.backend == "ray":
        return cfg.ray.actor.resources.get("GPU", 0) > 0
    return resolve_device(cfg.model.device).type == "cuda"


def saved_in_todays_terms(cfg: TrainConfig) -> Callable[[dict], dict]:
    """For a checkpoint's config (flat dotted keys) written before :func:`with_precision`: its
    model.dtype "auto" then meant float32 on CPU and bfloat16 on CUDA (glassrl.models.loading),
    which is what it is compared as; a CPU run resumes, a CUDA run of bfloat16 weights is told
    it differs from today's float32 masters. One without model.shared_prefix ran the padded passes
    (False), as :func:`with_shared_prefix` resumes it. A relative data, tool or environment path
    was read from the working directory then: where it names the file today's absolute path names
    (glassrl.config_paths: a config file's paths), it is compared as that path."""
    on_gpu = _policy_on_gpu(cfg)
    cwd = Path.cwd()
    now = flatten(to_dict(cfg))

    def same_file(key: str, old, anchor) -> object:
        return now[key] if key in now and anchor(old, cwd) == anchor(now[key], cwd) else old

    def upgrade(flat: dict) -> dict:
        if flat.get("model.dtype") == "auto":
            flat = {**flat, "model.dtype": "bfloat16" if on_gpu else "float32"}
        if "model.shared_prefix" not in flat:  # before it existed: the padded passes
            flat = {**flat, "model.shared_prefix": False}
        flat = {**flat, **{k: same_file(k, flat[k], config_paths.data_path) for k in DATA_PATHS if k in flat}}
        for key in ("rollout.agent.tools", "rollout.agent.environment"):
            if key in flat:
                flat[key] = same_file(key, flat[key], _file_specs)
        return flat

    return upgrade


def _file_specs(specs, base: Path):
    """:func:`glassrl.config_paths.file_spec` of a spec or of each of a list of them."""
    return (
        [config_paths.file_spec(s, base) for s in specs]
        if isinstance(specs, list)
        else config_paths.file_spec(specs, base)
    )


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
