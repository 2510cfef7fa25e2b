"""``glassrl explain --model DPO_RUN --prompt … --chosen … --rejected …``: the preference ledger of a pair.

A run of ``glassrl dpo`` (its ``glassrl.json`` says ``"kind": "preference"``) computes log π_θ of
each token of the chosen and the rejected response, its reference log π_ref (the run's π_ref:
``reference`` of glassrl.json, or ``--reference``), and the implicit rewards and the loss of the
run's preference loss with its β (glassrl.ledger.implicit_rewards: the trainer's functions). The
pair is laid out as in training: ``format_prompt(x)`` ⊕ response ⊕ EOS, the prompt rendered by the
run's ``chat_template`` and ``system_prompt`` (glassrl.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from glassrl.algos.losses import PREFERENCE_LOSSES, PreferenceLossParams
from glassrl.data.collate import encode_response
from glassrl.data.formatting import format_prompt
from glassrl.errors import GlassrlError
from glassrl.ledger.implicit_rewards import SideNumbers, pair_ledger
from glassrl.ledger.preference import PreferenceLedger
from glassrl.models import load_causal_lm, load_tokenizer, pad_id
from glassrl.models.lora import LoraConfig, is_adapter_dir, load_lora_model
from glassrl.supervised.reference import sequence_logprobs
from glassrl.supervised.rendering import render_prompts

MARKER = "glassrl.json"
PAIR = ("chosen", "rejected")
# explain's flags for a sampled or given response and its RL parameters: a preference run has none
NOT_WITH_PAIR = (
    *("response", "sample", "seed", "reward", "answer"),
    *("gamma", "lam", "beta", "estimator", "kl_kind", "whiten"),
)


def is_preference_run(path: str | Path) -> bool:
    """Whether ``path`` is the output of ``glassrl dpo``."""
    marker = Path(path) / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("kind") == "preference"
    except (OSError, ValueError):
        return False


def check_flags(args: argparse.Namespace) -> bool:
    """Whether ``glassrl explain`` shows a preference ledger (``--model`` a preference run); the flags
    that do not fit the mode are one-line errors naming them."""
    pair = [f"--{k}" for k in PAIR if getattr(args, k) is not None]
    if args.model is None or not is_preference_run(args.model):
        if pair:
            where = "needs --model" if args.model is None else f"--model {args.model} is not a run of glassrl dpo;"
            raise GlassrlError(f"{pair[0]}: {where} (a run of glassrl dpo, whose pairs it explains)")
        return False
    for key in NOT_WITH_PAIR:
        if getattr(args, key) is not None:
            flag = "--" + key.replace("_", "-")
            raise GlassrlError(f"{flag}: not for a preference run ({args.model}); give --chosen and --rejected")
    if args.html is not None:
        raise GlassrlError("--html: not for a preference pair; glassrl report RUN_DIR shows its token view")
    if args.format == "csv":
        raise GlassrlError("--format csv: not for a preference pair; use jsonl (one JSON line)")
    for key in ("prompt", *PAIR):
        if getattr(args, key) is None:
            raise GlassrlError(f"--{key}: missing (a preference run explains --prompt, --chosen and --rejected)")
    return True


def from_args(args: argparse.Namespace) -> tuple[PreferenceLedger, list[str]]:
    """(ledger, header lines) of ``glassrl explain --model DPO_RUN --prompt … --chosen … --rejected …``."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per loaded model would bury the ledger
    ledger = explain_pair(args.model, args.prompt, args.chosen, args.rejected, args.reference)
    return ledger, header(ledger, args.model)


def explain_pair(
    run: str | Path, prompt: str, chosen: str, rejected: str, reference: str | None = None
) -> PreferenceLedger:
    """The preference ledger of (prompt, chosen, rejected) under the run in ``run``."""
    run = Path(run)
    summary = json.loads((run / MARKER).read_text(encoding="utf-8"))
    loss = summary["loss"]
    if loss not in PREFERENCE_LOSSES:
        raise GlassrlError(f"{run / MARKER}: unknown loss {loss!r}; valid: {', '.join(PREFERENCE_LOSSES)}")
    params = PreferenceLossParams(**summary["params"])
    tokenizer = load_tokenizer(run)
    policy = _policy(run, summary)
    # rendered as the run rendered its text prompts; a run from before it recorded the rule fed them raw
    mode, system = summary.get("chat_template", "none"), summary.get("system_prompt")
    (rendered,) = render_prompts(tokenizer, [prompt], ["--prompt"], mode, system, "--prompt")
    prompt_ids = format_prompt(tokenizer, rendered, "--prompt")
    responses = [encode_response(tokenizer, text) for text in (chosen, rejected)]
    sequences = [(prompt_ids, ids) for ids in responses]
    logprobs = _logprobs(policy, sequences, tokenizer)
    ref_logprobs: list[torch.Tensor | None] = [None, None]
    ref_path = reference or summary.get("reference")
    if PREFERENCE_LOSSES[loss].reference:
        if not ref_path:
            raise GlassrlError(f"{run / MARKER}: no reference recorded; give --reference")
        ref_logprobs = _logprobs(load_causal_lm(ref_path, dtype="float32", device="cpu"), sequences, tokenizer)
    sides = [
        SideNumbers(text, ids, [tokenizer.decode([t]) for t in ids], lp, ref)
        for text, ids, lp, ref in zip((chosen, rejected), responses, logprobs, ref_logprobs)
    ]
    return pair_ledger(prompt, sides[0], sides[1], loss=loss, params=params, source=str(run))


def header(ledger: PreferenceLedger, run: str | Path) -> list[str]:
    """The lines above the ledger: what computed it."""
    return [f"preference run {run} · loss {ledger.loss} · aggregation {ledger.reduction}"]


def _policy(run: Path, summary: dict) -> torch.nn.Module:
    """The trained policy: a full checkpoint, or LoRA adapters on their base."""
    if not is_adapter_dir(run):
        return load_causal_lm(run, dtype="float32", device="cpu")
    settings = LoraConfig(**summary["lora"]).settings()
    return load_lora_model(run, settings, lambda base: load_causal_lm(base, dtype="float32", device="cpu"))


def _logprobs(model: torch.nn.Module, sequences, tokenizer) -> list[torch.Tensor]:
    return sequence_logprobs(model, sequences, batch_size=2, pad_id=pad_id(tokenizer), dtype=torch.float32)
