"""The one loop of the supervised trainers (SFT, reward model, preference: DPO family and KTO).

    return train_supervised(cfg, lambda device: SFTObjective.build(cfg, device, model, tokenizer), console)

A trainer supplies an :class:`Objective`: its model and tokenizer, its training examples, how a
batch of them becomes a loss and the sums behind its ``train/`` metrics, how the held-out
metrics are computed, what else it writes at the end, and the line that sums it up. The loop
does the rest, the same way for every trainer:

- a lock on ``output_dir`` before any work (glassrl.run.lock): a second run into it fails at once;
- the CPU threads and their start-up line, the seeds, then the device; the objective is built
  after the seeds, since a fresh scalar head is drawn from torch's RNG;
- AdamW and its schedule (glassrl.optim); ``batch_size`` examples a step in a seeded order
  (glassrl.data.collate.batch_indices), in forward/backward passes of ``micro_batch_size`` where the
  config has one (the preference trainers: gradient accumulation, :func:`accumulate`);
- a NaN/inf loss or gradient norm (before clipping) stops the run before the weights change
  (``on_nonfinite: stop``; nothing is written) or skips that step (``skip``; counted in
  ``train/skipped_steps``); a taken step whose weights come out non-finite stops the run;
- every ``log_every`` steps and at the last, a ``train/`` row: each metric's sum over the steps
  taken since the last row divided by the sum of their weights (:class:`Tally`; null when every
  step was skipped), ``train/grad_norm`` and ``train/lr`` at that step; every ``eval_every``
  steps and at the last, the held-out metrics; rows go to ``metrics.jsonl`` (a non-finite value
  is null) and the progress bar shows the objective's summary of them;
- the outputs (``<name>_config.yaml``, ``metrics.jsonl``, the model and tokenizer from
  ``save_pretrained``, the objective's own files) are staged in a sibling directory that
  replaces ``output_dir`` as a whole at the end (glassrl.run.atomic.StagedDir): a run killed or
  stopped midway leaves the previous outputs as they were, never old weights beside new metrics;
- with a :class:`~glassrl.supervised.checkpoints.Checkpointing` (the preference trainers'),
  checkpoints under ``output_dir/checkpoints`` every ``every`` steps and at the last, and a
  resumed run that continues from the latest exactly (that module's docstring); without one
  (SFT, the reward model) a run starts afresh each time.
- Ctrl-C or SIGTERM (glassrl.run.stop) ends the step in progress, then the run, with one line
  (``stopped at step N of M; …``): the outputs are as they were; a run with checkpoints writes
  one at step N and says to add ``--resume``; a second signal abandons the step.

``model: default`` names the default model, which must be built already (:func:`model_dir`):
building it is the caller's step (``glassrl sft``/``rm``, the pipeline), because its recipe
runs SFT itself (glassrl.builtin.default_model).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

import torch
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from glassrl.config import to_dict
from glassrl.data.collate import batch_indices
from glassrl.errors import GlassrlError
from glassrl.files import disk_errors
from glassrl.models import resolve_device, resolve_model_path
from glassrl.models.default_model import MARKER, default_model_dir
from glassrl.models.threads import set_threads, startup_line
from glassrl.optim import OptimConfig, guarded_step, make_optimizer, optimizer_path, seed_everything
from glassrl.report.sinks import JsonlSink
from glassrl.run import state, stop
from glassrl.run.atomic import StagedDir, safetensors_os_errors, write_text
from glassrl.run.lock import sibling_lock_path
from glassrl.run.open import model_in_run
from glassrl.run.session import stop_requested, take_lock
from glassrl.supervised.checkpoints import Checkpointing, OptimizerState, TrainableWeights


class LoopConfig(Protocol):
    """The knobs the loop reads, the same in every supervised config (SFTConfig, RMConfig)."""

    seed: int
    batch_size: int
    optim: OptimConfig
    output_dir: str
    eval_every: int
    log_every: int
    device: str
    threads: int | Literal["auto"]
    on_nonfinite: Literal["stop", "skip"]

    def validate(self, written: Set[str] | None = None) -> None: ...


class Tally(NamedTuple):
    """One taken step's share of the next ``train/`` row: ``row[key] = Σ sums[key] / Σ weight``
    over the steps since the last row. SFT weighs a step by its response tokens (a token mean
    over the window), the reward model by 1 (a mean over steps). ``weights`` gives a key a weight
    of its own (KTO: the mean reward of the desirable examples, weighed by their count)."""

    weight: float
    sums: dict[str, float]
    weights: dict[str, float] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)


@dataclass
class Logged:
    """What the loop has logged and not yet logged, as checkpoint part "progress": ``rows``
    written to metrics.jsonl so far ([step, row]), ``window`` the steps taken since the last row,
    ``skipped`` the non-finite steps dropped since then."""

    rows: list[list[Any]] = field(default_factory=list)
    window: list[Tally] = field(default_factory=list)
    skipped: int = 0

    part_names = ("progress",)
    data_parts = part_names  # metric rows: data, null or NaN where a value was not finite (glassrl.run.validate)

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        window = [[t.weight, t.sums, t.weights] for t in self.window]
        return {"progress": ("json", {"rows": self.rows, "window": window, "skipped": self.skipped})}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        saved = parts["progress"]
        self.rows = [[int(step), row] for step, row in saved["rows"]]
        self.window = [Tally(weight, sums, weights) for weight, sums, weights in saved["window"]]
        self.skipped = int(saved["skipped"])


class Objective(Protocol):
    """What a supervised trainer supplies to :func:`train_supervised`."""

    name: str  # "sft", "rm": the progress bar, "<name> step N" in errors, <name>_config.yaml, the last line
    model: torch.nn.Module  # on the device, in train mode; trained in place and saved with save_pretrained
    tokenizer: Any  # saved beside the model
    train: Sequence  # the training examples; each step draws batch_size of them
    steps: int  # optimiser steps
    train_keys: tuple[str, ...]  # the keys of Tally.sums, in the order of the row
    sizes: dict[str, float]  # counts returned with the metrics (e.g. examples), beside steps

    def loss(self, examples: list) -> tuple[torch.Tensor, Tally]:
        """The scalar loss to differentiate for a batch of examples, and the step's tally."""
        ...

    def evaluate(self) -> dict[str, float]:
        """The held-out metrics (eval/...), model in eval mode and back; {} without a held-out set."""
        ...

    def finish(self, out: Path, result: dict[str, float]) -> None:
        """Write what the trainer adds to the outputs (into the staged directory ``out``)."""
        ...

    def summary(self, result: dict[str, float]) -> str:
        """The metrics so far in a few words, for the progress bar and the last line (any key may be missing)."""
        ...


