"""Checkpoints of a supervised run, for an exact resume (the preference trainers turn them on).

    run = Checkpointing(out, every=50, keep=2, resume=args.resume, may_change=RESUME_MAY_CHANGE)
    train_supervised(cfg, objective, console, run)

The checkpoints are the RL trainer's (glassrl.run.checkpoint: atomic, verified, a ``latest``
pointer, pruning; glassrl.run.state: the parts and their restoration), under
``output_dir/checkpoints`` beside the staged outputs (glassrl.supervised.loop), so that a run
killed midway leaves them. A checkpoint is written every ``every`` steps and at the last one,
with these parts:

    config      the resolved config, compared with the resumed run's (state.RunConfig: only
                the keys of ``may_change`` may differ)
    threads     the intra-op thread count the steps ran with (state.Threads)
    counters    completed steps
    model       the trainable weights (every weight, or LoRA's adapters: the frozen base is
                loaded again from its checkpoint), safetensors
    optim       AdamW's state and the schedule's
    progress    the metric rows written so far and the steps taken since the last row
    bco_delta   BCO's running mean reward δ (:class:`RunningMean`; the objective's ``state_parts``)
    rng         python, numpy and torch (and CUDA) RNG states (last: loading may draw)

The data order is not stored: it is a function of the seed and the step
(glassrl.data.collate.batch_indices), so a resumed run replays the first ``step`` batches of
indices. On CPU a run resumed from step k ends with the same weights and metric rows, bit for
bit, as one that never stopped (tests/supervised/test_supervised_preference.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from glassrl.config import to_dict
from glassrl.errors import GlassrlError
from glassrl.run import state
from glassrl.run.session import RunCheckpoints, change_notes


class TrainableWeights:
    """The weights that train (``requires_grad``) as part "model"; loaded into the live model."""

    part_names = ("model",)

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        weights = {n: p.detach().contiguous() for n, p in self.model.named_parameters() if p.requires_grad}
        return {"model": ("safetensors", weights)}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        saved = parts["model"]
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if set(saved) != trainable:
            odd = sorted(set(saved) ^ trainable)[:3]
            raise GlassrlError(f"checkpoint part model: its weights do not fit the model ({', '.join(odd)})")
        with torch.no_grad():
            params = dict(self.model.named_parameters())
            for name, tensor in saved.items():
                params[name].copy_(tensor)


class OptimizerState:
    """AdamW's state and its schedule's, as part "optim"."""

    part_names = ("optim",)

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return {
            "optim": ("torch", {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()})
        }

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(parts["optim"]["optimizer"])
        self.scheduler.load_state_dict(parts["optim"]["scheduler"])


class Checkpointing(RunCheckpoints):
    """A supervised run's checkpoints under ``out/checkpoints`` (module docstring; the life of the run:
    glassrl.run.session). ``every``: steps between checkpoints (0: only the last step's); ``keep``: how
    many are kept; ``resume``: continue from the latest; ``may_change``: the config keys (dotted
    prefixes) a resumed run may change."""

    def __init__(self, out: Path, *, every: int, keep: int, resume: bool, may_change: tuple[str, ...]) -> None:
        super().__init__(Path(out) / "checkpoints", keep=keep, every=every, resume=resume, what=f"output_dir = {out}")
        self.may_change = may_change
        self.notes: list[str] = []  # what a resume says: a fallback checkpoint, the keys changed

    def attach(self, cfg: Any, threads: state.Threads, parts: list[Any]) -> int:
        """Set the run's parts (model, optimiser, progress: :class:`TrainableWeights`,
        :class:`OptimizerState`, glassrl.supervised.loop.Logged) and, when resuming, load the latest checkpoint
        into them; returns the steps already taken (0 for a fresh run)."""
        run_config = state.RunConfig(to_dict(cfg), self.may_change, to_dict(type(cfg)()))
        restored = self.start([run_config, threads, self.counters, *parts, state.GlobalRNG({})])
        if restored is not None:
            self.notes = [restored.note] if restored.note else []
            self.notes += change_notes(run_config)
        return self.counters.step


class RunningMean:
    """BCO's δ: the mean of the training batches' mean rewards so far (TRL's RunningMoments.update
    on a 0-d batch mean: count 1 per batch), checkpoint part ``bco_delta`` for an exact resume."""

    part_names = ("bco_delta",)

    def __init__(self) -> None:
        self.mean, self.count = 0.0, 0

    def update(self, rewards: torch.Tensor) -> float:
        """Add the mean of ``rewards`` (N,) as one more batch; returns the new mean."""
        self.count += 1
        self.mean += (rewards.double().mean().item() - self.mean) / self.count
        return self.mean

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return {"bco_delta": ("json", {"mean": self.mean, "count": self.count})}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.mean, self.count = float(parts["bco_delta"]["mean"]), int(parts["bco_delta"]["count"])
