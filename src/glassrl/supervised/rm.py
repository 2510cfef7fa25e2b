"""Reward-model training: a scalar model fitted to preference pairs with the Bradley–Terry loss.

    cfg = load_config(RMConfig, "examples/rm.yaml", ["steps=50"])
    metrics = train_rm(cfg)

Each pair (x, y_c, y_r) becomes two sequences, ``format_prompt(x)`` ⊕ ``y_c`` ⊕ EOS and
``format_prompt(x)`` ⊕ ``y_r`` ⊕ EOS — the tokens the policy produces, in the project's batch
layout (:mod:`glassrl.optim`), a text prompt first rendered as ``glassrl train`` renders it
(``chat_template``, ``system_prompt``: glassrl.supervised.rendering) — and both go through the model
in one forward pass.
The reward r(x, y) is the scalar at the last real token (EOS), read with
:func:`glassrl.models.sequence_scores` (Ouyang et al. 2022, InstructGPT, §3.5). The loss is
the mean over pairs of −log σ(r_c − r_r − m) (InstructGPT eq. 1; with margin m: Touvron et al.
2023, Llama 2, §3.2.2 eq. 2), the margin only when ``use_margin``.

Logged metrics (``metrics.jsonl``): train/loss, train/accuracy and train/reward_gap (mean
r_c − r_r, margin not subtracted), averaged over the steps since the last log; train/grad_norm
(before clipping) and train/lr at the logged step; eval/accuracy, eval/loss and eval/reward_gap
over the whole held-out set.

Pairwise accuracy is the fraction of pairs with r_c > r_r strictly: a tie counts as wrong, so
a model that scores everything alike has accuracy 0, not 0.5.

Writes to ``output_dir``: the scalar model (``save_pretrained``, safetensors; loads back with
:func:`glassrl.models.load_scalar_model` and the same ``head``), the tokenizer,
``rm_config.yaml``, ``metrics.jsonl`` (one JSON object per logged step; a non-finite value is
null) and ``glassrl.json`` (what was trained, on what, and the final held-out accuracy). The
loop is the supervised trainers' one (glassrl.supervised.loop: lock, seeds, progress bar,
non-finite policy, staged outputs), as for ``glassrl sft``; this module supplies its
:class:`RMObjective`.
"""

from __future__ import annotations

import json
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from rich.console import Console

from glassrl import config_paths
from glassrl.algos.losses import pairwise_rm_loss
from glassrl.config import at_least, check_seed, check_threads, fail, option
from glassrl.data.collate import collate, encode_response
from glassrl.data.formatting import format_prompt
from glassrl.data.preferences import degenerate_pairs, load_preferences
from glassrl.data.records import PreferencePair
from glassrl.data.tasks import held_out_split
from glassrl.errors import GlassrlError
from glassrl.models import has_scalar_head, load_scalar_model, load_tokenizer, sequence_scores
from glassrl.models.memory import check_training_fits
from glassrl.optim import OptimConfig
from glassrl.run.atomic import write_text
from glassrl.supervised.foreign_names import REWARD_NAMES
from glassrl.supervised.loop import LOWER, Tally, check_positions, model_dir, train_supervised, warn
from glassrl.supervised.rendering import render_records, rendering_row


