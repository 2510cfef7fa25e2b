"""The explain of a checkpoint: phases 2–5 of the trainer's step, recomputed by a run's models.

    run = open_model(Path("runs/grpo"))                       # a run, a checkpoint, or a plain model
    ledger = model_ledger(run, prompt, response, sample=3, seed=0, record=prompt_record(prompt, None))

What ``glassrl explain --model`` runs (glassrl.commands.explain_model reads its flags, resolves
γ, λ, β, the estimator, the KL estimator and whitening, and prints). The path names

- a training run directory, or one of its checkpoints (glassrl.run.open): everything is what
  training used: the reward sources and score shapers (with their checkpointed state), the
  estimator and its parameters, the KL estimator, β (the KL controller's value in the
  checkpoint), the reference policy (the run's ``model.reference``, else its initial actor), the
  checkpoint's critic, the rollout settings, the forward passes' layout and precision;
- a plain Hugging Face model directory (config.json), without a run: TrainConfig's defaults with
  the KL in the reward (explain's β is the coefficient of the KL in the reward), the model itself
  as the reference, no critic. Its reward: the bundled task's (TrainConfig's) for a prompt in a
  task's form, else ``math`` against the given answer (:data:`PLAIN_REWARD`); the estimator
  (glassrl.commands.explain_model) a critic-free one.

``reward`` (``--reward``) is a reward source's name or the user's function as ``file.py:fn`` /
``module:fn`` (a ``user_function`` source, its style detected; a relative file is read from the
working directory, as any path given on the command line).

The numbers come from the trainer's own phase functions (glassrl.rl.phases), run with these
models: score (reward → outcome scores → score shapers → scores on tokens) → model outputs
(log-probs of actor and reference at the rollout temperature, KL, values) → token rewards →
advantages. A given response is tokenised as the trainer's responses are: the text's tokens,
then EOS (a finished response: EOS is trained and holds the outcome score). Sampled responses
come from the run's rollout engine (multi-turn with its environment and tools when the run is
agentic) with a seeded generator; all responses answer the one prompt, so a group estimator
compares them as one group.

The reward checks a response against a record: a prompt in a bundled task's form
("请问1+1=2？", "Is 1+1=2?", "1+1=") gets that task's metadata and reference answer
(:func:`prompt_record`); a given answer stands for the reference answer of any other prompt.

This module is that command's orchestration: a problem the user can cause is one GlassrlError
line naming the flag of ``glassrl explain`` that gave the input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS
from glassrl.data.collate import encode_response
from glassrl.data.formatting import format_prompts
from glassrl.data.records import PromptRecord
from glassrl.data.tasks import record_for_prompt
from glassrl.errors import GlassrlError
from glassrl.ledger import Ledger
from glassrl.ledger.compute import from_experience
from glassrl.models import load_causal_lm, load_scalar_model, load_tokenizer
from glassrl.rewards.user_function import resolve_spec
from glassrl.rl import phases
from glassrl.rl.build import actor_path, build_reward, forward_passes, prompt_format, rollout_engine
from glassrl.rl.config import TrainConfig, agent_config
from glassrl.rl.resolve import with_precision
from glassrl.rollout.base import RolloutBatch, Turn, concat_rollouts
from glassrl.rollout.hf import left_pad
from glassrl.run.open import CONFIG, Checkpoint, model_in_run, open_checkpoint
from glassrl.workers.local import FrozenActor, FrozenCritic, LocalReference, LocalRollout


@dataclass
class ModelRun:
    """What ``--model`` names, opened: the config and the models to load.

    checkpoint: the run's checkpoint (None for a plain model); beta: β of the KL controller
    at the checkpoint; where: one line saying what was opened; config_label: the prefix that
    names where a run's parameter comes from ("RUN/config.yaml: "; "" for a plain model).
    """

    cfg: TrainConfig
    actor: Path
    reference: Path
    critic: Path | None
    checkpoint: Checkpoint | None
    beta: float
    where: str
    step: int | None
    config_label: str


PLAIN_REWARD = "math"  # a plain model's reward for a prompt not in a bundled task's form: the answer checked


def reward_sources(reward: str) -> list[dict[str, Any]]:
    """``--reward``: a source's name, or ``file.py:fn`` / ``module:fn`` (a user_function source,
    its file made absolute against the working directory)."""
    if ":" not in reward:
        return [{"name": reward}]
    return [{"name": "user_function", "spec": resolve_spec(reward, Path.cwd(), "--reward")}]


def open_model(
    path: Path, *, reference: str | None = None, reward: str | None = None, prompt: str | None = None, console=None
) -> ModelRun:
    """Open ``path`` (see the module docstring); ``reference`` (a model, a run or a checkpoint)
    and ``reward`` (:func:`reward_sources`) replace the run's (for a plain model: the model
    itself; the bundled task's reward when ``prompt`` is in its form, else :data:`PLAIN_REWARD`)."""
    if reference is not None:
        in_run = model_in_run(reference, "--reference")
        reference = str(in_run[0]) if in_run is not None else reference
    try:
        checkpoint = open_checkpoint(path)
    except GlassrlError as err:
        raise GlassrlError(f"--model: {err}") from None
    if checkpoint is None:
        if not (path / "config.json").is_file():
            raise GlassrlError(
                f"--model: {path} is neither a run directory (config.yaml), a checkpoint (manifest.json) "
                "nor a Hugging Face model directory (config.json)"
            )
        if reward is None and (prompt is None or record_for_prompt(prompt) is None):
            reward = PLAIN_REWARD
        return _plain_model(path, reference, reward)
    try:
        cfg = checkpoint.config(TrainConfig)
        actor, critic = checkpoint.actor, checkpoint.critic
        kl_controller, counters = checkpoint.part("kl_controller"), checkpoint.part("counters")
    except GlassrlError as err:
        raise GlassrlError(f"--model: {err}") from None
    if reward is not None:
        cfg.reward.sources = reward_sources(reward)
    if reference is None:
        reference = cfg.model.reference if cfg.model.reference is not None else actor_path(cfg, console)
    return ModelRun(
        cfg,
        actor,
        Path(reference),
        critic,
        checkpoint,
        float(kl_controller["value"]),
        f"run {checkpoint.run} · checkpoint {checkpoint.path.name}",
        int(counters["step"]),
        f"{checkpoint.run / CONFIG}: ",
    )


