"""Supervised fine-tuning: train a causal LM on prompt/response pairs, loss on response tokens only.

    cfg = load_config(SFTConfig, "examples/sft.yaml", ["steps=50"])
    metrics = train_sft(cfg)

Each example is ``format_prompt(tokenizer, prompt)`` — a text prompt first rendered as
``glassrl train`` renders it (``chat_template``, ``system_prompt``: :func:`render_pairs`) —
followed by the response's tokens and EOS (:func:`glassrl.data.collate.encode_responses`). The loss
is the token-mean cross-entropy of the response tokens (Ouyang et al. 2022, InstructGPT, §3.5
"SFT"): prompt tokens and padding are masked out. ``train/loss`` is that token mean over the steps since the last row;
``eval/loss`` over the whole held-out set.

The loop is the supervised trainers' one (glassrl.supervised.loop: lock, seeds, progress bar,
non-finite policy, staged outputs); this module supplies its :class:`SFTObjective`. Writes to
``output_dir``: the model and tokenizer (``save_pretrained``, safetensors), ``sft_config.yaml``
and ``metrics.jsonl`` (one JSON object per logged step; a non-finite value is null).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from rich.console import Console

from glassrl import config_paths
from glassrl.config import at_least, check_seed, check_threads, fail, knob_set, option
from glassrl.data.collate import collate, encode_responses
from glassrl.data.formatting import format_prompts
from glassrl.data.tasks import TASKS, held_out_split, load_task, parse_task
from glassrl.errors import GlassrlError
from glassrl.jsonl import jsonl_objects
from glassrl.models.loading import pad_id, resolve_model_path
from glassrl.models.memory import check_training_fits
from glassrl.optim import OptimConfig
from glassrl.supervised.foreign_names import SFT_NAMES
from glassrl.supervised.loop import LOWER, Tally, check_positions, epoch_steps, model_dir, train_supervised
from glassrl.supervised.rendering import render_prompts, rendering_row


@dataclass
class SFTConfig:
    """What ``glassrl sft CONFIG`` reads (examples/sft.yaml). Checked by :meth:`validate`."""

    model: str = option(
        "default", help="checkpoint dir or hub id in the local HF cache, or \"default\" (the embedded default model)"
    )
    tokenizer: str | None = option(None, help="tokenizer directory or cached hub id; null = the model's")
    data: str | list[str] = option(
        "task:add", help="\"task:NAME[/SPLIT]\" or a JSONL of prompt/response; a list is concatenated"
    )
    eval_data: str | list[str] | None = option(
        None, help="the same forms; null = the test splits of data's tasks (JSONL: none)"
    )
    seed: int = option(0, help="seeds python, numpy, torch and the data order")
    steps: int | None = option(None, help="optimiser steps; null = epochs passes over data")
    epochs: float = option(1.0, help="passes over data when steps is null")
    batch_size: int = option(32, help="examples per optimiser step")
    max_length: int = option(64, help="longest prompt+response in tokens; a longer example is an error naming it")
    chat_template: Literal["auto", "none"] = option(
        "auto", help="auto: text prompts use the tokenizer's template, as in glassrl train"
    )
    system_prompt: str | None = option(None, help="system message put first in every prompt the chat template renders")
    optim: OptimConfig = option(
        factory=lambda: OptimConfig(lr=1e-3, warmup_steps=10, decay="cosine"),
        help="optimiser and schedule (shared with glassrl train)",
    )
    output_dir: str = option("runs/sft", help="model, tokenizer, sft_config.yaml, metrics.jsonl")
    eval_every: int = option(0, help="steps between evaluations of the eval loss; 0 = only at the end")
    log_every: int = option(10, help="steps between metric rows")
    device: str = option("auto", help="auto (CUDA when visible) | cpu | cuda | cuda:N")
    threads: int | Literal["auto"] = option(
        "auto", help="intra-op CPU threads: N, or auto = the cores free now (glassrl.models.threads)"
    )
    on_nonfinite: Literal["stop", "skip"] = option(
        "stop", help="NaN/inf loss or grad norm: stop (exit 2, no output) or skip it"
    )

    title = "glassrl sft: resolved"
    FOREIGN_NAMES = SFT_NAMES  # TRL's names -> the hint of an unknown-key error (glassrl.supervised.foreign_names)

    def anchor_paths(self, config_dir: Path, command_line: Set[str] = frozenset(), saved: bool = False) -> None:
        """data and eval_data named in a config file are read from its directory (glassrl.config_paths)."""
        config_paths.anchor_data(self, ("data", "eval_data"), config_dir, command_line, saved)

    def validate(self, written: Set[str] | None = None) -> None:
        """Ranges and ignored knobs; GlassrlError naming the key (see glassrl.config)."""
        at_least(1, {"steps": self.steps, "batch_size": self.batch_size, "max_length": self.max_length})
        at_least(1, {"log_every": self.log_every})
        at_least(0, {"eval_every": self.eval_every})
        if self.steps is None and not self.epochs > 0:
            fail("epochs", self.epochs, "must be > 0 when steps is null")
        if self.steps is not None and knob_set(self, "epochs", written):
            fail(
                "epochs",
                self.epochs,
                f"ignored: steps = {self.steps} sets the length (steps: null trains by epochs); remove it",
            )
        check_threads(self.threads)
        check_seed(self.seed)
        self.optim.check("optim")

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, value, unit) rows of the table printed at start (print_resolved)."""
        length = (f"{self.steps}", "optimiser steps") if self.steps is not None else (f"{self.epochs:g}", "epochs")
        return [
            ("training length", *length),
            ("batch", f"{self.batch_size}", "examples, per optimiser step"),
            ("max length", f"{self.max_length}", "tokens, prompt + response"),
            rendering_row(self.chat_template),
            ("data", _spec_text(self.data), "training pairs"),
            ("eval data", _spec_text(self.eval_data) if self.eval_data else "test splits of data's tasks", "held out"),
            *self.optim.rows(),
        ]


