"""Where the metrics of a step go: ``metrics.jsonl``, TensorBoard, the terminal.

    sinks = MetricSinks([JsonlSink(run / "metrics.jsonl"), TensorBoardSink(run / "tensorboard"),
                         ConsoleSink(total_steps=100, keys_to_show=["reward/mean", "kl/mean"])])
    sinks.log(step, {"reward/mean": 0.4, ...})
    sinks.close()

Every sink takes ``dict[str, float]`` keyed by the names of docs/metrics.md. Values that
are not finite (NaN: a statistic over no token; ±inf) are written as ``null`` in JSONL
(JSON has no NaN), skipped by TensorBoard and shown as ``nan`` on the terminal.

On ``--resume`` from step ``s`` the trainer calls ``JsonlSink.truncate_after(s)`` and
builds ``TensorBoardSink(..., purge_step=s + 1)`` so the logs read as those of a run that
never stopped.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class MetricSink(Protocol):
    """One destination of per-step metrics."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _json_value(value: float) -> float | int | None:
    """An int stays an int (counts); a non-finite float becomes None (JSON null)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    value = float(value)
    return value if math.isfinite(value) else None


class JsonlSink:
    """Appends ``{"step": n, key: value, ...}`` to ``path``, one line per step.

    Each line is flushed when written, so a killed run keeps every step it logged.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if "step" in metrics:
            raise ValueError("metrics must not contain the key 'step' (it is the row's step)")
        row = {"step": step, **{key: _json_value(v) for key, v in metrics.items()}}
        self._file.write(json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n")
        self._file.flush()

    def truncate_after(self, step: int) -> None:
        """Drop the rows of steps after ``step`` (and a last line cut short by a kill).

        The file is rewritten to a temporary file and renamed over the old one, so a kill
        during the truncation leaves either the old or the new file, never a mix.
        """
        self._file.close()
        kept = []
        with self.path.open("r", encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a partial line written as the run was killed
                if line.endswith("\n") and row["step"] <= step:
                    kept.append(line)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """One scalar per key and step (``SummaryWriter.add_scalar``); non-finite values skipped.

    ``purge_step``: on resume, events at or after this step left by the killed run are
    hidden (SummaryWriter's own ``purge_step``).
    """

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        # torch and tensorboard load only when a run logs to TensorBoard: the report stays torch-free
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            value = float(value)
            if math.isfinite(value):
                self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class ConsoleSink:
    """A rich progress bar (step x/N, elapsed, ETA) and one line of chosen metrics per log.

    ``keys_to_show``: the metrics printed, in this order (absent ones are left out);
    ``start_step``: the step a resumed run starts from, so the ETA counts only what is left.
    """

    def __init__(self, total_steps: int, keys_to_show: Sequence[str], start_step: int = 0, console=None) -> None:
        self.keys = list(keys_to_show)
        self.total_steps = total_steps
        self._progress = Progress(
            TextColumn("step"),
            MofNCompleteColumn(),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console if console is not None else Console(),
        )
        self._task = self._progress.add_task("train", total=total_steps, completed=start_step)
        self._progress.start()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._progress.update(self._task, completed=step)
        self._progress.console.print(self.format_line(step, metrics), highlight=False)

    def format_line(self, step: int, metrics: dict[str, float]) -> str:
        """``step 3/10  reward/mean 0.5  kl/mean 0.00123``: 4 significant digits."""
        shown = [f"{key} {float(metrics[key]):.4g}" for key in self.keys if key in metrics]
        return "  ".join([f"step {step}/{self.total_steps}", *shown])

    def close(self) -> None:
        self._progress.stop()


class MetricSinks:
    """Several sinks as one: each ``log`` and ``close`` goes to all, in order."""

    def __init__(self, sinks: Sequence[MetricSink]) -> None:
        self.sinks = list(sinks)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