@dataclass
class RMConfig:
    """What ``glassrl rm CONFIG`` reads (examples/rm.yaml). Checked by :meth:`validate`."""

    model: str = option(
        "default", help="causal LM (+ fresh head) or scalar checkpoint of this head: dir, cached hub id, \"default\""
    )
    head: Literal["token-classification", "value-head"] = option(
        "token-classification",
        help="backbone + score Linear (plain HF), or causal LM + v_head (glassrl.models.value_head)",
    )
    data: str = option(
        "task:arith-verify-preferences", help="\"task:NAME[/SPLIT]\" (a bundled preference set) or a JSONL of pairs"
    )
    eval_data: str | None = option(
        None, help="the same forms; null = the test split of a task:NAME data (a JSONL data needs one)"
    )
    use_margin: bool = option(False, help="subtract each pair's margin inside the sigmoid (every pair must have one)")
    seed: int = option(0, help="seeds python, numpy, torch (the fresh head) and the data order")
    steps: int = option(200, help="optimiser steps, each on batch_size pairs (2 × batch_size sequences)")
    batch_size: int = option(32, help="preference pairs per optimiser step")
    max_length: int = option(64, help="longest prompt+response in tokens; a longer pair is an error naming it")
    chat_template: Literal["auto", "none"] = option(
        "auto", help="auto: text prompts use the tokenizer's template, as in glassrl train and sft (docs/data.md)"
    )
    system_prompt: str | None = option(None, help="system message put first in every prompt the chat template renders")
    optim: OptimConfig = option(
        factory=lambda: OptimConfig(lr=1e-4, warmup_steps=10, decay="cosine"),
        help="optimiser and schedule (shared with glassrl train)",
    )
    output_dir: str = option("runs/rm", help="reward model, tokenizer, rm_config.yaml, metrics.jsonl, glassrl.json")
    eval_every: int = option(0, help="steps between held-out evaluations; 0 = only at the end")
    log_every: int = option(10, help="steps between metric rows")
    device: str = option("auto", help="auto (CUDA when visible) | cpu | cuda | cuda:N")
    threads: int | Literal["auto"] = option(
        "auto", help="intra-op CPU threads: N, or auto = the cores free now (glassrl.models.threads)"
    )
    on_nonfinite: Literal["stop", "skip"] = option(
        "stop", help="NaN/inf loss or grad norm: stop (exit 2, no output) or skip it"
    )

    title = "glassrl rm: resolved"
    FOREIGN_NAMES = REWARD_NAMES  # TRL's names -> the hint of an unknown-key error (glassrl.supervised.foreign_names)

    def anchor_paths(self, config_dir: Path, command_line: Set[str] = frozenset(), saved: bool = False) -> None:
        """data and eval_data named in a config file are read from its directory (glassrl.config_paths)."""
        config_paths.anchor_data(self, ("data", "eval_data"), config_dir, command_line, saved)

    def validate(self, written: Set[str] | None = None) -> None:
        """Ranges and the held-out set; GlassrlError naming the key (see glassrl.config)."""
        at_least(1, {"steps": self.steps, "batch_size": self.batch_size, "max_length": self.max_length})
        at_least(1, {"log_every": self.log_every})
        at_least(0, {"eval_every": self.eval_every})
        if self.eval_data is None and held_out_split(self.data) is None:
            fail("eval_data", None, f"needed when data is a file ({self.data}); give a held-out JSONL file")
        check_threads(self.threads)
        check_seed(self.seed)
        self.optim.check("optim")

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, value, unit) rows of the table printed at start (print_resolved)."""
        return [
            ("training steps", f"{self.steps}", "optimiser steps"),
            ("batch", f"{self.batch_size}", "pairs, per optimiser step"),
            ("sequences per step", f"{2 * self.batch_size}", "chosen + rejected, one forward pass"),
            ("max length", f"{self.max_length}", "tokens, prompt + response"),
            ("head", self.head, "scalar head"),
            rendering_row(self.chat_template),
            ("loss", "−log σ(r_c − r_r" + (" − m)" if self.use_margin else ")"), "Bradley–Terry, mean over pairs"),
            ("data", self.data, "training pairs"),
            ("eval data", _eval_spec(self), "held-out pairs"),
            *self.optim.rows(),
        ]


# (prompt_ids, chosen_ids, rejected_ids, margin)
Example = tuple[list[int], list[int], list[int], float | None]


def encode_pairs(tokenizer, pairs: list[PreferencePair], max_length: int) -> list[Example]:
    """Tokenise each pair as the policy would see it; too long is an error naming the pair."""
    examples = []
    for pair in pairs:
        prompt = format_prompt(tokenizer, pair.prompt, pair.source)
        chosen, rejected = encode_response(tokenizer, pair.chosen), encode_response(tokenizer, pair.rejected)
        longest = len(prompt) + max(len(chosen), len(rejected))
        if longest > max_length:
            raise GlassrlError(f"{pair.source}: prompt+response is {longest} tokens, more than max_length={max_length}")
        examples.append((prompt, chosen, rejected, pair.margin))
    return examples


def pair_rewards(
    model, examples: list[Example], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards (B,) of the chosen and of the rejected responses of B pairs, from one forward pass."""
    rows = [(p, c) for p, c, _, _ in examples] + [(p, r) for p, _, r, _ in examples]
    batch = collate(rows, pad_id)
    scores = sequence_scores(model, batch["input_ids"].to(device), batch["attention_mask"].to(device))  # (2B,)
    return scores[: len(examples)], scores[len(examples) :]


