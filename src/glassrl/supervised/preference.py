"""Offline preference optimisation: the DPO family on preference pairs and KTO on labelled
responses, trained on the supervised loop (``glassrl dpo CONFIG``).

    cfg = load_config(PreferenceConfig, "examples/dpo.yaml", ["steps=50"])
    metrics = train_preference(cfg)

The losses are glassrl.algos.losses.preference (DPO, conservative DPO, IPO, SimPO, KTO: ``loss``);
each response's tokens get an implicit reward ρ_i = β·(log π_θ − log π_ref) (β·log π_θ for SimPO),
aggregated per response by the loss's reduction, and the loss is the mean over the batch of the
per-pair (per-example) loss. Data (glassrl.data.preferences): the reward model's pair formats
(``task:arith-verify-preferences``, JSONL of prompt/chosen/rejected, text or chat messages); KTO
reads them unpaired (chosen desirable, rejected undesirable) or JSONL prompt/completion/label rows.

Sequences are laid out as the policy produces them, ``format_prompt(x)`` ⊕ y ⊕ EOS (the layout
of glassrl.data.collate); a pair's chosen and rejected go through the model in one forward pass.

- **π_ref**: ``reference`` names a checkpoint, or null for the policy before its first step (with
  LoRA: the base, the adapters being zero then). Its log-probs are computed once, before the first
  step, and cached with the run (glassrl.supervised.reference): no second model in memory during
  training. SimPO reads no reference and computes none.
- **KTO's reference point** z₀ (Ethayarajh et al. 2024): each example's prompt is paired with the
  response of another example (a fixed, seeded derangement of the data: TRL pairs within a batch by
  a shift of one), and z₀ = max(0, mean Σ_i log π_θ/π_ref) over the batch's mismatched pairs, with
  no gradient.
- **LoRA** (``lora``): adapters on the policy (glassrl.models.lora); the output directory is then
  a peft adapter directory (``glassrl export`` merges it).
- **precision** (``compute_dtype``): forward passes under bfloat16 autocast over float32 master
  weights (glassrl.models.precision); ``auto`` is bfloat16 on CUDA, float32 on CPU.
- **resume** (``glassrl dpo CONFIG --resume``): checkpoints every ``checkpoint_every`` steps and at
  the last (glassrl.supervised.checkpoints); a resumed run ends as one that never stopped.

Metrics (docs/metrics.md), named as TRL's DPOTrainer and KTOTrainer name them where they mean the
same, under ``train/`` (means over the steps since the last row) and ``eval/`` (the held-out
pairs): ``loss``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``,
``rewards/accuracies`` (the fraction of pairs with r_chosen > r_rejected strictly: a tie, as
at π = π_ref, counts as wrong), ``logps/chosen``, ``logps/rejected``; KTO adds ``kl`` (z₀). The
held-out set is always pairs (for KTO too: its accuracy compares a pair's two responses).

Writes to ``output_dir``: the policy and tokenizer (``save_pretrained``), ``<loss>_config.yaml``,
``metrics.jsonl``, ``glassrl.json`` (what was trained, on what, the held-out accuracy),
``ledgers/preference.jsonl`` (the preference ledgers of the first held-out pairs: per token
log π_θ, log π_ref and ρ_i; glassrl.ledger.preference), ``reference_logprobs.safetensors`` and
``checkpoints/``.
"""

from __future__ import annotations

import json
from collections.abc import Set
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from rich.console import Console

