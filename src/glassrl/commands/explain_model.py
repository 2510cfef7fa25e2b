"""``glassrl explain --model``: the ledger of real responses, every number computed by models.

    glassrl explain --model runs/grpo --prompt "请问1+1=2？" --response "是的，等于2！" --sample 3

``--model`` names one of
- a training run directory (config.yaml + checkpoints/latest): its latest checkpoint;
- one checkpoint of a run (``RUN/checkpoints/step_XXXXXXXX``, with manifest.json);
- a plain Hugging Face model directory (config.json), without a run: the reward is
  ``--reward`` (default arith_verify), γ, λ, β, the KL estimator and the advantage
  estimator come from the flags (explain's defaults otherwise), the reference policy is
  ``--reference`` (default: the model itself) and there is no critic.

From a run, everything is what training used: the reward sources and score shapers
(with their checkpointed state), γ, λ, the estimator, whitening, the KL estimator, β (the
KL controller's value in the checkpoint, counted in the token rewards only when the run
puts the KL in the reward), the reference policy (the run's ``model.reference``, else its
initial actor), the checkpoint's critic, the rollout temperature. Parameter flags
(``--gamma``, ``--lam``, ``--beta``, ``--estimator``, ``--kl-kind``, ``--whiten``,
``--reward``, ``--reference``) override the run's values (what if λ were 0?).

The numbers come from the trainer's own phase functions (glassrl.rl.phases, phases
2–5 of ``Trainer.step``), run with the checkpoint's models: score (reward → outcome scores
→ score shapers → scores on tokens) → model outputs (log-probs of actor and reference at
the rollout temperature, KL, values) → token rewards → advantages. A given response is tokenised as the trainer's responses are: the
text's tokens, then EOS (a finished response: EOS is trained and holds the outcome score).
``--sample N`` adds N responses sampled with the run's rollout settings from a generator
seeded with ``--seed``; all responses answer the one prompt, so a group estimator compares
them as one group.

The reward checks a response against a record: a prompt in a bundled task's form
("请问1+1=2？", "Is 1+1=2?", "1+1=") gets that task's metadata and reference answer;
``--answer`` gives the reference answer of any other prompt.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glassrl.commands import explain_input
from glassrl.data.records import PromptRecord
from glassrl.data.tasks import record_for_prompt
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig
from glassrl.rollout.base import Turn

MODEL_ONLY = ("sample", "seed", "reward", "answer", "reference")
NOT_WITH_MODEL = (
    "input",
    "tokenizer",
    "tokens",
    "score",
    "token_scores",
    "step_ends",
    "step_scores",
    "kl",
    "logprobs",
    "ref_logprobs",
    "values",
    "mask",
    "baseline_reward",
)
# explain parameter -> the TrainConfig field it stands for
CONFIG_FIELDS = {
    "gamma": "algo.gamma",
    "lam": "algo.lam",
    "estimator": "algo.advantage",
    "kl_kind": "algo.kl.kind",
    "whiten": "algo.whiten_advantages",
}
DEFAULT_REWARD = "arith_verify"


def _flag(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def check_flags(args: argparse.Namespace) -> None:
    """A flag of the other mode (model-computed vs given numbers): GlassrlError naming it."""
    if args.model is None:
        given = [k for k in MODEL_ONLY if getattr(args, k) is not None]
        if given:
            raise GlassrlError(f"{_flag(given[0])}: needs --model (a model that computes the numbers)")
        return
    given = [k for k in NOT_WITH_MODEL if getattr(args, k) is not None]
    if given:
        raise GlassrlError(
            f"{_flag(given[0])}: cannot be combined with --model (the model computes the numbers "
            "from --prompt and --response or --sample)"
        )


@dataclass
class ModelRun:
    """What ``--model`` names, opened: the config and the checkpoints to load.

    parts: the checkpoint's parts by name ({} for a plain model); beta: β of the KL
    controller at the checkpoint; where: one line saying what was opened.
    """

    cfg: TrainConfig
    actor: Path
    reference: Path
    critic: Path | None
    parts: dict[str, Any]
    beta: float
    where: str
    step: int | None
    config_label: str  # prefix naming where a run parameter comes from


def open_model(args: argparse.Namespace, console=None) -> ModelRun:
    """Resolve ``--model`` (and ``--reference``, ``--reward``) into a :class:`ModelRun`."""
    from glassrl.config import load_saved_config
    from glassrl.rl.build import actor_path
    from glassrl.run.checkpoint import MANIFEST, CheckpointManager, read_manifest

    path = Path(args.model)
    if (path / "config.yaml").is_file():
        run, checkpoint = path, CheckpointManager(path / "checkpoints", keep=1).latest()
        if checkpoint is None:
            raise GlassrlError(
                f"--model: run directory {path} has no checkpoint yet (no {path / 'checkpoints' / 'latest'})"
            )
    elif (path / MANIFEST).is_file():
        run, checkpoint = path.parent.parent, path
        if not (run / "config.yaml").is_file():
            raise GlassrlError(f"--model: checkpoint {path} is not inside a run directory (no {run / 'config.yaml'})")
    elif (path / "config.json").is_file():
        return _plain_model(path, args)
    else:
        raise GlassrlError(
            f"--model: {path} is neither a run directory (config.yaml), a checkpoint (manifest.json) "
            "nor a Hugging Face model directory (config.json)"
        )
    cfg = load_saved_config(TrainConfig, run / "config.yaml")
    # The manager checks every file's size and hash; ask for exactly the parts present.
    parts = CheckpointManager(checkpoint.parent, keep=1).load(checkpoint, set(read_manifest(checkpoint)["parts"]))
    missing = [name for name in ("actor", "kl_controller", "counters") if name not in parts]
    if missing:
        raise GlassrlError(f"--model: checkpoint {checkpoint} has no part {missing[0]!r}")
    reference = (
        Path(args.reference)
        if args.reference is not None
        else (Path(cfg.model.reference) if cfg.model.reference is not None else actor_path(cfg, console))
    )
    if args.reward is not None:
        cfg.reward.sources = [{"name": args.reward}]
    return ModelRun(
        cfg,
        parts["actor"],
        reference,
        parts.get("critic"),
        parts,
        float(parts["kl_controller"]["value"]),
        f"run {run} · checkpoint {checkpoint.name}",
        int(parts["counters"]["step"]),
        f"{run / 'config.yaml'}: ",
    )


def _plain_model(path: Path, args: argparse.Namespace) -> ModelRun:
    """A model without a run: explain's defaults and flags, the reward of --reward, KL in the reward."""
    cfg = TrainConfig()
    cfg.model.actor = str(path)
    cfg.reward.sources = [{"name": args.reward or DEFAULT_REWARD}]
    cfg.algo.kl.placement = "reward"  # explain's β is the coefficient of the KL in the reward
    reference = Path(args.reference) if args.reference is not None else path
    return ModelRun(cfg, path, reference, None, {}, explain_input.DEFAULTS["beta"], f"model {path}", None, "")


