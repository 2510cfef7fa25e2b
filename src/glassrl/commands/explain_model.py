"""``glassrl explain --model``: the ledger of real responses, every number computed by models.

    glassrl explain --model runs/grpo --prompt "请问1+1=2？" --response "是的，等于2！" --sample 3

``--model`` names a training run directory (its latest checkpoint), one checkpoint of a run
(``RUN/checkpoints/step_XXXXXXXX``), or a plain Hugging Face model directory; the models
compute phases 2–5 of the trainer's step (glassrl.rl.explain, which says what each case
reads). This module reads the flags and prints the header.

From a run, γ, λ, β, the estimator, the KL estimator and whitening are the run's; for a
plain model, explain's defaults with a critic-free estimator (grpo for two responses or more,
reinforce_pp for one), ``--reward`` (default: arith_verify, TrainConfig's, for a prompt in a
bundled task's form, else math against ``--answer``; or your function, ``file.py:fn``) and
``--reference`` (default: the model itself). Parameter flags (``--gamma``, ``--lam``,
``--beta``, ``--estimator``, ``--kl-kind``, ``--whiten``, ``--reward``, ``--reference``)
override the run's values (what if λ were 0?). ``--sample N`` adds N responses sampled with
the run's rollout settings from a generator seeded with ``--seed``; ``--answer`` gives the
reference answer of a prompt that is not in a bundled task's form.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glassrl.commands import explain_input
from glassrl.errors import GlassrlError

if TYPE_CHECKING:
    from glassrl.ledger import Ledger
    from glassrl.rl.explain import ModelRun

# explain parameter -> the TrainConfig field it stands for
CONFIG_FIELDS = {
    "gamma": "algo.gamma",
    "lam": "algo.lam",
    "estimator": "algo.advantage",
    "kl_kind": "algo.kl.kind",
    "whiten": "algo.whiten_advantages",
}


def _flag(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def open_run(args: argparse.Namespace, console=None) -> ModelRun:
    """``--model`` opened (with ``--reference`` and ``--reward``; glassrl.rl.explain.open_model),
    its parameters resolved (:func:`resolve_params`)."""
    from glassrl.rl.explain import open_model

    run = open_model(
        Path(args.model), reference=args.reference, reward=args.reward, prompt=args.prompt, console=console
    )
    resolve_params(args, run)
    return run


def resolve_params(args: argparse.Namespace, run: ModelRun) -> explain_input.ExplainInput:
    """γ, λ, β, estimator, KL kind, whitening: the run's (explain's defaults for a plain model),
    overridden by flags; checked, and set on ``run``. Errors name the flag or the run's config field."""
    from glassrl.rl.explain import set_params

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
    elif run.critic is None:  # a plain model: a critic-free estimator, GRPO's when there is a group
        params["estimator"] = "grpo" if _responses(args) >= 2 else "reinforce_pp"
    for key in explain_input.PARAM_KEYS:
        if getattr(args, key) is not None:
            params[key], labels[key] = getattr(args, key), _flag(key)
    spec = explain_input.params(params, labels)
    if args.beta is not None and a.kl.placement != "reward":
        raise GlassrlError(
            f"--beta: {run.config_label}algo.kl.placement = {a.kl.placement}: this run's KL is not in "
            "the reward, so β of the token rewards does not apply"
        )
    set_params(
        run,
        gamma=spec.gamma,
        lam=spec.lam,
        estimator=spec.estimator,
        kl_kind=spec.kl_kind,
        whiten=bool(spec.whiten),
        beta=spec.beta,
    )
    return spec


def _responses(args: argparse.Namespace) -> int:
    """How many responses the ledger will hold: the given one and the sampled ones."""
    sample = 0 if args.sample is None else explain_input.integer(args.sample, "--sample")
    return int(args.response is not None) + sample


def from_args(args: argparse.Namespace, console=None) -> tuple[Ledger, list[str]]:
    """(ledger, header lines) of ``glassrl explain --model …``."""
    from transformers.utils import logging as hf_logging

    from glassrl.rl.explain import model_ledger, prompt_record

    hf_logging.disable_progress_bar()  # a bar per loaded model would bury the ledger
    if args.prompt is None:
        raise GlassrlError("--prompt: missing (the prompt the model answers)")
    sample = 0 if args.sample is None else explain_input.integer(args.sample, "--sample")
    if args.sample is not None and sample < 1:
        raise GlassrlError(f"--sample: expected a number of responses >= 1, got {sample}")
    seed = 0 if args.seed is None else explain_input.integer(args.seed, "--seed")
    if args.response is None and sample == 0:
        raise GlassrlError("--response: missing (give the response text, or --sample N to sample N responses)")
    run = open_run(args, console)
    estimator = run.cfg.algo.advantage
    label = f"{run.config_label}algo.advantage" if run.config_label and args.estimator is None else "--estimator"
    _check_estimator(run, estimator, label, _responses(args))
    if sample:
        _check_fits(run, args.prompt, sample, _responses(args))
    ledger = model_ledger(run, args.prompt, args.response, sample, seed, prompt_record(args.prompt, args.answer))
    return ledger, _header(run, sample, seed)


def _check_fits(run: ModelRun, prompt: str, sample: int, responses: int) -> None:
    """``--sample N``: sampling the ``responses`` and the forward passes over them fit the memory, before a
    model loads (glassrl.rl.memory.check_sampling_fits: the key-value cache, the per-token tensors, the
    logits of a micro-batch, the weights of the actor, the reference and a critic); one line naming each
    part's figure otherwise (issue 37: ``--sample 100000000`` had no estimate)."""
    from glassrl.models import load_tokenizer
    from glassrl.rl.memory import check_sampling_fits

    if not (run.actor / "config.json").is_file():
        return  # the loader says so
    longest = len(load_tokenizer(run.actor)(prompt)["input_ids"])
    others = [run.reference] + ([run.critic] if run.critic is not None else [])
    check_sampling_fits(
        run.cfg,
        run.actor,
        responses,
        longest,
        f"--sample {sample}",
        "lower --sample (or rollout.max_new_tokens)",
        also=others,  # each loaded again, the reference too when it is the actor's directory
        forward=min(responses, run.cfg.batch.micro_batch_responses),
    )


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
    from glassrl.algos.advantages import ADVANTAGE_ESTIMATORS, GROUP_ESTIMATORS

    if ADVANTAGE_ESTIMATORS[estimator].critic and run.critic is None:
        free = [name for name, e in ADVANTAGE_ESTIMATORS.items() if not e.critic]
        raise GlassrlError(
            f"{label}: {estimator} needs a critic's values, and {run.where} has no critic; "
            f"use a critic-free estimator: {', '.join(free)}"
        )
    if estimator in GROUP_ESTIMATORS and count < 2:
        raise GlassrlError(
            f"--sample: estimator {estimator} compares the responses to one prompt and needs at "
            f"least 2, got {count} (add --sample N)"
        )
