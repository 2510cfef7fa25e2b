"""A policy judged or asked without training: ``glassrl eval`` and ``glassrl generate``.

    cfg = eval_config("runs/grpo", data="gsm8k_test.jsonl", reward="rewards.py:score")
    metrics = evaluate_policy(cfg, samples=rows)          # eval/accuracy, eval/pass_at_<j>, eval/reward/...

The policy is a model (a directory, a cached hub id, "default") or a run directory or one of its
checkpoints (:func:`glassrl.run.open.open_checkpoint`: its latest policy, LoRA adapters on their
base). A run is evaluated as its own evaluation would be: its config (prompt rendering, the length
rule, sampling, ``logging.eval_k``, the reward and its verdict rule); a model under TrainConfig's
defaults. ``data`` replaces the test prompts (``data.test``), ``reward`` the reward (``reward.sources``:
a ``file.py:function`` or ``module:function`` spec is a user function, anything else a source's
name); key=value overrides come last.

The metrics are the training run's evaluation (glassrl.rl.evaluation: mean@k, pass@k, the reward
in all and per source, ``eval/accuracy/<value>`` per ``logging.eval_group_by``), computed by the
same function on the same workers: the rollout samples with a generator seeded ``seed + 1``, as
a run's does before its first step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from glassrl.config import load_config
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.models.lora import base_path, is_adapter_dir, load_lora_model
from glassrl.rl.build import (
    actor_path,
    build_reward,
    forward_passes,
    lora_settings,
    prompt_format,
    rollout_engine,
    test_spec,
)
from glassrl.rl.config import TrainConfig
from glassrl.rl.evaluation import evaluate
from glassrl.rl.memory import check_sampling_fits
from glassrl.rl.prompts import applies_template, build_prompts, prompt_ids, render
from glassrl.rl.resolve import resolve, with_precision
from glassrl.run.open import open_checkpoint
from glassrl.workers.local import LocalReward, LocalRollout


def eval_config(
    target: str, data: str | None = None, reward: str | None = None, overrides: Sequence[str] = ()
) -> tuple[TrainConfig, Path | None]:
    """(the config to evaluate under, the policy's directory when ``target`` is a run) (module docstring)."""
    checkpoint = open_checkpoint(Path(target))
    given = []
    if data is not None:
        path = Path(data)
        given.append(f"data.test={path.resolve() if path.exists() else data}")
    if reward is not None:
        source = {"name": "user_function", "spec": reward} if ":" in reward else {"name": reward}
        given += [f"reward.sources={json.dumps([source])}", f"reward.base_dir={Path.cwd()}"]
    # Evaluation never trains: a batch.prompts_per_step or rollout.n given alone must not fail the training-only
    # rules that the mini- and micro-batches divide them (`eval MODEL DATA numeric batch.prompts_per_step=4` met
    # the default mini_batch_prompts = 8); evaluation samples prompts_per_step × n responses at a time, nothing less.
    written = {o.partition("=")[0].strip(): o.partition("=")[2] for o in overrides}
    if "batch.prompts_per_step" in written and "batch.mini_batch_prompts" not in written:
        given.append(f"batch.mini_batch_prompts={written['batch.prompts_per_step']}")
    if {"batch.prompts_per_step", "rollout.n"} & written.keys() and "batch.micro_batch_responses" not in written:
        given.append("batch.micro_batch_responses=1")
    if checkpoint is None:
        return load_config(TrainConfig, None, [f"model.actor={target}", *given, *overrides]), None
    return load_config(TrainConfig, checkpoint.run / "config.yaml", [*given, *overrides]), checkpoint.actor


@dataclass
class Policy:
    """The model that samples, its tokenizer, and the checkpoint directory of its architecture
    (its config.json: the positions the length rule reads)."""

    model: Any
    tokenizer: Any
    path: Path


def load_policy(cfg: TrainConfig, policy_dir: Path | None, console: Console) -> Policy:
    """``policy_dir`` (a run's: whole model or LoRA adapters), else model.actor, on model.device."""
    from glassrl.models import load_causal_lm, load_tokenizer

    load_lm = partial(load_causal_lm, dtype=cfg.model.dtype, device=cfg.model.device)
    if policy_dir is None:
        path = actor_path(cfg, console)
        return Policy(load_lm(path), load_tokenizer(path), path)
    if is_adapter_dir(policy_dir):
        settings = lora_settings(cfg)
        if settings is None:
            raise GlassrlError(f"{policy_dir}: LoRA adapters, but the run's config has no model.lora")
        model = load_lora_model(policy_dir, settings, load_lm)
        return Policy(model, load_tokenizer(policy_dir), base_path(policy_dir))
    return Policy(load_lm(policy_dir), load_tokenizer(policy_dir), policy_dir)


def _architecture(cfg: TrainConfig, policy_dir: Path | None, console: Console) -> tuple[Path, Any]:
    """(the directory of the policy's config.json, its tokenizer): what is read before the model loads."""
    from glassrl.models import load_tokenizer

    if policy_dir is None:
        path = actor_path(cfg, console)
        return path, load_tokenizer(path)
    return (base_path(policy_dir) if is_adapter_dir(policy_dir) else policy_dir), load_tokenizer(policy_dir)


def _rollout(cfg: TrainConfig, policy: Policy) -> LocalRollout:
    policy.model.eval()
    device = next(policy.model.parameters()).device
    generator = torch.Generator(device).manual_seed(cfg.seed + 1)  # as a run's rollout before its first step
    return LocalRollout(rollout_engine(cfg, policy.model, policy.tokenizer), generator, forward_passes(cfg).compute)


def evaluate_policy(
    cfg: TrainConfig, policy_dir: Path | None = None, console: Console | None = None, samples: list | None = None
) -> dict[str, float]:
    """The run's evaluation (glassrl.rl.evaluation) of the policy on ``data.test`` (its first
    ``data.eval_size`` prompts); each response appended to ``samples`` when given."""
    console = console or Console()
    spec = test_spec(cfg)
    if spec is None or cfg.data.eval_size < 1:
        raise GlassrlError("no prompts to evaluate: give DATA (a prompt file or task:NAME/test) or data.test")
    # The training prompts are not read: the test set stands in for them (each is read alike).
    cfg = with_precision(replace(cfg, data=replace(cfg.data, train=spec, test=spec)))
    architecture, tokenizer = _architecture(cfg, policy_dir, console)
    prompts = build_prompts(cfg, tokenizer, architecture, prompt_format(cfg, tokenizer))
    chunk = resolve(cfg).responses_per_step  # as the run's evaluation generates
    what = f"batch.prompts_per_step = {cfg.batch.prompts_per_step} × rollout.n = {cfg.rollout.n}:"
    check_sampling_fits(cfg, architecture, chunk, prompts.longest, what, "lower batch.prompts_per_step")
    policy = load_policy(cfg, policy_dir, console)
    for line in prompts.summary()[1:]:
        console.print(line, markup=False, soft_wrap=True)
    r, k = cfg.rollout, cfg.logging.eval_k
    with torch.no_grad():
        return evaluate(
            prompts.test,
            prompts.ids,
            rollout=_rollout(cfg, policy),
            reward=LocalReward(build_reward(cfg)),
            tokenizer=policy.tokenizer,
            params=r.sampling(greedy=k == 1),
            k=k,
            threshold=cfg.logging.eval_threshold,
            group_by=cfg.logging.eval_group_by,
            chunk=chunk,
            samples=samples,
        )


def generate(
    cfg: TrainConfig,
    prompts: Sequence[str],
    n: int,
    greedy: bool = False,
    policy_dir: Path | None = None,
    console: Console | None = None,
) -> list[list[tuple[str, str]]]:
    """(response text, finish reason) × ``n`` for each text prompt, rendered as a training run
    renders it (chat template, system prompt) and sampled with ``rollout.*`` (argmax when ``greedy``)."""
    console = console or Console()
    cfg = with_precision(cfg)
    # the prompts' lengths first, from the tokenizer alone: what sampling needs is checked before the model loads
    architecture, tokenizer = _architecture(cfg, policy_dir, console)
    d, r = cfg.data, cfg.rollout
    records = [PromptRecord(text, source=f"prompt {i + 1}") for i, text in enumerate(prompts)]
    chat = applies_template(tokenizer, d.chat_template)
    records = render(records, chat, d.system_prompt, tokenizer, d.chat_template, "PROMPT")
    ids = prompt_ids(tokenizer, records, prompt_format(cfg, tokenizer))
    sequences = n * len(ids)
    what = f"--n {n} × {len(ids)} prompts:"
    check_sampling_fits(cfg, architecture, sequences, max(map(len, ids)), what, "lower --n or rollout.max_new_tokens")
    policy = load_policy(cfg, policy_dir, console)
    params = r.sampling(greedy)
    with torch.no_grad():
        out = _rollout(cfg, policy).generate(ids, n=n, params=params, records=records)
    answers = list(zip(out.texts, out.finish_reasons))  # the n responses of a prompt are adjacent
    return [answers[i * n : (i + 1) * n] for i in range(len(records))]