def resolve_params(args: argparse.Namespace, run: ModelRun) -> explain_input.ExplainSpec:
    """γ, λ, β, estimator, KL kind, whitening: the run's (explain's defaults for a plain model),
    overridden by flags; checked, and written back into ``run.cfg``. Errors name the flag or
    the run's config field."""
    a = run.cfg.algo
    params: dict[str, Any] = {}
    labels: dict[str, str] = {}
    if run.config_label:
        params = {
            "gamma": a.gamma,
            "lam": a.lam,
            "estimator": a.advantage,
            "kl_kind": a.kl.kind,
            "whiten": a.whiten_advantages,
            "beta": run.beta,
        }
        labels = {key: run.config_label + field for key, field in CONFIG_FIELDS.items()}
        labels["beta"] = f"{run.where}: kl_controller"
    for key in explain_input.PARAM_KEYS:
        if getattr(args, key) is not None:
            params[key], labels[key] = getattr(args, key), _flag(key)
    spec = explain_input.check_params(params, labels, [], "explain")
    if args.beta is not None and a.kl.placement != "reward":
        raise GlassrlError(
            f"--beta: {run.config_label}algo.kl.placement = {a.kl.placement}: this run's KL is not in "
            "the reward, so β of the token rewards does not apply"
        )
    a.gamma, a.lam, a.advantage, a.whiten_advantages = spec.gamma, spec.lam, spec.estimator, spec.whiten
    a.kl = dataclasses.replace(a.kl, kind=spec.kl_kind)
    run.beta = spec.beta
    return spec