def margins(examples: list[Example], device: torch.device) -> torch.Tensor:
    """The pairs' margins (B,); call only when every pair has one (checked by ``train_rm``)."""
    return torch.tensor([m for _, _, _, m in examples], dtype=torch.float32, device=device)


def pairwise_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> float:
    """Fraction of pairs with r_c > r_r, from rewards (B,); a tie counts as wrong.

    Counted in integers, so 364 right of 500 reads 0.728 exactly."""
    return (chosen > rejected).sum().item() / chosen.numel()


@torch.no_grad()
def evaluate(
    model, examples: list[Example], *, batch_size: int, pad_id: int, device: torch.device, use_margin: bool
) -> dict[str, float]:
    """Held-out metrics over ``examples``: eval/accuracy, eval/loss (as trained), eval/reward_gap (mean r_c − r_r)."""
    was_training = model.training
    model.eval()
    chosen, rejected, losses = [], [], []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        r_c, r_r = pair_rewards(model, chunk, pad_id, device)
        losses.append(pairwise_rm_loss(r_c, r_r, margins(chunk, device) if use_margin else None))
        chosen.append(r_c)
        rejected.append(r_r)
    model.train(was_training)
    r_c, r_r = torch.cat(chosen), torch.cat(rejected)  # (N,)
    return {
        "eval/accuracy": pairwise_accuracy(r_c, r_r),
        "eval/loss": torch.cat(losses).mean().item(),
        "eval/reward_gap": (r_c - r_r).mean().item(),
    }


def train_rm(cfg: RMConfig, console: Console | None = None) -> dict[str, float]:
    """Train a reward model as ``cfg`` says; returns the final metrics (train/…, eval/…, steps,
    pairs, eval_pairs, time_s). ``eval/accuracy`` is the held-out pairwise accuracy."""
    return train_supervised(cfg, lambda device: RMObjective.build(cfg, device, console), console)


@dataclass
class RMObjective:
    """The reward model's pieces of the supervised loop (glassrl.supervised.loop)."""

    cfg: RMConfig
    path: Path  # the model trained from
    model: Any
    tokenizer: Any
    train: list[Example]
    evals: list[Example]
    pad_id: int
    device: torch.device

    name = "rm"
    train_keys = ("train/loss", "train/accuracy", "train/reward_gap")  # means over the steps since the last row

    @classmethod
    def build(cls, cfg: RMConfig, device: torch.device, console: Console | None = None) -> RMObjective:
        """Load the model with a scalar head (fresh, drawn from the seeded RNG, or the checkpoint's) and the
        pairs; a fresh head is said in one line (transformers' notice of its MISSING weights is silenced)."""
        path = model_dir(cfg.model)
        what = f"batch_size = {cfg.batch_size} pairs × max_length = {cfg.max_length}:"
        check_training_fits(path, 2 * cfg.batch_size, cfg.max_length, device, what, LOWER, vocabulary=False)
        if not has_scalar_head(path):
            (console or Console()).print(
                f"rm: a new scalar head ({cfg.head}: Linear(hidden, 1)) on {path}'s backbone, drawn from "
                f"seed {cfg.seed}: it starts untrained, as it should (transformers' notice of its missing "
                "weights is not shown)",
                markup=False,
                soft_wrap=True,
            )
        tokenizer = load_tokenizer(path)
        model = load_scalar_model(path, head=cfg.head, dtype="float32", device=str(device)).train()
        check_positions(model, cfg.max_length, str(path))
        sets = {"data": load_preferences(cfg.data), "eval_data": load_preferences(_eval_spec(cfg))}
        for key, pairs in sets.items():
            warn(degenerate_pairs(pairs, key), console)
            sets[key] = render_records(tokenizer, pairs, cfg.chat_template, cfg.system_prompt, key)
        if cfg.use_margin:
            _check_margins(sets)
        train = encode_pairs(tokenizer, sets["data"], cfg.max_length)
        evals = encode_pairs(tokenizer, sets["eval_data"], cfg.max_length)
        return cls(cfg, path, model, tokenizer, train, evals, tokenizer.pad_token_id, device)

    @property
    def steps(self) -> int:
        return self.cfg.steps

    @property
    def sizes(self) -> dict[str, float]:
        return {"pairs": len(self.train), "eval_pairs": len(self.evals)}

    def loss(self, examples: list[Example]) -> tuple[torch.Tensor, Tally]:
        r_c, r_r = pair_rewards(self.model, examples, self.pad_id, self.device)
        loss = pairwise_rm_loss(r_c, r_r, margins(examples, self.device) if self.cfg.use_margin else None).mean()
        sums = {
            "train/loss": loss.item(),
            "train/accuracy": pairwise_accuracy(r_c, r_r),
            "train/reward_gap": (r_c - r_r).mean().item(),
        }
        return loss, Tally(1, sums)

    def evaluate(self) -> dict[str, float]:
        cfg = self.cfg
        return evaluate(
            self.model,
            self.evals,
            batch_size=cfg.batch_size,
            pad_id=self.pad_id,
            device=self.device,
            use_margin=cfg.use_margin,
        )

    def finish(self, out: Path, result: dict[str, float]) -> None:
        """glassrl.json: what was trained, on what, and the final held-out accuracy."""
        cfg = self.cfg
        summary = {
            "kind": "reward-model",
            "head": cfg.head,
            "base_model": str(self.path),
            "data": cfg.data,
            "eval_data": _eval_spec(cfg),
            "use_margin": cfg.use_margin,
            "steps": cfg.steps,
            "held_out_accuracy": result["eval/accuracy"],
            "held_out_pairs": len(self.evals),
            "accuracy_rule": "r_chosen > r_rejected; ties count as wrong",
            "time_s": round(result["time_s"], 1),
        }
        write_text(out / "glassrl.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")

    def summary(self, result: dict[str, float]) -> str:
        parts = [f"train/loss {result['train/loss']:.4f}"] if "train/loss" in result else []
        if "eval/accuracy" in result:
            parts.append(f"held-out accuracy {result['eval/accuracy']:.3f} on {len(self.evals)} pairs")
        return ", ".join(parts)


def _check_margins(sets: dict[str, list[PreferencePair]]) -> None:
    """use_margin needs a margin on every pair (the preset rm sets it for the bundled set's
    margins): the first pair without one, and the way on, in one line."""
    for key, pairs in sets.items():
        bare = next((pair for pair in pairs if pair.margin is None), None)
        if bare is not None:
            raise GlassrlError(
                f"use_margin=true, but some pairs of {key} have no margin (first: {bare.source}); "
                'give every pair a "margin" number, or set use_margin=false (the plain Bradley–Terry loss)'
            )


def _eval_spec(cfg: RMConfig) -> str:
    """eval_data, or the test split of a task:NAME data (RMConfig.validate checked one exists)."""
    return cfg.eval_data if cfg.eval_data is not None else str(held_out_split(cfg.data))
