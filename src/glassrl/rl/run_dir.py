"""The files of an RL run directory (``output_dir``) around the steps: what glassrl.rl.loop.Trainer
writes before the first step and reads on a resume; the life of the run itself (lock, threads,
fresh or resumed, checkpoints, a stop) is glassrl.run.session.

    config.yaml        the resolved config (:func:`write_run_files`)
    environment.json   versions, machine, the intra-op thread count and why, the faster paths taken
    metrics.jsonl      one row per logged step; tensorboard/ when on; W&B / MLflow (:func:`open_sinks`)
    ledgers/           step_XXXXXX.jsonl, the ledger samples
    resumes.jsonl      one line per --resume: from which checkpoint, the keys changed, the notes
                       (:func:`record_resume`)

A resumed run's files read as those of a run that never stopped: rows and ledgers of the steps
after its checkpoint are dropped, and a resumed run's config.yaml is compared with the one saved in
its checkpoint (a missing or hand-edited one is written again, and said so).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from rich.console import Console

from glassrl.config import flatten, safe_load, to_dict
from glassrl.files import disk_errors, open_append
from glassrl.report.run_dir import collect_environment, ledger_paths
from glassrl.report.sinks import ConsoleSink, JsonlSink, MetricSinks, MlflowSink, TensorBoardSink, WandbSink
from glassrl.rl.config import TrainConfig
from glassrl.run.atomic import write_text
from glassrl.run.session import change_notes
from glassrl.run.state import Restored, RunConfig, Threads

# Shown under the progress bar, in this order (when present).
CONSOLE_KEYS = (
    "reward/mean",
    "task/accuracy",
    "kl/mean",
    "actor/policy_loss",
    "critic/value_loss",
    "response/length/mean",
    "eval/accuracy",
    "perf/step_s",
)


def record_resume(out: Path, run_config: RunConfig, restored: Restored | None, console: Console) -> None:
    """A resumed run's notes (a fallback checkpoint, a config.yaml missing or edited, the keys it may
    change that changed) said on ``console`` and appended to resumes.jsonl; a fresh run's
    resumes.jsonl (of a run that never checkpointed) removed."""
    if restored is None:
        (out / "resumes.jsonl").unlink(missing_ok=True)
        return
    notes = [restored.note] if restored.note else []
    saved = out / "config.yaml"
    if not saved.is_file():
        notes.append(f"{saved} was missing; it is written again from the run's config")
    else:
        try:
            on_disk = flatten(safe_load(saved.read_text(encoding="utf-8")) or {})
        except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
            on_disk = {}
        edited = sorted(k for k, v in flatten(run_config.saved).items() if on_disk.get(k, v) != v)
        if edited or not on_disk:
            notes.append(
                f"{saved} differed from the checkpoint's config ({', '.join(edited) or 'unreadable'}); rewritten"
            )
    notes += change_notes(run_config)
    for note in notes:
        console.print(f"glassrl: {note}", markup=False, soft_wrap=True)
    changed = {key: list(pair) for key, pair in run_config.changes.items()}
    record = {"resumed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "step": restored.step}
    record |= {"checkpoint": restored.path.name, "changed": changed, "notes": notes}
    with disk_errors("resumes.jsonl", out), open_append(out / "resumes.jsonl") as f:
        f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")


def open_sinks(
    cfg: TrainConfig, out: Path, step: int, *, resume: bool, progress: bool, console: Console
) -> MetricSinks:
    """The run's metric sinks from step ``step`` on (metrics.jsonl always; TensorBoard, W&B, MLflow
    as logging says; the progress bar with ``progress``)."""
    out.mkdir(parents=True, exist_ok=True)
    jsonl = JsonlSink(out / "metrics.jsonl")
    # A resumed run's files read as those of a run that never stopped; a fresh run starts fresh ones.
    bad = jsonl.truncate_after(step if resume else -1)
    if bad:
        lines = f"line {bad[0]} was" if len(bad) == 1 else f"lines {', '.join(map(str, bad))} were"
        console.print(f"glassrl: metrics.jsonl: {lines} not a metrics row; dropped", markup=False)
    for later in [path for at, path in ledger_paths(out).items() if at > step]:
        later.unlink()  # a ledger of a step this run has not taken (yet)
    sinks = [jsonl]
    lg = cfg.logging
    if lg.tensorboard:
        sinks.append(TensorBoardSink(out / "tensorboard", purge_step=step + 1 if resume else None))
    if lg.wandb is not None:  # the section's keys are the sink's (project, name, entity)
        sinks.append(WandbSink(out, to_dict(cfg), resume=resume, **to_dict(lg.wandb)))
    if lg.mlflow is not None:  # (tracking_uri, experiment, name)
        sinks.append(MlflowSink(out, to_dict(cfg), resume=resume, **to_dict(lg.mlflow)))
    if progress:
        sinks.append(ConsoleSink(cfg.steps, CONSOLE_KEYS, start_step=step, console=console))
    return MetricSinks(sinks)


def write_run_files(out: Path, cfg: TrainConfig, threads: Threads, paths: dict[str, str]) -> None:
    """config.yaml (the resolved config) and environment.json (versions, machine, the thread count
    with why it was chosen, the faster paths taken: glassrl.rl.loop.Trainer's start-up lines)."""
    write_text(out / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True))
    environment = {**collect_environment(), "threads": threads.count, "threads_why": threads.why, "paths": paths}
    write_text(out / "environment.json", json.dumps(environment, indent=2, ensure_ascii=False))