def _plain_model(path: Path, reference: str | None, reward: str | None) -> ModelRun:
    """A model without a run: TrainConfig's defaults (``reward`` over its reward), the KL in the reward."""
    cfg = TrainConfig()
    cfg.model.actor = str(path)
    if reward is not None:
        cfg.reward.sources = reward_sources(reward)
    cfg.algo.kl.placement = "reward"  # explain's β is the coefficient of the KL in the reward
    return ModelRun(
        cfg, path, Path(reference) if reference is not None else path, None, None, 0.0, f"model {path}", None, ""
    )


def set_params(
    run: ModelRun, *, gamma: float, lam: float, estimator: str, kl_kind: str, whiten: bool, beta: float
) -> None:
    """Explain ``run`` with these parameters instead of its own (what if λ were 0?)."""
    a = run.cfg.algo
    a.gamma, a.lam, a.advantage, a.whiten_advantages = gamma, lam, estimator, whiten
    a.kl = dataclasses.replace(a.kl, kind=kl_kind)
    run.beta = beta


def prompt_record(prompt: str, answer: str | None) -> PromptRecord:
    """The record a reward checks a response to ``prompt`` against (see the module docstring)."""
    task_record = record_for_prompt(prompt)
    metadata: dict[str, Any] = dict(task_record.metadata) if task_record is not None else {}
    reference = task_record.answer if task_record is not None else None
    return PromptRecord(prompt, answer if answer is not None else reference, metadata, repr(prompt))


