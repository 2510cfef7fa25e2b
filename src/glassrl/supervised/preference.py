"""Offline preference optimisation: the DPO family on preference pairs (DPO, RPO, IPO, SimPO, CPO,
ORPO, BCO) and KTO on labelled responses, trained on the supervised loop (``glassrl dpo CONFIG``).

    cfg = load_config(PreferenceConfig, "examples/dpo.yaml", ["steps=50"])
    metrics = train_preference(cfg)

The losses are glassrl.algos.losses.preference (``loss``; RPO is dpo with ``rpo_alpha`` > 0);
each response's tokens get an implicit reward ρ_i = β·(log π_θ − log π_ref) (β·log π_θ for SimPO),
aggregated per response by the loss's reduction, and the loss is the mean over the batch of the
per-pair (per-example) loss. Data (glassrl.data.preferences): the reward model's pair formats
(``task:arith-verify-preferences``, JSONL of prompt/chosen/rejected, text or chat messages); KTO
reads them unpaired (chosen desirable, rejected undesirable) or JSONL prompt/completion/label rows.

Sequences are laid out as the policy produces them, ``format_prompt(x)`` ⊕ y ⊕ EOS (the layout
of glassrl.data.collate), a text prompt first rendered as ``glassrl train`` renders it
(``chat_template``, ``system_prompt``: glassrl.supervised.rendering); a pair's chosen and rejected go
through the model in one forward pass.

- **π_ref**: ``reference`` names a checkpoint, or null for the policy before its first step (with
  LoRA: the base, the adapters being zero then). Its log-probs are computed once, before the first
  step, and cached with the run (glassrl.supervised.reference): no second model in memory during
  training. SimPO reads no reference and computes none.
- **fitting** (glassrl.supervised.preference_data): an example past ``max_length`` is cut as TRL cuts
  it, and a line counts them. **batches**: ``batch_size`` per optimiser step, in passes of
  ``micro_batch_size`` (gradient accumulation); ``epochs`` sets the steps, as sft's.
- **BCO's δ**: :class:`RunningMean` of the batches' mean rewards (TRL's RunningMoments), checkpointed.
- **β** null is the loss's default (preference_config.DEFAULT_BETA): SimPO's paper's 2.0, else TRL's 0.1.
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
held-out set is pairs (for KTO too: its accuracy compares a pair's two responses), or, for KTO,
rows in its own form: then the metrics KTO trains with, on the held-out examples.

Writes to ``output_dir``: the policy and tokenizer (``save_pretrained``), ``<loss>_config.yaml``,
``metrics.jsonl``, ``glassrl.json`` (what was trained, on what, the held-out accuracy),
``ledgers/preference.jsonl`` (the preference ledgers of the first held-out pairs: per token
log π_θ, log π_ref and ρ_i; glassrl.ledger.preference), ``reference_logprobs.safetensors`` and
``checkpoints/``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

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
from glassrl.data.collate import collate
from glassrl.data.formatting import prompt_text
from glassrl.data.preferences import (
    degenerate_labelled,
    degenerate_pairs,
    labelled_rows,
    load_labelled,
    load_preferences,
)
from glassrl.data.records import PreferencePair
from glassrl.ledger.implicit_rewards import SideNumbers, pair_ledger
from glassrl.ledger.preference import PreferenceLedger
from glassrl.models import load_causal_lm, load_tokenizer, pad_id, resolve_device, response_logprobs
from glassrl.models.lora import apply_lora
from glassrl.models.memory import check_training_fits
from glassrl.models.precision import compute_dtype, compute_precision
from glassrl.report.html import write_run_report
from glassrl.run.atomic import write_text
from glassrl.supervised.checkpoints import Checkpointing, RunningMean
from glassrl.supervised.loop import (
    LOWER,
    Tally,
    check_positions,
    epoch_steps,
    model_dir,
    train_supervised,
    warn,
    window_means,
)
from glassrl.supervised.preference_config import RESUME_MAY_CHANGE, PreferenceConfig, eval_spec
from glassrl.supervised.preference_data import Labelled, cut_line, encode_labelled, fit_pairs
from glassrl.supervised.reference import ReferenceLogprobs, cached_reference, sequence_logprobs
from glassrl.supervised.rendering import render_records

LEDGER_FILE = "preference.jsonl"  # ledgers/ of the run: the preference ledgers of the first held-out pairs
LEDGER_PAIRS = 4


def train_preference(cfg: PreferenceConfig, console: Console | None = None, resume: bool = False) -> dict[str, float]:
    """Train the policy as ``cfg`` says; returns the final metrics (train/…, eval/…, steps, sizes, time_s).
    ``eval/rewards/accuracies`` is the held-out preference accuracy."""
    # recorded as it ran: the precision, and β (null: the loss's default)
    cfg = replace(cfg, compute_dtype=_compute(cfg, resolve_device(cfg.device)), beta=cfg.beta_value())
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
    running: RunningMean = field(default_factory=lambda: RunningMean())  # BCO's δ

    @property
    def state_parts(self) -> list[Any]:
        """Checkpoint parts beside the loop's: BCO's running mean."""
        return [self.running] if PREFERENCE_LOSSES[self.cfg.loss].state else []

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
        """cfg.steps, or epochs passes over the training examples when epochs is set."""
        if self.cfg.epochs is None:
            return self.cfg.steps
        return epoch_steps(self.cfg.epochs, len(self.train), self.cfg.batch_size)

    @property
    def sizes(self) -> dict[str, float]:
        unit = "pairs" if self.cfg.loss in PAIR_LOSSES else "examples"
        return {unit: len(self.train), ("eval_examples" if self.labelled_evals else "eval_pairs"): len(self.evals)}

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
        render = partial(render_records, tokenizer, mode=cfg.chat_template, system_prompt=cfg.system_prompt)
        if cfg.loss in UNPAIRED_LOSSES and labelled_rows(eval_spec(cfg)):  # KTO's own form: no pairs
            held_out = load_labelled(eval_spec(cfg))
            warn(degenerate_labelled(held_out, "eval_data"), console)
            evals, eval_cut = encode_labelled(
                tokenizer, render(held_out, key="eval_data"), cfg.rule(), cfg.seed, eval_spec(cfg)
            )
            eval_pairs: list = []
        else:
            eval_pairs = load_preferences(eval_spec(cfg))
            warn(degenerate_pairs(eval_pairs, "eval_data"), console)
            eval_pairs = render(eval_pairs, key="eval_data")
            evals, eval_cut = fit_pairs(tokenizer, eval_pairs, cfg.rule())
        if cfg.loss in PAIR_LOSSES:
            pairs = load_preferences(cfg.data)
            warn(degenerate_pairs(pairs, "data"), console)
            fitted, train_cut = fit_pairs(tokenizer, render(pairs, key="data"), cfg.rule())
            train: list = list(enumerate(fitted))
        else:
            labelled = load_labelled(cfg.data)
            warn(degenerate_labelled(labelled, "data"), console)
            rendered = render(labelled, key="data")
            encoded, train_cut = encode_labelled(tokenizer, rendered, cfg.rule(), cfg.seed, cfg.data)
            train = list(enumerate(encoded))
        what = "training pairs" if cfg.loss in PAIR_LOSSES else "training examples"
        held = "held-out pairs" if eval_pairs or cfg.loss in PAIR_LOSSES else "held-out examples"
        cut = cut_line(cfg.loss, {what: (train_cut, len(train)), held: (eval_cut, len(evals))}, cfg.rule())
        if cut is not None:
            (console or Console()).print(cut, markup=False, soft_wrap=True)
        obj = cls(cfg, path, model, tokenizer, train, evals, eval_pairs, None, device)
        if PREFERENCE_LOSSES[cfg.loss].reference:
            obj.reference, line = obj._reference(resume)
            (console or Console()).print(line, markup=False, soft_wrap=True)
        return obj

    def _reference(self, resume: bool) -> tuple[ReferenceLogprobs, str]:
        """π_ref's log-probs of every response the run reads (glassrl.supervised.reference)."""
        cfg = self.cfg
        groups: dict[str, list[tuple[list[int], list[int]]]] = (
            {
                "eval/chosen": [(p, c) for p, c, _, _ in self.evals],
                "eval/rejected": [(p, r) for p, _, r, _ in self.evals],
            }
            if not self.labelled_evals
            else {
                "eval/response": [(e.prompt, e.response) for e in self.evals],
                "eval/kl": [(e.prompt, e.partner) for e in self.evals],
            }
        )
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
        loss, r_c, r_r, logps = self._pairs([e for _, e in examples], indices, "train", grad=True, step=True)
        sums = {
            "train/loss": loss.item(),
            **_pair_metrics("train", r_c.sequence, r_r.sequence, logps),
        }
        return loss, Tally(1, sums)

    def _pairs(self, pairs: list[Pair], indices: list[int], group: str, grad: bool, step: bool = False):
        """(mean loss, chosen's Rewards, rejected's Rewards, (Σ log π chosen, Σ log π rejected) (B,) each)
        of ``pairs``, chosen and rejected in one forward pass; ``step``: a training batch, which
        updates BCO's running mean first."""
        chosen, rejected = self._sides(
            [(p, c) for p, c, _, _ in pairs] + [(p, r) for p, _, r, _ in pairs], indices, group, grad
        )
        loss, r_c, r_r = pair_loss(self.cfg.loss, chosen, rejected, self._params(chosen, rejected, step))
        logps = tuple(torch.where(s.mask, s.logprobs.detach(), 0.0).sum(-1) for s in (chosen, rejected))
        return loss.mean(), r_c, r_r, logps

    def _params(self, chosen: Side, rejected: Side, step: bool) -> PreferenceLossParams:
        """The loss's numbers; BCO's δ the running mean of the rewards, updated by a training batch's
        (TRL's bco_pair: RunningMoments.update, then its mean)."""
        params, entry = self.cfg.params(), PREFERENCE_LOSSES[self.cfg.loss]
        if not entry.state:
            return params
        if step:
            rewards = torch.cat([side_rewards(s, entry, params.beta).sequence.detach() for s in (chosen, rejected)])
            self.running.update(rewards)
        return replace(params, bco_delta=self.running.mean)

    def _sides(self, sequences, indices: list[int], group: str, grad: bool) -> tuple[Side, Side]:
        """The first and second half of ``sequences`` as two Sides, from one forward pass; π_ref
        from the cache: groups ``<group>/chosen``, ``<group>/rejected`` (``kto:<split>``: ``<split>/response``,
        ``/kl``)."""
        logprobs, mask = self._logprobs(sequences, grad)
        B, T = len(indices), mask.shape[1]
        kto = group.removeprefix("kto:")
        names = (f"{kto}/response", f"{kto}/kl") if kto != group else (f"{group}/chosen", f"{group}/rejected")
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

    def _kto_loss(
        self, indices: list[int], examples: list[Labelled], split: str = "train"
    ) -> tuple[torch.Tensor, Tally]:
        """KTO on a batch of labelled responses: z₀ from their mismatched pairs (no gradient), then the
        loss; ``split`` "eval": held-out examples, no gradient (the Tally's keys stay ``train/``)."""
        params, entry = self.cfg.params(), UNPAIRED_LOSSES[self.cfg.loss]
        responses, kl_pairs = self._sides(
            [(e.prompt, e.response) for e in examples] + [(e.prompt, e.partner) for e in examples],
            indices,
            f"kto:{split}",
            grad=split == "train",
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

    @property
    def labelled_evals(self) -> bool:
        """Held-out examples in KTO's own form (prompt, completion, label), not pairs."""
        return bool(self.evals) and isinstance(self.evals[0], Labelled)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The held-out pairs' metrics: the implicit rewards of the run's loss (for KTO: its
        token-sum β·log π/π_ref), their accuracy and margin, the log-probs, and (pair losses) the loss.
        Held-out KTO examples: the metrics KTO trains with (loss, rewards and log-probs of the desirable
        and the undesirable ones, their margin, z₀ as ``kl``), as TRL's KTOTrainer evaluates them."""
        if self.labelled_evals:
            return self._evaluate_labelled()
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
            if self.cfg.loss in PAIR_LOSSES:  # with the NLL term (RPO, CPO, ORPO); BCO's δ as it stands
                losses.append(pair_loss(self.cfg.loss, c, r, self._params(c, r, step=False))[0])
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

    def _evaluate_labelled(self) -> dict[str, float]:
        was_training = self.model.training
        self.model.eval()
        size, tallies = self.cfg.batch_size, []
        for start in range(0, len(self.evals), size):
            indices = list(range(start, min(start + size, len(self.evals))))
            tallies.append(self._kto_loss(indices, [self.evals[i] for i in indices], "eval")[1])
        self.model.train(was_training)
        means = window_means(tallies, self.train_keys)
        return {"eval/" + key.removeprefix("train/"): value for key, value in means.items()}

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
            params = self._params(*sides, step=False)
            out.append(pair_ledger(prompt, *numbers, loss=self.cfg.loss, params=params, source=raw.source))
        return out

    def finish(self, out: Path, result: dict[str, float]) -> None:
        """glassrl.json, the preference ledgers of the first held-out pairs (``ledgers/preference.jsonl``)
        and report.html (learning curves and those ledgers: glassrl.report.html)."""
        ledgers = self.ledgers(list(range(min(LEDGER_PAIRS, len(self.eval_pairs))))) if self.eval_pairs else []
        lines = "".join(json.dumps(ledger.to_dict(), ensure_ascii=False) + "\n" for ledger in ledgers)
        (out / "ledgers").mkdir(exist_ok=True)
        write_text(out / "ledgers" / LEDGER_FILE, lines)
        self._write_summary(out, result)
        write_run_report([out], out / "report.html", name=Path(self.cfg.output_dir).name)  # curves, ledgers

    def _write_summary(self, out: Path, result: dict[str, float]) -> None:
        """glassrl.json: what was trained, on what, and the held-out preference accuracy."""
        cfg, entry = self.cfg, PREFERENCE_LOSSES[self.cfg.loss]
        params = replace(cfg.params(), bco_delta=self.running.mean)
        summary = {
            "kind": "preference",
            "loss": cfg.loss,
            "params": {k: getattr(params, k) for k in (*entry.knobs, *entry.state)},  # BCO: δ as it ended
            "base_model": str(self.path),
            "reference": (cfg.reference or str(self.path)) if PREFERENCE_LOSSES[cfg.loss].reference else None,
            "lora": None if cfg.lora is None else asdict(cfg.lora),
            "chat_template": cfg.chat_template,  # how text prompts were rendered (explain renders them so)
            "system_prompt": cfg.system_prompt,
            "data": cfg.data,
            "eval_data": eval_spec(cfg),
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


def _compute(cfg: PreferenceConfig, device: torch.device) -> str:
    """compute_dtype with "auto" made concrete: bfloat16 on CUDA, float32 elsewhere."""
    if cfg.compute_dtype != "auto":
        return cfg.compute_dtype
    return "bfloat16" if device.type == "cuda" else "float32"
