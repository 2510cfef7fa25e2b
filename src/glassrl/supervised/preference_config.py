"""What ``glassrl dpo CONFIG`` reads (glassrl.supervised.preference trains it): the loss and its knobs,
the data and how it is fitted (TRL's truncation, glassrl.supervised.preference_data), the batches, and
the rows of the resolved table. Checked by :meth:`PreferenceConfig.validate`, each error one line
naming the key."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from glassrl import config_paths
from glassrl.algos.losses import (
    PAIR_LOSSES,
    PREFERENCE_LOSSES,
    PreferenceLossParams,
)
from glassrl.config import at_least, check_threads, fail, knob_set, option
from glassrl.data.tasks import held_out_split
from glassrl.errors import GlassrlError
from glassrl.models.lora import LoraConfig
from glassrl.optim import OptimConfig
from glassrl.supervised.foreign_names import PREFERENCE_NAMES
from glassrl.supervised.preference_data import Rule, check_rule
from glassrl.supervised.rendering import rendering_row

# Config keys a resumed run may change (dotted prefixes): how long it runs, where it lives, what it logs.
RESUME_MAY_CHANGE = (
    "steps",
    "output_dir",
    "log_every",
    "eval_every",
    "checkpoint_every",
    "keep_checkpoints",
    "threads",
)
# the PreferenceLossParams fields a config sets (BCO's δ is the trainer's state, not a knob)
LOSS_KNOBS = tuple(
    f for f in PreferenceLossParams.__dataclass_fields__ if all(f not in e.state for e in PREFERENCE_LOSSES.values())
)
# β when the config leaves it null: SimPO's paper trains with β = 2.0–2.5 (Meng et al. 2024, §4 and
# Table 7); every other loss, TRL's default 0.1 (DPO's usual value, Rafailov et al. 2023 §6).
DEFAULT_BETA = {"simpo": 2.0}


@dataclass
class PreferenceConfig:
    """What ``glassrl dpo CONFIG`` reads (examples/dpo.yaml, examples/kto.yaml). Checked by :meth:`validate`."""

    model: str = option(
        "default", help="the policy to train (usually an SFT model): checkpoint dir, cached hub id or \"default\""
    )
    reference: str | None = option(
        None, help="π_ref: checkpoint dir or cached hub id; null = the policy before its first step"
    )
    loss: str = option(
        "dpo", help="dpo | ipo | simpo | cpo | orpo | bco | kto (glassrl.algos.losses.preference; docs/algorithms/)"
    )
    beta: float | None = option(
        None,
        help="β: pull to π_ref (DPO, IPO's τ, KTO, BCO); SimPO/CPO's reward scale; ORPO's λ; null = 0.1, SimPO 2.0",
    )
    label_smoothing: float = option(
        0.0, help="dpo, cpo: ε, the assumed rate of flipped labels (conservative DPO); 0 = DPO"
    )
    rpo_alpha: float = option(0.0, help="dpo: α of RPO's NLL term on the chosen response (Pang et al. 2024); 0 = DPO")
    simpo_gamma: float = option(0.5, help="simpo: γ, the target reward margin")
    cpo_alpha: float = option(1.0, help="cpo: weight of CPO's NLL term on the chosen response (Xu et al. 2024: 1)")
    kto_desirable_weight: float = option(1.0, help="kto: λ_D, the weight of desirable examples")
    kto_undesirable_weight: float = option(1.0, help="kto: λ_U, the weight of undesirable examples")
    data: str = option(
        "task:arith-verify-preferences",
        help="\"task:NAME[/SPLIT]\" or a JSONL of pairs (kto: or of prompt/completion/label)",
    )
    eval_data: str | None = option(
        None, help="held-out pairs: the same forms; null = the test split of a task:NAME data"
    )
    seed: int = option(0, help="seeds python, numpy, torch and the data order")
    steps: int = option(200, help="optimiser steps, each on batch_size pairs (kto: labelled responses)")
    epochs: float | None = option(
        None, help="passes over the training data, setting the steps (as sft's); null = steps"
    )
    batch_size: int = option(32, help="pairs (kto: labelled responses) per optimiser step")
    micro_batch_size: int | None = option(
        None, help="pairs per forward/backward pass (gradient accumulation); null = batch_size"
    )
    max_length: int = option(64, help="longest prompt+response in tokens; a longer example is cut (truncation_mode)")
    max_prompt_length: int | None = option(
        None, help="a longer prompt keeps its last tokens (TRL's); null = not cut on its own"
    )
    max_completion_length: int | None = option(
        None, help="a longer response keeps its first tokens (TRL's); null = not cut on its own"
    )
    truncation_mode: Literal["keep_start", "keep_end"] = option(
        "keep_start", help="past max_length: keep_start cuts the responses' ends, keep_end the prompt's start"
    )
    chat_template: Literal["auto", "none"] = option(
        "auto", help="auto: text prompts use the tokenizer's template, as in glassrl train and sft (docs/data.md)"
    )
    system_prompt: str | None = option(None, help="system message put first in every prompt the chat template renders")
    optim: OptimConfig = option(
        factory=lambda: OptimConfig(lr=1e-4, warmup_steps=10, decay="cosine"),
        help="optimiser and schedule (shared with glassrl train)",
    )
    lora: LoraConfig | None = option(
        None, help="LoRA adapters on the policy (only they train); null = every weight trains"
    )
    compute_dtype: Literal["auto", "float32", "bfloat16"] = option(
        "auto", help="matrix products: auto (bfloat16 on CUDA over float32 weights, else float32) | float32 | bfloat16"
    )
    output_dir: str = option(
        "runs/dpo", help="policy, tokenizer, <loss>_config.yaml, metrics.jsonl, glassrl.json, checkpoints/"
    )
    eval_every: int = option(0, help="steps between held-out evaluations; 0 = only at the end")
    log_every: int = option(10, help="steps between metric rows")
    checkpoint_every: int = option(
        0, help="steps between checkpoints (--resume continues from the latest); 0 = at the end only"
    )
    keep_checkpoints: int = option(2, help="newest checkpoints kept")
    device: str = option("auto", help="auto (CUDA when visible) | cpu | cuda | cuda:N")
    threads: int | Literal["auto"] = option(
        "auto", help="intra-op CPU threads: N, or auto = the cores free now (glassrl.models.threads)"
    )
    on_nonfinite: Literal["stop", "skip"] = option(
        "stop", help="NaN/inf loss or grad norm: stop (exit 2, no output) or skip it"
    )

    title = "glassrl dpo: resolved"
    FOREIGN_NAMES = (
        PREFERENCE_NAMES  # TRL's names -> the hint of an unknown-key error (glassrl.supervised.foreign_names)
    )

    def anchor_paths(self, config_dir: Path, command_line: Set[str] = frozenset(), saved: bool = False) -> None:
        """data and eval_data named in a config file are read from its directory (glassrl.config_paths)."""
        config_paths.anchor_data(self, ("data", "eval_data"), config_dir, command_line, saved)

    def validate(self, written: Set[str] | None = None) -> None:
        """Ranges, the loss and its knobs, the held-out set; GlassrlError naming the key (see glassrl.config)."""
        at_least(1, {"steps": self.steps, "batch_size": self.batch_size, "max_length": self.max_length})
        at_least(1, {"micro_batch_size": self.micro_batch_size})
        if self.epochs is not None and not self.epochs > 0:
            fail("epochs", self.epochs, "must be > 0 (or null: steps sets the length)")
        if self.epochs is not None and knob_set(self, "steps", written):
            fail("steps", self.steps, f"ignored: epochs = {self.epochs} sets the steps; remove one")
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            fail(
                "micro_batch_size",
                self.micro_batch_size,
                f"does not divide batch_size = {self.batch_size}; pick a divisor of {self.batch_size}",
            )
        check_rule(self.rule())
        at_least(1, {"log_every": self.log_every, "keep_checkpoints": self.keep_checkpoints})
        at_least(0, {"eval_every": self.eval_every, "checkpoint_every": self.checkpoint_every})
        if self.loss not in PREFERENCE_LOSSES:
            fail("loss", self.loss, f"unknown; valid: {', '.join(PREFERENCE_LOSSES)}")
        entry = PREFERENCE_LOSSES[self.loss]
        for knob in LOSS_KNOBS:
            if knob not in entry.knobs and knob_set(self, knob, written):
                fail(knob, getattr(self, knob), f"ignored by loss {self.loss} (it reads {', '.join(entry.knobs)})")
        if not entry.reference and self.reference is not None:
            fail("reference", self.reference, f"ignored: {self.loss} is reference-free; remove it")
        try:
            self.params()
        except ValueError as err:  # algos' rule: "PreferenceLossParams.beta = 0: must be > 0" -> the config key
            raise GlassrlError(str(err).removeprefix("PreferenceLossParams.")) from None
        if self.eval_data is None and held_out_split(self.data) is None:
            fail("eval_data", None, f"needed when data is a file ({self.data}); give a JSONL file of held-out pairs")
        check_threads(self.threads)
        self.optim.check("optim")

    def params(self) -> PreferenceLossParams:
        return PreferenceLossParams(**{knob: getattr(self, knob) for knob in LOSS_KNOBS} | {"beta": self.beta_value()})

    def beta_value(self) -> float:
        """β: the config's, or the loss's default when null (DEFAULT_BETA)."""
        return self.beta if self.beta is not None else DEFAULT_BETA.get(self.loss, 0.1)

    def rule(self) -> Rule:
        """How an example longer than max_length is cut (glassrl.supervised.preference_data)."""
        return Rule(self.max_length, self.max_prompt_length, self.max_completion_length, self.truncation_mode)

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, value, unit) rows of the table printed at start (print_resolved)."""
        entry = PREFERENCE_LOSSES[self.loss]
        unit = "pairs" if self.loss in PAIR_LOSSES else "labelled responses"
        params = self.params()
        knobs = ", ".join(f"{k} = {getattr(params, k):g}" for k in entry.knobs)
        if self.beta is None:
            knobs += f" (β: {self.loss}'s default)"
        elif self.loss in DEFAULT_BETA and self.beta < DEFAULT_BETA[self.loss] / 4:
            knobs += f" (below {self.loss}'s paper: β = {DEFAULT_BETA[self.loss]:g} when left null)"
        batch = f"{unit}, per optimiser step"
        if self.micro_batch_size is not None:
            batch += f", in passes of {self.micro_batch_size}"
        return [
            ("loss", self.loss, f"{knobs}; rewards aggregated by {entry.reduction}"),
            ("reference", (self.reference or "the initial policy") if entry.reference else "none", "π_ref, frozen"),
            (
                "training steps",
                f"{self.steps}" if self.epochs is None else f"{self.epochs:g} epochs",
                "optimiser steps",
            ),
            ("batch", f"{self.batch_size}", batch),
            ("max length", f"{self.max_length}", f"tokens, prompt + response; longer: {self.truncation_mode}"),
            rendering_row(self.chat_template),
            ("lora", "off" if self.lora is None else f"r = {self.lora.r}, alpha = {self.lora.alpha:g}", "adapters"),
            ("data", self.data, unit),
            ("eval data", eval_spec(self), "held-out pairs"),
            *self.optim.rows(),
        ]


def eval_spec(cfg: PreferenceConfig) -> str:
    """eval_data, or the test split of a task:NAME data (validate checked one exists)."""
    return cfg.eval_data if cfg.eval_data is not None else str(held_out_split(cfg.data))