def model_ledger(
    run: ModelRun, prompt: str, response: str | None, sample: int, seed: int, record: PromptRecord
) -> Ledger:
    """The ledger of ``response`` (if given) and ``sample`` sampled responses to ``prompt``."""
    policy = load_policy(run, seed)
    prompt_ids = policy.prompt_ids([record])[0]
    batches = []
    if response is not None:
        ids = _response_ids(policy.tokenizer, response)
        # An agentic run's batch is multi-turn: a given response is its one final turn.
        turns = [Turn(0, len(ids), len(ids), "stop", response)] if policy.multi_turn else None
        batches.append(given_response(policy, prompt_ids, ids, turns=turns, text=response if turns else None))
    if sample:
        r = run.cfg.rollout
        params = r.sampling()
        batches.append(policy.rollout.generate([prompt_ids], n=sample, params=params, records=[record]))
    return explain_rollout(run, policy, concat_rollouts(batches, policy.pad_id), [record], [prompt_ids])


@dataclass
class Policy:
    """The checkpoint's actor, loaded once: its tokenizer, the model, and a sampler over it
    (glassrl.workers.local.LocalRollout) seeded with ``--seed``: the run's rollout engine, multi-turn
    with its environment and tools when the run is agentic (glassrl.rl.build.rollout_engine).
    ``prompt_ids(records)`` renders prompts as the run did (an agentic run's with its tools)."""

    tokenizer: Any
    model: Any
    rollout: LocalRollout
    pad_id: int
    device: torch.device
    prompt_ids: Callable[[list[PromptRecord]], list[list[int]]]
    multi_turn: bool = False


def load_policy(run: ModelRun, seed: int = 0) -> Policy:
    tokenizer = load_tokenizer(run.actor)
    model = load_causal_lm(run.actor, dtype=run.cfg.model.dtype, device=run.cfg.model.device)
    engine = rollout_engine(run.cfg, model, tokenizer)
    device = next(model.parameters()).device
    render = prompt_format(run.cfg, tokenizer) or (
        lambda records: format_prompts(tokenizer, [r.prompt for r in records], [r.source for r in records])
    )
    rollout = LocalRollout(engine, torch.Generator(device).manual_seed(seed))
    return Policy(tokenizer, model, rollout, engine.pad_id, device, render, agent_config(run.cfg) is not None)


def explain_rollout(
    run: ModelRun, policy: Policy, rollout: RolloutBatch, prompts: list[PromptRecord], prompt_ids: list[list[int]]
) -> Ledger:
    """Phases 2–5 of the trainer's step (glassrl.rl.phases) on ``rollout``, whose response b
    answers ``prompts[rollout.group_index[b]]`` (token ids ``prompt_ids``): the Ledger of every response.

    The models are the run's: the checkpoint's actor (``policy``), the reference, the checkpoint's
    critic when the estimator reads values; forward passes run in micro-batches of the run's
    ``batch.micro_batch_responses``, as the trainer's workers do.
    """
    cfg, a = with_precision(run.cfg), run.cfg.algo
    m = cfg.model
    load = dict(dtype=m.dtype, device=m.device)
    # The passes the run's workers made (its precision, padding-free and shared-prefix layouts),
    # so that every number is the ledger's exactly.
    passes = forward_passes(cfg)
    _check_positions(policy.model, rollout)
    reward = _StrictReward(_reward(cfg))
    records = [prompts[g] for g in rollout.group_index.tolist()]  # the record each response answers
    results = reward.score(phases.reward_requests(rollout, records, policy.tokenizer))
    exp = phases.score(
        phases.Sampled(rollout, prompts, prompt_ids, results),
        policy.tokenizer,
        estimator=a.advantage,
        shapers=_shapers(run),
        rollout=policy.rollout,
        reward=reward,
        max_new_tokens=cfg.rollout.max_new_tokens,
    )
    actor = FrozenActor(policy.model, passes)
    reference = LocalReference(load_causal_lm(run.reference, **load), passes)
    critic = None
    if ADVANTAGE_ESTIMATORS[a.advantage].critic:
        critic = FrozenCritic(load_scalar_model(run.critic, head=m.critic_head, **load), passes)
    phases.model_outputs(exp, actor, reference, critic, a.kl.kind)
    phases.token_rewards(exp, run.beta, a.kl.placement == "reward")
    phases.advantages(exp, a)
    return from_experience(
        exp, policy.tokenizer, estimator=a.advantage, gamma=a.gamma, lam=a.lam, kl_kind=a.kl.kind, step=run.step
    )