def prompt_record(prompt: str, answer: str | None) -> PromptRecord:
    """The record a reward checks a response to ``prompt`` against (see the module docstring)."""
    task_record = record_for_prompt(prompt)
    metadata: dict[str, Any] = dict(task_record.metadata) if task_record is not None else {}
    reference = task_record.answer if task_record is not None else None
    return PromptRecord(prompt, answer if answer is not None else reference, metadata, repr(prompt))


def from_args(args: argparse.Namespace, console=None):
    """(ledger, header lines) of ``glassrl explain --model …``."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per loaded model would bury the ledger
    if args.prompt is None:
        raise GlassrlError("--prompt: missing (the prompt the model answers)")
    sample = 0 if args.sample is None else explain_input.integer(args.sample, "--sample")
    if args.sample is not None and sample < 1:
        raise GlassrlError(f"--sample: expected a number of responses >= 1, got {sample}")
    seed = 0 if args.seed is None else explain_input.integer(args.seed, "--seed")
    if args.response is None and sample == 0:
        raise GlassrlError("--response: missing (give the response text, or --sample N to sample N responses)")
    run = open_model(args, console)
    spec = resolve_params(args, run)
    label = f"{run.config_label}algo.advantage" if run.config_label and args.estimator is None else "--estimator"
    _check_estimator(run, spec.estimator, label, int(args.response is not None) + sample)
    ledger = model_ledger(run, args.prompt, args.response, sample, seed, prompt_record(args.prompt, args.answer))
    return ledger, _header(run, sample, seed)


def _header(run: ModelRun, sample: int, seed: int) -> list[str]:
    """Two lines: what was opened, and where the ledger's numbers come from."""
    kl = run.cfg.algo.kl
    sources = ", ".join(f"{s['name']}×{s.get('weight', 1.0):g}" for s in run.cfg.reward.sources)
    parts = [
        f"reference {run.reference}",
        f"reward {sources}",
        f"KL in the {kl.placement}" + (f" (coefficient {kl.coef:g})" if kl.placement == "loss" else ""),
        f"critic {run.critic or 'none'}",
    ]
    if sample:
        parts.append(f"{sample} sampled (seed {seed}, temperature {run.cfg.rollout.temperature:g})")
    return [run.where + ("" if run.step is None else f" (step {run.step})"), " · ".join(parts)]


def _check_estimator(run: ModelRun, estimator: str, label: str, count: int) -> None:
    from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS, GROUP_ESTIMATORS, REQUIRED_INPUTS

    if "values" in REQUIRED_INPUTS[estimator] and run.critic is None:
        free = [e for e in ADVANTAGE_ESTIMATORS if "values" not in REQUIRED_INPUTS[e]]
        raise GlassrlError(
            f"{label}: {estimator} needs a critic's values, and {run.where} has no critic; "
            f"use a critic-free estimator: {', '.join(free)}"
        )
    if estimator in GROUP_ESTIMATORS and count < 2:
        raise GlassrlError(
            f"--sample: estimator {estimator} compares the responses to one prompt and needs at "
            f"least 2, got {count} (add --sample N)"
        )


def model_ledger(run: ModelRun, prompt: str, response: str | None, sample: int, seed: int, record: PromptRecord):
    """The ledger of ``response`` (if given) and ``sample`` sampled responses to ``prompt``."""
    from glassrl.rollout.base import SamplingParams, concat_rollouts

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
        params = SamplingParams(r.max_new_tokens, r.temperature, r.top_p, r.top_k)
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
    rollout: Any
    pad_id: int
    device: Any
    prompt_ids: Any = None
    multi_turn: bool = False


def load_policy(run: ModelRun, seed: int = 0) -> Policy:
    import torch

    from glassrl.data.formatting import format_prompts
    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.rl.build import prompt_format, rollout_engine
    from glassrl.rl.config import agent_config
    from glassrl.workers.local import LocalRollout

    tokenizer = load_tokenizer(run.actor)
    model = load_causal_lm(run.actor, dtype=run.cfg.model.dtype, device=run.cfg.model.device)
    engine = rollout_engine(run.cfg, model, tokenizer)
    device = next(model.parameters()).device
    render = prompt_format(run.cfg, tokenizer) or (
        lambda records: format_prompts(tokenizer, [r.prompt for r in records])
    )
    rollout = LocalRollout(engine, torch.Generator(device).manual_seed(seed))
    return Policy(tokenizer, model, rollout, engine.pad_id, device, render, agent_config(run.cfg) is not None)


def explain_rollout(run: ModelRun, policy: Policy, rollout, prompts: list[PromptRecord], prompt_ids: list[list[int]]):
    """Phases 2–5 of the trainer's step (glassrl.rl.phases) on ``rollout``, whose response b
    answers ``prompts[rollout.group_index[b]]`` (token ids ``prompt_ids``): the Ledger of every response.

    The models are the run's: the checkpoint's actor (``policy``), the reference, the checkpoint's
    critic when the estimator reads values; forward passes run in micro-batches of the run's
    ``batch.micro_batch_responses``, as the trainer's workers do.
    """
    from glassrl.algos.advantages import REQUIRED_INPUTS
    from glassrl.ledger.compute import from_experience
    from glassrl.models import load_causal_lm, load_scalar_model
    from glassrl.rl import phases
    from glassrl.rl.build import forward_passes, with_precision
    from glassrl.workers.local import FrozenActor, FrozenCritic, LocalReference

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
    if "values" in REQUIRED_INPUTS[a.advantage]:
        critic = FrozenCritic(load_scalar_model(run.critic, head=m.critic_head, **load), passes)
    phases.model_outputs(exp, actor, reference, critic, a.kl.kind)
    phases.token_rewards(exp, run.beta, a.kl.placement == "reward")
    phases.advantages(exp, a)
    return from_experience(
        exp, policy.tokenizer, estimator=a.advantage, gamma=a.gamma, lam=a.lam, kl_kind=a.kl.kind, step=run.step
    )


def _response_ids(tokenizer, response: str) -> list[int]:
    """A given response's tokens then EOS, as the trainer's responses are (a finished response)."""
    from glassrl.data.collate import encode_response

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
):
    """A RolloutBatch of one response with token ids ``ids`` (group 0). ``turns``: a multi-turn
    response's turns (its generated tokens train, its observations stay in the context only);
    ``text``: the final answer the reward judges (default: ``ids`` decoded)."""
    import torch

    from glassrl.rollout.base import RolloutBatch
    from glassrl.rollout.hf import left_pad

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


def _check_positions(model, rollout) -> None:
    positions = getattr(model.config, "max_position_embeddings", None)
    P, T = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    if positions is not None and P + T > positions:
        raise GlassrlError(
            f"--response: prompt and response take {P} + {T} tokens, more than the model's {positions} positions"
        )


def _reward(cfg: TrainConfig):
    from glassrl.rl.build import build_reward

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
                raise GlassrlError(
                    f"--prompt: the reward could not score response {b} "
                    f"({result.status}: {result.message}); "
                    "give a prompt in a bundled task's form, or --answer TEXT"
                )
        return results


def _shapers(run: ModelRun) -> list:
    """The run's score shapers (glassrl.rl.phases.score_shapers) with their checkpointed state."""
    from glassrl.rl.phases import score_shapers

    shapers = score_shapers(run.cfg.algo)
    for shaper in shapers:
        names = getattr(shaper, "part_names", ())
        missing = [n for n in names if n not in run.parts]
        if missing:
            raise GlassrlError(f"--model: {run.where} has no part {missing[0]!r} (the score shaper's state)")
        if names:
            shaper.load_state_dict({n: run.parts[n] for n in names})
    return shapers
