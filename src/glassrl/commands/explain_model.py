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

The numbers come from the trainer's own functions, in its order (glassrl.trainer.loop,
phases 2–5): reward requests → reward → outcome scores → score shapers → placed scores →
log-probs of actor and reference at the rollout temperature → KL → values → token
rewards → advantages. A given response is tokenised as the trainer's responses are: the
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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glassrl.commands import explain_input
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.trainer.config import TrainConfig

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

# The bundled tasks' prompt forms (glassrl.data.tasks), so that a typed prompt can be scored.
_ARITH_ZH = re.compile(r"请问(\d+)\+(\d+)=(\d+)？")
_ARITH_EN = re.compile(r"Is (\d+)\+(\d+)=(\d+)\?")
_ADD = re.compile(r"(\d+)\+(\d+)=")


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
    from glassrl.config import load_config
    from glassrl.trainer.build import actor_path
    from glassrl.trainer.checkpoint import MANIFEST, CheckpointManager, read_manifest

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
    cfg = load_config(TrainConfig, run / "config.yaml")
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
    metadata: dict[str, Any] = {}
    reference = None
    if m := _ARITH_ZH.fullmatch(prompt) or _ARITH_EN.fullmatch(prompt):
        a, b, c = map(int, m.groups())
        zh, total = prompt.startswith("请问"), a + b
        verdict = ("是的" if c == total else "不是") if zh else ("Yes" if c == total else "No")
        reference = f"{verdict}，等于{total}！" if zh else f"{verdict}, it equals {total}!"
        metadata = {
            "a": a,
            "b": b,
            "c": c,
            "sum": total,
            "is_true": c == total,
            "lang": "zh" if zh else "en",
            "task": "arith-verify",
        }
    elif m := _ADD.fullmatch(prompt):
        a, b = map(int, m.groups())
        reference, metadata = str(a + b), {"a": a, "b": b, "sum": a + b, "task": "add"}
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
    import torch

    from glassrl.algos.advantages import REQUIRED_INPUTS, AdvantageParams
    from glassrl.algos.kl import kl_penalty
    from glassrl.models import load_causal_lm, load_scalar_model, load_tokenizer, response_logprobs, response_values
    from glassrl.models.default_model import format_prompt
    from glassrl.rollout.base import SamplingParams, concat_rollouts
    from glassrl.rollout.hf import HFRolloutEngine
    from glassrl.trainer import experience as X

    cfg, a, r = run.cfg, run.cfg.algo, run.cfg.rollout
    load = dict(dtype=cfg.model.dtype, device=cfg.model.device)
    tokenizer = load_tokenizer(run.actor)
    actor = load_causal_lm(run.actor, **load)
    engine = HFRolloutEngine(actor, tokenizer)
    device = next(actor.parameters()).device
    prompt_ids = format_prompt(tokenizer, prompt)
    batches = [] if response is None else [_given(tokenizer, prompt_ids, response, engine.pad_id, device)]
    generator = torch.Generator(device).manual_seed(seed)
    if sample:
        params = SamplingParams(r.max_new_tokens, r.temperature, r.top_p, r.top_k)
        batches.append(engine.generate([prompt_ids], n=sample, params=params, generator=generator))
    rollout = concat_rollouts(batches, engine.pad_id)
    _check_positions(actor, rollout)

    # Phase 2 of the trainer's step: score, shape, place on tokens.
    reward = _reward(cfg)
    records = [record] * len(rollout)
    results = _scored(reward, X.reward_requests(rollout, records, tokenizer))
    scores, scored = X.outcome_scores(results, device)
    for shape in _shapers(run):
        scores = shape(scores, scored, rollout)
    exp = X.Experience(rollout, records, results, scored, scores, rollout.response_mask)
    exp.token_scores, exp.step_end_mask = X.place_scores(results, scores, rollout, tokenizer)
    if "baseline_rewards" in REQUIRED_INPUTS[a.advantage]:  # ReMax: the greedy response's reward
        greedy = engine.generate(
            [prompt_ids], n=1, params=SamplingParams(r.max_new_tokens, greedy=True), generator=generator
        )
        baseline, _ = X.outcome_scores(_scored(reward, X.reward_requests(greedy, [record], tokenizer)), device)
        exp.baseline_rewards = baseline[rollout.group_index]  # (B,)
    rows = X.estimator_rows(a.advantage, scored, rollout.group_index)
    exp.response_mask = rollout.response_mask & rows.unsqueeze(-1)  # (B, T)

    # Phase 3: log-probs of actor and reference (at the sampling temperature), KL, values.
    T = rollout.response_ids.shape[1]
    with torch.no_grad():
        exp.logprobs, exp.entropy = response_logprobs(
            actor, rollout.input_ids, rollout.attention_mask, T, temperature=r.temperature, with_entropy=True
        )
        reference = load_causal_lm(run.reference, **load)
        exp.ref_logprobs, _ = response_logprobs(
            reference, rollout.input_ids, rollout.attention_mask, T, temperature=r.temperature
        )
        exp.kl = kl_penalty(exp.logprobs, exp.ref_logprobs, a.kl.kind)
        if "values" in REQUIRED_INPUTS[a.advantage]:
            critic = load_scalar_model(run.critic, head=cfg.model.critic_head, **load)
            exp.values = response_values(critic, rollout.input_ids, rollout.attention_mask, T)

    # Phases 4 and 5: token rewards (β only when the KL is in the reward), advantages.
    exp.beta = run.beta if a.kl.placement == "reward" else 0.0
    exp.token_rewards = X.token_rewards(exp.token_scores, exp.kl, exp.beta, exp.response_mask)
    params = AdvantageParams(gamma=a.gamma, lam=a.lam, critic_lam=a.critic_lam, length_alpha=a.length_alpha)
    X.estimate_advantages(exp, a.advantage, params, a.whiten_advantages, a.gamma)
    return _ledger(exp, tokenizer, a, run.step)