def train_supervised(
    cfg: LoopConfig,
    objective: Callable[[torch.device], Objective],
    console: Console | None = None,
    run: Checkpointing | None = None,
) -> dict[str, float]:
    """Check ``cfg``, lock ``output_dir``, set threads and seeds, build the objective on the device
    and train it; returns the last row's metrics with steps, the objective's sizes and time_s.
    ``run``: checkpoints, and a resume from the latest (glassrl.supervised.checkpoints)."""
    cfg.validate()
    out, console = Path(cfg.output_dir), console or Console()
    # the run's life (glassrl.run.session): the lock before any work (a second run fails at once), the
    # thread count (a resumed run's: the one it recorded), fresh or resumed, checkpoints, a stop
    lock = take_lock(sibling_lock_path(out), f"output_dir = {out}", console)
    try:
        if run is not None:
            run.check_run_dir()
        recorded = run.recorded_threads().threads if run is not None else None
        count, why = set_threads(cfg.threads, recorded)
        threads = run.threads_part(count, why) if run is not None else state.Threads(count, why)
        console.print(startup_line(count, why), markup=False, soft_wrap=True)  # before torch work
        seed_everything(cfg.seed)
        try:
            with stop.handling(), stop.graceful():  # Ctrl-C, SIGTERM: the step ends, then nothing is written
                return _train(cfg, objective(resolve_device(cfg.device)), console, run, threads)
        except stop.Interrupted as signal:  # a second one: the step in progress is abandoned
            raise stop.Stopped(signal.signum, f"stopped during a step; {_untouched(out, run)}") from None
    finally:
        lock.release()