Example = tuple[list[int], list[int]]  # (prompt_ids, response_ids)


def load_pairs(spec: str) -> list[tuple[Any, str, str]]:
    """(prompt, response, source) triples from "task:NAME[/SPLIT]" or a JSONL file."""
    if (ref := parse_task(spec)) is not None:
        if ref.name not in TASKS:
            raise GlassrlError(
                f"data: unknown task {ref.name!r} in {spec!r}; valid: {', '.join('task:' + t for t in TASKS)}"
            )
        return [(r.prompt, str(r.answer), r.source) for r in load_task(ref.name, ref.split)]
    path = Path(spec)
    if not path.is_file():
        raise GlassrlError(f"data: {spec!r} is neither task:NAME (valid: {', '.join(TASKS)}) nor a JSONL file")
    rows = []
    for row, where in jsonl_objects(path):
        for key in ("prompt", "response"):
            if key not in row:
                raise GlassrlError(f"{where}: missing field \"{key}\"")
        prompt, response = row["prompt"], row["response"]
        if isinstance(prompt, list):
            if not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in prompt
            ):
                raise GlassrlError(f"{where}: field \"prompt\": messages must be {{\"role\": str, \"content\": str}}")
            prompt = tuple(prompt)
        elif not isinstance(prompt, str):
            raise GlassrlError(f"{where}: field \"prompt\" must be a string or a list of messages")
        if not isinstance(response, str):
            raise GlassrlError(f"{where}: field \"response\" must be a string")
        rows.append((prompt, response, where))
    if not rows:
        raise GlassrlError(f"{path}: no examples")
    return rows


def tokenize_pairs(tokenizer, rows: list[tuple[Any, str, str]], max_length: int) -> list[Example]:
    """Encode each row as (format_prompt ids, response ids + EOS); too long is an error naming the row."""
    prompts = format_prompts(tokenizer, [prompt for prompt, _, _ in rows], [source for _, _, source in rows])
    responses = encode_responses(tokenizer, [response for _, response, _ in rows])
    examples = []
    for prompt_ids, response_ids, (_, _, source) in zip(prompts, responses, rows):
        if len(prompt_ids) + len(response_ids) > max_length:
            raise GlassrlError(
                f"{source}: prompt+response is {len(prompt_ids) + len(response_ids)} tokens, "
                f"more than max_length={max_length}"
            )
        examples.append((prompt_ids, response_ids))
    return examples


def render_pairs(tokenizer, cfg: SFTConfig, rows: list[tuple[Any, str, str]], key: str) -> list[tuple[Any, str, str]]:
    """Rows with their text prompts rendered as ``glassrl train`` renders them (chat_template,
    system_prompt: glassrl.models.chat_rendering), so SFT trains the format RL samples."""
    prompts = render_prompts(
        tokenizer, [p for p, _, _ in rows], [s for _, _, s in rows], cfg.chat_template, cfg.system_prompt, key
    )
    return [(prompt, response, source) for prompt, (_, response, source) in zip(prompts, rows)]