from glassrl import config_paths
from glassrl.algos.losses import (
    PAIR_LOSSES,
    PREFERENCE_LOSSES,
    UNPAIRED_LOSSES,
    PreferenceLossParams,
    Side,
    kto_reference_point,
    pair_loss,
    side_rewards,
)
from glassrl.config import at_least, check_threads, fail, knob_set
from glassrl.data.collate import collate, encode_response
from glassrl.data.formatting import format_prompt, prompt_text
from glassrl.data.preferences import load_labelled, load_preferences
from glassrl.data.records import PreferencePair
from glassrl.data.tasks import held_out_split
from glassrl.errors import GlassrlError
from glassrl.ledger.implicit_rewards import SideNumbers, pair_ledger
from glassrl.ledger.preference import PreferenceLedger
from glassrl.models import load_causal_lm, load_tokenizer, pad_id, resolve_device, response_logprobs
from glassrl.models.lora import LoraConfig, apply_lora
from glassrl.models.memory import check_training_fits
from glassrl.models.precision import compute_dtype, compute_precision
from glassrl.optim import OptimConfig
from glassrl.report.html import write_run_report
from glassrl.run.atomic import write_text
from glassrl.supervised.checkpoints import Checkpointing
from glassrl.supervised.loop import LOWER, Tally, check_positions, model_dir, train_supervised
from glassrl.supervised.reference import ReferenceLogprobs, cached_reference, sequence_logprobs
from glassrl.supervised.rm import encode_pairs

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
LEDGER_FILE = "preference.jsonl"  # ledgers/ of the run: the preference ledgers of the first held-out pairs
LEDGER_PAIRS = 4
LOSS_KNOBS = tuple(f.name for f in PreferenceLossParams.__dataclass_fields__.values())