def _train(
    cfg: LoopConfig, obj: Objective, console: Console, run: Checkpointing | None, threads: state.Threads
) -> dict[str, float]:
    model, steps, name = obj.model, obj.steps, obj.name
    optimizer, scheduler = make_optimizer(model, cfg.optim, steps, "optim")
    console.print(f"optimiser: {optimizer_path(optimizer, cfg.optim)}", markup=False, soft_wrap=True)
    batches = batch_indices(len(obj.train), cfg.batch_size, torch.Generator().manual_seed(cfg.seed))
    micro = getattr(cfg, "micro_batch_size", None) or cfg.batch_size  # the preference trainers' accumulation

    out = Path(cfg.output_dir)
    result: dict[str, float] = {"steps": steps, **obj.sizes}
    log_state = Logged()  # rows so far; the steps taken, and dropped as non-finite, since the last row
    done = 0
    if run is not None:
        parts = [TrainableWeights(model), OptimizerState(optimizer, scheduler), log_state]
        done = run.attach(cfg, threads, [*parts, *getattr(obj, "state_parts", [])])  # + BCO's running mean
        for note in run.notes:
            console.print(f"glassrl: {note}", markup=False, soft_wrap=True)
        for _ in range(done):  # the data order is a function of the seed and the step
            next(batches)
    for _, row in log_state.rows:
        result.update(row)
    start = time.perf_counter()
    progress = Progress(
        TextColumn(name),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    with StagedDir(out) as stage:
        with disk_errors(f"output_dir = {out}", out), safetensors_os_errors(), progress:
            config = yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True)
            write_text(stage.path / f"{name}_config.yaml", config)
            log = JsonlSink(stage.path / "metrics.jsonl")
            for logged, row in log_state.rows:  # a resumed run's rows so far
                log.log(logged, row)
            bar = progress.add_task(name, total=steps, completed=done, info=obj.summary(result))
            for step in range(done + 1, steps + 1):
                if signum := stop_requested(run, step - 1):  # a run with checkpoints keeps the steps taken
                    raise stop.Stopped(signum, f"stopped at step {step - 1} of {steps}; {_untouched(out, run)}")
                optimizer.zero_grad(set_to_none=True)
                loss, tally = accumulate(obj, [obj.train[i] for i in next(batches)], micro)
                taken, checked = guarded_step(
                    model,
                    optimizer,
                    scheduler,
                    {"train/loss": loss},
                    max_norm=cfg.optim.grad_clip,
                    norm_key="train/grad_norm",
                    policy=cfg.on_nonfinite,
                    where=lambda _, step=step: f"{name} step {step}",
                )
                if taken:
                    log_state.window.append(tally)
                else:
                    log_state.skipped += 1
                row: dict[str, float] = {}
                if step % cfg.log_every == 0 or step == steps:
                    row = window_means(log_state.window, obj.train_keys)
                    row.update(
                        {"train/grad_norm": checked["train/grad_norm"].item(), "train/lr": scheduler.get_last_lr()[0]}
                    )
                    if log_state.skipped:
                        row["train/skipped_steps"] = log_state.skipped
                    log_state.window, log_state.skipped = [], 0
                if (cfg.eval_every and step % cfg.eval_every == 0) or step == steps:
                    row.update(obj.evaluate())
                if row:
                    log.log(step, row)
                    log_state.rows.append([step, row])
                    result.update(row)
                    progress.update(bar, info=obj.summary(result))
                if run is not None and run.due(step, steps):
                    run.save(step)
                progress.advance(bar)
            log.close()
            result["time_s"] = time.perf_counter() - start
            model.save_pretrained(stage.path)
            obj.tokenizer.save_pretrained(stage.path)
            obj.finish(stage.path, result)
    console.print(f"{name}: {steps} steps in {result['time_s']:.1f}s, {obj.summary(result)} -> {out}")
    return result