def _given(tokenizer, prompt_ids: list[int], response: str, pad_id: int, device):
    """A RolloutBatch of one given response: its tokens then EOS, finished ("stop")."""
    import torch

    from glassrl.rollout.base import RolloutBatch
    from glassrl.rollout.hf import left_pad
    from glassrl.trainer.common import encode_response

    ids = encode_response(tokenizer, response)
    if len(ids) < 2:
        raise GlassrlError("--response: empty (the model's tokenizer makes no token of it)")
    prompt, prompt_mask = left_pad([prompt_ids], pad_id)
    return RolloutBatch(
        prompt.to(device),
        prompt_mask.to(device),
        torch.tensor([ids], device=device),
        torch.ones((1, len(ids)), dtype=torch.bool, device=device),
        torch.zeros(1, dtype=torch.long, device=device),
        ["stop"],
        [tokenizer.decode(ids, skip_special_tokens=True)],
    )


def _check_positions(model, rollout) -> None:
    positions = getattr(model.config, "max_position_embeddings", None)
    P, T = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    if positions is not None and P + T > positions:
        raise GlassrlError(
            f"--response: prompt and response take {P} + {T} tokens, more than the model's {positions} positions"
        )


def _reward(cfg: TrainConfig):
    from glassrl.rewards import build_combined

    try:
        return build_combined(cfg.reward.sources)
    except GlassrlError as err:
        raise GlassrlError(f"--reward: {err}") from None


def _scored(reward, requests):
    """The reward's results; a failed one is an error (explain has nothing to show without a score)."""
    results = reward.score(requests)
    for b, result in enumerate(results):
        if not result.is_ok:
            raise GlassrlError(
                f"--prompt: the reward could not score response {b} "
                f"({result.status}: {result.message}); "
                "give a prompt in a bundled task's form, or --answer TEXT"
            )
    return results


def _shapers(run: ModelRun) -> list:
    """The run's score shapers (glassrl.trainer.experience.SCORE_SHAPERS) with their checkpointed state."""
    from glassrl.trainer.experience import SCORE_SHAPERS

    shapers = []
    for on, make in SCORE_SHAPERS.values():
        if not on(run.cfg.algo):
            continue
        shaper = make(run.cfg.algo)
        names = getattr(shaper, "part_names", ())
        missing = [n for n in names if n not in run.parts]
        if missing:
            raise GlassrlError(f"--model: {run.where} has no part {missing[0]!r} (the score shaper's state)")
        if names:
            shaper.load_state_dict({n: run.parts[n] for n in names})
        shapers.append(shaper)
    return shapers


def _ledger(exp, tokenizer, algo, step: int | None):
    """Every response of ``exp`` as a Ledger (the fields of the trainer's ledger samples)."""
    from glassrl.ledger import Ledger
    from glassrl.trainer.experience import prompt_text

    r = exp.rollout
    return Ledger.from_tensors(
        prompts=[prompt_text(tokenizer, rec.prompt) for rec in exp.records],
        token_texts=[[tokenizer.decode([t]) for t in row.tolist()] for row in r.response_ids],
        response_mask=exp.response_mask,
        estimator=algo.advantage,
        gamma=algo.gamma,
        lam=algo.lam if exp.values is not None else None,
        beta=exp.beta,
        kl_kind=algo.kl.kind,
        token_ids=r.response_ids,
        logprobs=exp.logprobs,
        ref_logprobs=exp.ref_logprobs,
        kl=exp.kl,
        token_scores=exp.token_scores,
        token_rewards=exp.token_rewards,
        values=exp.values,
        deltas=exp.deltas,
        advantages=exp.advantages,
        returns=exp.returns,
        whitened_advantages=exp.whitened_advantages,
        step_end_mask=exp.step_end_mask,
        scores=exp.scores,
        group_ids=r.group_index,
        baseline_rewards=exp.baseline_rewards,
        lengths=r.lengths,
        finish_reasons=r.finish_reasons,
        responses=r.texts,
        step=step,
    )