def _response_ids(tokenizer, response: str) -> list[int]:
    """A given response's tokens then EOS, as the trainer's responses are (a finished response)."""
    ids = encode_response(tokenizer, response)
    if len(ids) < 2:
        raise GlassrlError("--response: empty (the model's tokenizer makes no token of it)")
    return ids


def given_response(
    policy: Policy,
    prompt_ids: list[int],
    ids: list[int],
    finish_reason: str = "stop",
    *,
    turns: list[Turn] | None = None,
    text: str | None = None,
) -> RolloutBatch:
    """A RolloutBatch of one response with token ids ``ids`` (group 0). ``turns``: a multi-turn
    response's turns (its generated tokens train, its observations stay in the context only);
    ``text``: the final answer the reward judges (default: ``ids`` decoded)."""
    prompt, prompt_mask = left_pad([prompt_ids], policy.pad_id)
    device = policy.device
    generated = [any(t.start <= i < t.end for t in turns) for i in range(len(ids))] if turns else [True] * len(ids)
    return RolloutBatch(
        prompt.to(device),
        prompt_mask.to(device),
        torch.tensor([ids], device=device),
        torch.tensor([generated], dtype=torch.bool, device=device),
        torch.zeros(1, dtype=torch.long, device=device),
        [finish_reason],
        [text if text is not None else policy.tokenizer.decode(ids, skip_special_tokens=True)],
        torch.ones((1, len(ids)), dtype=torch.bool, device=device),
        None if turns is None else [tuple(turns)],
    )


def _check_positions(model, rollout: RolloutBatch) -> None:
    positions = getattr(model.config, "max_position_embeddings", None)
    P, T = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    if positions is not None and P + T > positions:
        raise GlassrlError(
            f"--response: prompt and response take {P} + {T} tokens, more than the model's {positions} positions"
        )


def _reward(cfg: TrainConfig):
    try:
        return build_reward(cfg)
    except GlassrlError as err:
        raise GlassrlError(f"--reward: {err}") from None


class _StrictReward:
    """The run's reward; a failed score is an error (explain has nothing to show without a score)."""

    def __init__(self, source) -> None:
        self.source = source

    def score(self, requests):
        results = self.source.score(requests)
        for b, result in enumerate(results):
            if not result.is_ok:
                hint = "give a prompt in a bundled task's form, or --answer TEXT"
                if requests[b].record.answer is not None:  # the answer was there: the reward is the problem
                    hint = "choose a reward that can score it with --reward NAME or --reward file.py:fn"
                raise GlassrlError(
                    f"--prompt: the reward could not score response {b} ({result.status}: {result.message}); {hint}"
                )
        return results


def _shapers(run: ModelRun) -> list:
    """The run's score shapers (glassrl.rl.phases.score_shapers) with their checkpointed state."""
    shapers = phases.score_shapers(run.cfg.algo)
    saved = run.checkpoint.manifest["parts"] if run.checkpoint is not None else {}
    for shaper in shapers:
        names = getattr(shaper, "part_names", ())
        missing = [n for n in names if n not in saved]
        if missing:
            raise GlassrlError(f"--model: {run.where} has no part {missing[0]!r} (the score shaper's state)")
        if names:
            shaper.load_state_dict({n: run.checkpoint.part(n) for n in names})
    return shapers