@dataclass
class PreferenceConfig:
    """What ``glassrl dpo CONFIG`` reads (examples/dpo.yaml, examples/kto.yaml). Checked by :meth:`validate`."""

    model: str = "default"  # the policy to train (usually an SFT model): checkpoint dir, cached hub id or "default"
    reference: str | None = None  # π_ref: checkpoint dir or cached hub id; null = the policy before its first step
    loss: str = "dpo"  # dpo | ipo | simpo | kto (glassrl.algos.losses.preference; docs/algorithms/)
    beta: float = 0.1  # β: strength of the pull to π_ref (DPO, IPO's τ, KTO); SimPO's reward scale (2.0–2.5)
    label_smoothing: float = 0.0  # dpo: ε, the assumed rate of flipped labels (conservative DPO); 0 = DPO
    simpo_gamma: float = 0.5  # simpo: γ, the target reward margin
    kto_desirable_weight: float = 1.0  # kto: λ_D, the weight of desirable examples
    kto_undesirable_weight: float = 1.0  # kto: λ_U, the weight of undesirable examples
    data: str = (
        "task:arith-verify-preferences"  # "task:NAME[/SPLIT]" or a JSONL of pairs (kto: or of prompt/completion/label)
    )
    eval_data: str | None = None  # held-out pairs: the same forms; null = the test split of a task:NAME data
    seed: int = 0  # seeds python, numpy, torch and the data order
    steps: int = 200  # optimiser steps, each on batch_size pairs (kto: labelled responses)
    batch_size: int = 32  # pairs (kto: labelled responses) per optimiser step
    max_length: int = 64  # longest prompt+response in tokens; a longer one is an error naming it
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=10, decay="cosine")
    )  # optimiser and schedule (shared with glassrl train)
    lora: LoraConfig | None = None  # LoRA adapters on the policy (only they train); null = every weight trains
    compute_dtype: Literal["auto", "float32", "bfloat16"] = (
        "auto"  # matrix products: auto (bfloat16 on CUDA over float32 weights, else float32) | float32 | bfloat16
    )
    output_dir: str = "runs/dpo"  # policy, tokenizer, <loss>_config.yaml, metrics.jsonl, glassrl.json, checkpoints/
    eval_every: int = 0  # steps between held-out evaluations; 0 = only at the end
    log_every: int = 10  # steps between metric rows
    checkpoint_every: int = 0  # steps between checkpoints (--resume continues from the latest); 0 = at the end only
    keep_checkpoints: int = 2  # newest checkpoints kept
    device: str = "auto"  # auto (CUDA when visible) | cpu | cuda | cuda:N
    threads: int | Literal["auto"] = (
        "auto"  # intra-op CPU threads: N, or auto = the cores free now (glassrl.models.threads)
    )
    on_nonfinite: Literal["stop", "skip"] = "stop"  # NaN/inf loss or grad norm: stop (exit 2, no output) or skip it

    title = "glassrl dpo: resolved"

    def anchor_paths(self, config_dir: Path, command_line: Set[str] = frozenset(), saved: bool = False) -> None:
        """data and eval_data named in a config file are read from its directory (glassrl.config_paths)."""
        config_paths.anchor_data(self, ("data", "eval_data"), config_dir, command_line, saved)

    def validate(self, written: Set[str] | None = None) -> None:
        """Ranges, the loss and its knobs, the held-out set; GlassrlError naming the key (see glassrl.config)."""
        at_least(1, {"steps": self.steps, "batch_size": self.batch_size, "max_length": self.max_length})
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
        return PreferenceLossParams(**{knob: getattr(self, knob) for knob in LOSS_KNOBS})

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, value, unit) rows of the table printed at start (print_resolved)."""
        entry = PREFERENCE_LOSSES[self.loss]
        unit = "pairs" if self.loss in PAIR_LOSSES else "labelled responses"
        knobs = ", ".join(f"{k} = {getattr(self, k):g}" for k in entry.knobs)
        return [
            ("loss", self.loss, f"{knobs}; rewards aggregated by {entry.reduction}"),
            ("reference", (self.reference or "the initial policy") if entry.reference else "none", "π_ref, frozen"),
            ("training steps", f"{self.steps}", "optimiser steps"),
            ("batch", f"{self.batch_size}", f"{unit}, per optimiser step"),
            ("max length", f"{self.max_length}", "tokens, prompt + response"),
            ("lora", "off" if self.lora is None else f"r = {self.lora.r}, alpha = {self.lora.alpha:g}", "adapters"),
            ("data", self.data, unit),
            ("eval data", _eval_spec(self), "held-out pairs"),
            *self.optim.rows(),
        ]


def train_preference(cfg: PreferenceConfig, console: Console | None = None, resume: bool = False) -> dict[str, float]:
    """Train the policy as ``cfg`` says; returns the final metrics (train/…, eval/…, steps, sizes, time_s).
    ``eval/rewards/accuracies`` is the held-out preference accuracy."""
    cfg = replace(cfg, compute_dtype=_compute(cfg, resolve_device(cfg.device)))  # recorded as it ran
    run = Checkpointing(
        Path(cfg.output_dir),
        every=cfg.checkpoint_every,
        keep=cfg.keep_checkpoints,
        resume=resume,
        may_change=RESUME_MAY_CHANGE,
    )
    return train_supervised(cfg, lambda device: PreferenceObjective.build(cfg, device, resume, console), console, run)


# (prompt_ids, chosen_ids, rejected_ids, margin) as glassrl.supervised.rm encodes pairs
Pair = tuple[list[int], list[int], list[int], float | None]


@dataclass
class Labelled:
    """A KTO example: its prompt and response ids, its label, and the response its KL pair borrows."""

    prompt: list[int]
    response: list[int]
    desirable: bool
    partner: list[int]


@dataclass
class PreferenceObjective:
    """The preference trainers' pieces of the supervised loop (glassrl.supervised.loop)."""

    cfg: PreferenceConfig
    path: Path  # the policy trained from
    model: Any
    tokenizer: Any
    train: list  # (index, Pair) or (index, Labelled): the index finds the cached reference log-probs
    evals: list[Pair]
    eval_pairs: list[PreferencePair]  # the held-out pairs as read (texts, for the ledger)
    reference: ReferenceLogprobs | None  # None: reference-free (SimPO)
    device: torch.device

    @property
    def name(self) -> str:
        return self.cfg.loss

    @property
    def train_keys(self) -> tuple[str, ...]:
        common = ("train/loss", "train/rewards/chosen", "train/rewards/rejected", "train/rewards/margins")
        if self.cfg.loss in UNPAIRED_LOSSES:
            return (*common, "train/kl", "train/logps/chosen", "train/logps/rejected")
        return (*common, "train/rewards/accuracies", "train/logps/chosen", "train/logps/rejected")

    @property
    def steps(self) -> int:
        return self.cfg.steps

    @property
    def sizes(self) -> dict[str, float]:
        unit = "pairs" if self.cfg.loss in PAIR_LOSSES else "examples"
        return {unit: len(self.train), "eval_pairs": len(self.evals)}

    @classmethod
    def build(
        cls, cfg: PreferenceConfig, device: torch.device, resume: bool = False, console: Console | None = None
    ) -> PreferenceObjective:
        """Load the policy (with adapters), encode the data, and compute or read π_ref's log-probs."""
        path = model_dir(cfg.model)
        sequences = cfg.batch_size * (1 if cfg.loss == "kto" else 2)  # a pair: chosen and rejected
        what = f"batch_size = {cfg.batch_size} × max_length = {cfg.max_length}:"
        check_training_fits(path, sequences, cfg.max_length, device, what, LOWER, vocabulary=True)
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, dtype="float32", device=str(device))
        check_positions(model, cfg.max_length, str(path))
        if cfg.lora is not None:
            model = apply_lora(model, cfg.lora.settings(), path)
        model.train()
        eval_pairs = load_preferences(_eval_spec(cfg))
        evals = encode_pairs(tokenizer, eval_pairs, cfg.max_length)
        if cfg.loss in PAIR_LOSSES:
            train: list = list(enumerate(encode_pairs(tokenizer, load_preferences(cfg.data), cfg.max_length)))
        else:
            train = list(enumerate(_encode_labelled(tokenizer, cfg, load_labelled(cfg.data))))
        obj = cls(cfg, path, model, tokenizer, train, evals, eval_pairs, None, device)
        if PREFERENCE_LOSSES[cfg.loss].reference:
            obj.reference, line = obj._reference(resume)
            (console or Console()).print(line, markup=False, soft_wrap=True)
        return obj

    def _reference(self, resume: bool) -> tuple[ReferenceLogprobs, str]:
        """π_ref's log-probs of every response the run reads (glassrl.supervised.reference)."""
        cfg = self.cfg
        groups: dict[str, list[tuple[list[int], list[int]]]] = {
            "eval/chosen": [(p, c) for p, c, _, _ in self.evals],
            "eval/rejected": [(p, r) for p, _, r, _ in self.evals],
        }
        if cfg.loss in PAIR_LOSSES:
            groups["train/chosen"] = [(p, c) for _, (p, c, _, _) in self.train]
            groups["train/rejected"] = [(p, r) for _, (p, _, r, _) in self.train]
        else:
            groups["train/response"] = [(e.prompt, e.response) for _, e in self.train]
            groups["train/kl"] = [(e.prompt, e.partner) for _, e in self.train]
        dtype = compute_dtype(_compute(cfg, self.device))
        identity = {"reference": str(model_dir(cfg.reference) if cfg.reference else self.path), "compute": str(dtype)}
        reference = self.model
        if cfg.reference is not None:
            reference = load_causal_lm(model_dir(cfg.reference), dtype="float32", device=str(self.device))

        def compute(sequences):
            return sequence_logprobs(
                reference, sequences, batch_size=2 * cfg.batch_size, pad_id=pad_id(self.tokenizer), dtype=dtype
            )

        return cached_reference(Path(cfg.output_dir), groups, identity, compute, resume)

    # ---------------------------------------------------------------- the loop's calls

    def loss(self, examples: list) -> tuple[torch.Tensor, Tally]:
        indices = [i for i, _ in examples]
        if self.cfg.loss in UNPAIRED_LOSSES:
            return self._kto_loss(indices, [e for _, e in examples])
        loss, r_c, r_r, logps = self._pairs([e for _, e in examples], indices, "train", grad=True)
        sums = {
            "train/loss": loss.item(),
            **_pair_metrics("train", r_c.sequence, r_r.sequence, logps),
        }
        return loss, Tally(1, sums)

    def _pairs(self, pairs: list[Pair], indices: list[int], group: str, grad: bool):
        """(mean loss, chosen's Rewards, rejected's Rewards, (Σ log π chosen, Σ log π rejected) (B,) each)
        of ``pairs``, chosen and rejected in one forward pass."""
        chosen, rejected = self._sides(
            [(p, c) for p, c, _, _ in pairs] + [(p, r) for p, _, r, _ in pairs], indices, group, grad
        )
        loss, r_c, r_r = pair_loss(self.cfg.loss, chosen, rejected, self.cfg.params())
        logps = tuple(torch.where(s.mask, s.logprobs.detach(), 0.0).sum(-1) for s in (chosen, rejected))
        return loss.mean(), r_c, r_r, logps

    def _sides(self, sequences, indices: list[int], group: str, grad: bool) -> tuple[Side, Side]:
        """The first and second half of ``sequences`` as two Sides, from one forward pass; π_ref
        from the cache: groups ``<group>/chosen``, ``<group>/rejected`` (or ``train/response``, ``train/kl``)."""
        logprobs, mask = self._logprobs(sequences, grad)
        B, T = len(indices), mask.shape[1]
        names = ("train/response", "train/kl") if group == "kto" else (f"{group}/chosen", f"{group}/rejected")
        refs = [None, None]
        if self.reference is not None:
            refs = [self.reference.batch(name, indices, T, self.device) for name in names]
        return Side(logprobs[:B], refs[0], mask[:B]), Side(logprobs[B:], refs[1], mask[B:])

    def _logprobs(self, sequences, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """log π_θ (N, T) of the sequences' response tokens and their mask (N, T), under the run's precision."""
        batch = {k: v.to(self.device) for k, v in collate(sequences, pad_id(self.tokenizer)).items()}
        mask = batch["response_mask"]
        with (
            torch.set_grad_enabled(grad),
            compute_precision(self.device, compute_dtype(_compute(self.cfg, self.device))),
        ):
            logprobs, _ = response_logprobs(self.model, batch["input_ids"], batch["attention_mask"], mask.shape[1])
        return logprobs.float(), mask

    def _kto_loss(self, indices: list[int], examples: list[Labelled]) -> tuple[torch.Tensor, Tally]:
        """KTO on a batch of labelled responses: z₀ from their mismatched pairs (no gradient), then the loss."""
        params, entry = self.cfg.params(), UNPAIRED_LOSSES[self.cfg.loss]
        responses, kl_pairs = self._sides(
            [(e.prompt, e.response) for e in examples] + [(e.prompt, e.partner) for e in examples],
            indices,
            "kto",
            grad=True,
        )
        z0 = kto_reference_point(kl_pairs.logprobs, kl_pairs.ref_logprobs, kl_pairs.mask)
        rewards = side_rewards(responses, entry, params.beta).sequence  # (B,)
        desirable = torch.tensor([e.desirable for e in examples], device=self.device)
        loss = entry.fn(rewards, desirable, z0, params).mean()
        logps = torch.where(responses.mask, responses.logprobs.detach(), 0.0).sum(-1)  # (B,)
        n_good, n_bad = int(desirable.sum()), int((~desirable).sum())
        r, lp = rewards.detach(), logps
        sums = {
            "train/loss": loss.item(),
            "train/rewards/chosen": r[desirable].sum().item(),
            "train/rewards/rejected": r[~desirable].sum().item(),
            "train/kl": z0.item(),
            "train/logps/chosen": lp[desirable].sum().item(),
            "train/logps/rejected": lp[~desirable].sum().item(),
        }
        good = r[desirable].mean().item() if n_good else 0.0
        bad = r[~desirable].mean().item() if n_bad else 0.0
        sums["train/rewards/margins"] = good - bad if n_good and n_bad else 0.0
        weights = {
            "train/rewards/chosen": n_good,
            "train/logps/chosen": n_good,
            "train/rewards/rejected": n_bad,
            "train/logps/rejected": n_bad,
            "train/rewards/margins": float(n_good > 0 and n_bad > 0),
        }
        return loss, Tally(1, sums, weights)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The held-out pairs' metrics: the implicit rewards of the run's loss (for KTO: its
        token-sum β·log π/π_ref), their accuracy and margin, the log-probs, and (pair losses) the loss."""
        was_training = self.model.training
        self.model.eval()
        params = self.cfg.params()
        entry = PREFERENCE_LOSSES[self.cfg.loss]
        chosen, rejected, logps_c, logps_r, losses = [], [], [], [], []
        for start in range(0, len(self.evals), self.cfg.batch_size):
            indices = list(range(start, min(start + self.cfg.batch_size, len(self.evals))))
            pairs = [self.evals[i] for i in indices]
            c, r = self._sides(
                [(p, y) for p, y, _, _ in pairs] + [(p, y) for p, _, y, _ in pairs], indices, "eval", grad=False
            )
            r_c, r_r = side_rewards(c, entry, params.beta).sequence, side_rewards(r, entry, params.beta).sequence
            if self.cfg.loss in PAIR_LOSSES:
                losses.append(entry.fn(r_c, r_r, params))
            chosen.append(r_c)
            rejected.append(r_r)
            logps_c.append(torch.where(c.mask, c.logprobs, 0.0).sum(-1))
            logps_r.append(torch.where(r.mask, r.logprobs, 0.0).sum(-1))
        self.model.train(was_training)
        r_c, r_r = torch.cat(chosen), torch.cat(rejected)  # (N,)
        metrics = _pair_metrics("eval", r_c, r_r, (torch.cat(logps_c), torch.cat(logps_r)))
        if losses:
            metrics = {"eval/loss": torch.cat(losses).mean().item(), **metrics}
        return metrics

    @torch.no_grad()
    def ledgers(self, indices: list[int]) -> list[PreferenceLedger]:
        """The preference ledgers of held-out pairs ``indices`` under the policy as it is now: per
        token log π_θ, log π_ref (the cache) and ρ_i, with the loss's sums (glassrl.ledger.preference)."""
        was_training = self.model.training
        self.model.eval()
        pairs = [self.evals[i] for i in indices]
        sides = self._sides(
            [(p, y) for p, y, _, _ in pairs] + [(p, y) for p, _, y, _ in pairs], indices, "eval", grad=False
        )
        self.model.train(was_training)
        out = []
        for b, index in enumerate(indices):
            raw, (_, *responses, _) = self.eval_pairs[index], pairs[b]
            numbers = []
            for side, ids, text in zip(sides, responses, (raw.chosen, raw.rejected)):
                ref = None if side.ref_logprobs is None else side.ref_logprobs[b, : len(ids)]
                tokens = [self.tokenizer.decode([t]) for t in ids]
                numbers.append(SideNumbers(text, ids, tokens, side.logprobs[b, : len(ids)], ref))
            prompt = prompt_text(self.tokenizer, raw.prompt)
            out.append(pair_ledger(prompt, *numbers, loss=self.cfg.loss, params=self.cfg.params(), source=raw.source))
        return out

    def finish(self, out: Path, result: dict[str, float]) -> None:
        """glassrl.json, the preference ledgers of the first held-out pairs (``ledgers/preference.jsonl``)
        and report.html (learning curves and those ledgers: glassrl.report.html)."""
        ledgers = self.ledgers(list(range(min(LEDGER_PAIRS, len(self.evals)))))
        lines = "".join(json.dumps(ledger.to_dict(), ensure_ascii=False) + "\n" for ledger in ledgers)
        (out / "ledgers").mkdir(exist_ok=True)
        write_text(out / "ledgers" / LEDGER_FILE, lines)
        self._write_summary(out, result)
        write_run_report([out], out / "report.html", name=Path(self.cfg.output_dir).name)  # curves, ledgers

    def _write_summary(self, out: Path, result: dict[str, float]) -> None:
        """glassrl.json: what was trained, on what, and the held-out preference accuracy."""
        cfg = self.cfg
        summary = {
            "kind": "preference",
            "loss": cfg.loss,
            "params": {k: getattr(cfg, k) for k in PREFERENCE_LOSSES[cfg.loss].knobs},
            "base_model": str(self.path),
            "reference": (cfg.reference or str(self.path)) if PREFERENCE_LOSSES[cfg.loss].reference else None,
            "lora": None if cfg.lora is None else asdict(cfg.lora),
            "data": cfg.data,
            "eval_data": _eval_spec(cfg),
            "steps": cfg.steps,
            "held_out_accuracy": result.get("eval/rewards/accuracies"),
            "held_out_pairs": len(self.evals),
            "accuracy_rule": "r_chosen > r_rejected (implicit rewards); ties count as wrong",
            "time_s": round(result["time_s"], 1),
        }
        write_text(out / "glassrl.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")

    def summary(self, result: dict[str, float]) -> str:
        parts = [f"train/loss {result['train/loss']:.4f}"] if "train/loss" in result else []
        if "eval/rewards/accuracies" in result:
            parts.append(
                f"held-out preference accuracy {result['eval/rewards/accuracies']:.3f} on {len(self.evals)} pairs"
            )
        return ", ".join(parts)


def _pair_metrics(
    prefix: str, r_c: torch.Tensor, r_r: torch.Tensor, logps: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, float]:
    """TRL's names (``rewards/chosen``, ...), means over the pairs, from the rewards and Σ log π (B,) of each side."""

    def reduce(x: torch.Tensor) -> float:  # a fraction counted in integers: 408 of 500 reads 0.816 exactly
        return x.sum().item() / x.numel() if x.dtype == torch.bool else x.float().mean().item()

    return {
        f"{prefix}/rewards/chosen": reduce(r_c),
        f"{prefix}/rewards/rejected": reduce(r_r),
        f"{prefix}/rewards/margins": reduce(r_c - r_r),
        f"{prefix}/rewards/accuracies": reduce(r_c > r_r),
        f"{prefix}/logps/chosen": reduce(logps[0]),
        f"{prefix}/logps/rejected": reduce(logps[1]),
    }


def _encode_labelled(tokenizer, cfg: PreferenceConfig, examples) -> list[Labelled]:
    """KTO's examples, each with the response of another as its KL pair's: a seeded derangement
    (a random cycle through the data), so that no example borrows its own response."""
    prompts = [format_prompt(tokenizer, e.prompt) for e in examples]
    responses = [encode_response(tokenizer, e.response) for e in examples]
    if len(examples) < 2:
        raise GlassrlError(f"data: {cfg.data} has {len(examples)} labelled response; KTO needs at least 2")
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    partner = {order[k]: order[(k + 1) % len(order)] for k in range(len(order))}
    encoded = []
    for i, example in enumerate(examples):
        longest = len(prompts[i]) + max(len(responses[i]), len(responses[partner[i]]))
        if longest > cfg.max_length:
            raise GlassrlError(
                f"{example.source}: prompt+response (or its KL pair's) is {longest} tokens, "
                f"more than max_length={cfg.max_length}"
            )
        encoded.append(Labelled(prompts[i], responses[i], example.desirable, responses[partner[i]]))
    return encoded


def _compute(cfg: PreferenceConfig, device: torch.device) -> str:
    """compute_dtype with "auto" made concrete: bfloat16 on CUDA, float32 elsewhere."""
    if cfg.compute_dtype != "auto":
        return cfg.compute_dtype
    return "bfloat16" if device.type == "cuda" else "float32"


def _eval_spec(cfg: PreferenceConfig) -> str:
    """eval_data, or the test split of a task:NAME data (validate checked one exists)."""
    return cfg.eval_data if cfg.eval_data is not None else str(held_out_split(cfg.data))