def accumulate(obj: Objective, batch: list, micro: int) -> tuple[torch.Tensor, Tally]:
    """The batch's gradients, in forward/backward passes of ``micro`` examples (``micro`` divides
    the batch: checked by the config): each pass's loss weighted by its share s = micro/len(batch),
    so that a loss that is a mean over examples gets the batch's gradient. Returns the batch's loss
    (Σ s·loss, detached) and its tally (each pass's sums and weights scaled by s: a mean over the
    batch for a weight-1 tally, the same ratios for one weighted by counts)."""
    share = micro / len(batch)
    total, sums, weights, weight = None, {}, {}, 0.0
    for start in range(0, len(batch), micro):
        loss, tally = obj.loss(batch[start : start + micro])
        (loss * share).backward()
        part = (loss * share).detach()
        total = part if total is None else total + part
        weight += share * tally.weight
        for key, value in tally.sums.items():
            sums[key] = sums.get(key, 0.0) + share * value
            weights[key] = weights.get(key, 0.0) + share * tally.weights.get(key, tally.weight)
    if micro == len(batch):  # one pass: the objective's own tally, unscaled
        return total, tally
    return total, Tally(weight, sums, weights)


def _untouched(out: Path, run: Checkpointing | None) -> str:
    if run is not None and (latest := run.manager.latest()) is not None:
        return f"output_dir = {out} is as it was; add --resume to the same command to go on from {latest.name}"
    return f"nothing was written (output_dir = {out} is as it was); run the same command again to train"


def window_means(window: list[Tally], keys: tuple[str, ...]) -> dict[str, float]:
    """``Σ sums[key] / Σ weight`` over the window for each key (a key's own weight where the tally
    gives one); NaN (null in metrics.jsonl) when empty or the key's weights sum to 0."""
    means = {}
    for key in keys:
        weight = sum(t.weights.get(key, t.weight) for t in window)
        means[key] = sum(t.sums[key] for t in window) / weight if weight else math.nan
    return means


def epoch_steps(epochs: float, examples: int, batch_size: int) -> int:
    """Optimiser steps for ``epochs`` passes over ``examples`` in batches of ``batch_size`` (at least 1)."""
    return max(1, round(epochs * examples / batch_size))


def model_dir(model: str) -> Path:
    """The checkpoint directory ``model`` names: "default" (the default model, built already), a
    run or one of its checkpoints (its policy: glassrl.run.open.model_in_run), or a directory or
    cached hub id (glassrl.models.resolve_model_path)."""
    if model != "default":
        in_run = model_in_run(model, "model")
        return in_run[0] if in_run is not None else resolve_model_path(model, "model")
    path = default_model_dir()
    if not (path / MARKER).is_file():
        raise GlassrlError(f"model: default: the default model is not built yet in {path}; run glassrl init-model")
    return path


LOWER = "lower batch_size (or max_length)"  # what a supervised batch too large for memory says (check_training_fits)


def warn(line: str | None, console: Console | None = None) -> None:
    """Print a warning line (a data check's: glassrl.data.preferences), when there is one."""
    if line is not None:
        (console or Console(stderr=True)).print(line, markup=False, soft_wrap=True)


def check_positions(model, max_length: int, where: str) -> None:
    """``max_length`` fits the model's positions (``max_position_embeddings``), else GlassrlError."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if positions is not None and max_length > positions:
        raise GlassrlError(
            f"max_length = {max_length}: more than the {positions} positions of the model ({where}); "
            f"use max_length <= {positions}"
        )