def response_loss(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy over response tokens and their count, for one collated batch.

    Logits at absolute position P-1+i predict response token i (batch layout of
    glassrl.optim), so only the last T+1 positions need logits.
    """
    P = int(batch["prompt_len"])
    mask = batch["response_mask"]  # (B, T)
    T = mask.shape[1]
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"].long(),
        position_ids=batch["position_ids"],
        logits_to_keep=T + 1,
    ).logits[:, :-1]  # (B, T, V)
    targets = torch.where(mask, batch["input_ids"][:, P:], -100)  # (B, T)
    loss_sum = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum")
    return loss_sum, mask.sum()


@torch.no_grad()
def eval_loss(model, examples: list[Example], batch_size: int, pad_id: int, device: torch.device) -> float:
    """Token-mean response cross-entropy over ``examples``."""
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device), torch.zeros((), device=device)
    for start in range(0, len(examples), batch_size):
        batch = {k: v.to(device) for k, v in collate(examples[start : start + batch_size], pad_id).items()}
        loss_sum, n = response_loss(model, batch)
        total, count = total + loss_sum, count + n
    model.train(was_training)
    return (total / count).item()


def train_sft(cfg: SFTConfig, model=None, tokenizer=None, console: Console | None = None) -> dict[str, float]:
    """Run SFT as ``cfg`` says; returns the final metrics (train/loss, eval/loss when evaluated,
    steps, examples, time_s). ``model``/``tokenizer`` given in memory are used instead of loading."""
    return train_supervised(cfg, lambda device: SFTObjective.build(cfg, device, model, tokenizer), console)


@dataclass
class SFTObjective:
    """SFT's pieces of the supervised loop (glassrl.supervised.loop)."""

    model: Any
    tokenizer: Any
    train: list[Example]
    evals: list[Example]  # held out; empty: no eval/loss
    steps: int
    batch_size: int
    pad_id: int
    device: torch.device

    name = "sft"
    train_keys = ("train/loss",)  # a token mean over the steps since the last row

    @classmethod
    def build(cls, cfg: SFTConfig, device: torch.device, model=None, tokenizer=None) -> SFTObjective:
        """Load the model (unless given), tokenise the data and the held-out pairs."""
        if model is None:
            what = f"batch_size = {cfg.batch_size} × max_length = {cfg.max_length}:"
            check_training_fits(
                model_dir(cfg.model), cfg.batch_size, cfg.max_length, device, what, LOWER, vocabulary=True
            )
            model, tokenizer = _load(cfg, tokenizer)
        elif tokenizer is None:
            raise GlassrlError("train_sft: a model given in memory needs its tokenizer too")
        model.to(device).train()
        check_positions(model, cfg.max_length, cfg.model)
        render = partial(render_pairs, tokenizer, cfg)
        train = tokenize_pairs(tokenizer, render(_load_all(cfg.data), "data"), cfg.max_length)
        eval_specs = cfg.eval_data or [t for s in _as_list(cfg.data) if (t := held_out_split(s)) is not None]
        evals = tokenize_pairs(tokenizer, render(_load_all(eval_specs), "eval_data"), cfg.max_length)
        steps = cfg.steps if cfg.steps is not None else epoch_steps(cfg.epochs, len(train), cfg.batch_size)
        return cls(model, tokenizer, train, evals, steps, cfg.batch_size, pad_id(tokenizer), device)

    @property
    def sizes(self) -> dict[str, float]:
        return {"examples": len(self.train)}

    def loss(self, examples: list[Example]) -> tuple[torch.Tensor, Tally]:
        batch = {k: v.to(self.device) for k, v in collate(examples, self.pad_id).items()}
        loss_sum, n_tokens = response_loss(self.model, batch)
        return loss_sum / n_tokens, Tally(int(n_tokens), {"train/loss": loss_sum.item()})

    def evaluate(self) -> dict[str, float]:
        if not self.evals:
            return {}
        return {"eval/loss": eval_loss(self.model, self.evals, self.batch_size, self.pad_id, self.device)}

    def finish(self, out: Path, result: dict[str, float]) -> None:
        pass  # the model, tokenizer, sft_config.yaml and metrics.jsonl are the loop's

    def summary(self, result: dict[str, float]) -> str:
        return ", ".join(f"{key} {result[key]:.4f}" for key in ("train/loss", "eval/loss") if key in result)


def _spec_text(spec: str | list[str]) -> str:
    return spec if isinstance(spec, str) else ", ".join(spec)


def _as_list(spec: str | list[str]) -> list[str]:
    return [spec] if isinstance(spec, str) else list(spec)


def _load_all(spec: str | list[str]) -> list[tuple[Any, str, str]]:
    return [row for one in _as_list(spec) for row in load_pairs(one)]


def _load(cfg: SFTConfig, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_dir(cfg.model)
    if not (path / "config.json").is_file():
        raise GlassrlError(f"model: no Hugging Face checkpoint (config.json) in {str(path)!r}")
    tok_path = resolve_model_path(cfg.tokenizer, "tokenizer") if cfg.tokenizer else path
    if tokenizer is None:
        if not tok_path.is_dir():
            raise GlassrlError(f"tokenizer: no directory {str(tok_path)!r}")
        tokenizer = AutoTokenizer.from_pretrained(tok_path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer
