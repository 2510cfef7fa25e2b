"""Where the metrics of a step go: ``metrics.jsonl``, TensorBoard, W&B, MLflow, the terminal.

    sinks = MetricSinks([JsonlSink(run / "metrics.jsonl"), TensorBoardSink(run / "tensorboard"),
                         ConsoleSink(total_steps=100, keys_to_show=["reward/mean", "kl/mean"])])
    sinks.log(step, {"reward/mean": 0.4, ...})
    sinks.close()

Every sink takes ``dict[str, float]`` keyed by the names of docs/metrics.md. Values that
are not finite (NaN: a statistic over no token; ±inf) are written as ``null`` in JSONL
(JSON has no NaN), skipped by TensorBoard and shown as ``nan`` on the terminal.

On ``--resume`` from step ``s`` the trainer calls ``JsonlSink.truncate_after(s)`` (which also
drops lines that are not metrics rows, and says which) and builds
``TensorBoardSink(..., purge_step=s + 1)`` so the logs read as those of a run that never stopped.

Sample completions (the responses of a ledger sample, :func:`sample_rows`) go to the sinks
that show tables (``log_samples``): a W&B Table, an MLflow table artifact, TensorBoard text.
:class:`WandbSink` and :class:`MlflowSink` are the optional extras ``glassrl[wandb]`` and
``glassrl[mlflow]`` (docs/tracking.md); each keeps its tracker's run id in
``run_dir/tracking.json`` so that a resumed run logs to the same tracker run.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from glassrl.config import flatten
from glassrl.errors import GlassrlError
from glassrl.files import open_append, replaced
from glassrl.ledger import Ledger


class MetricSink(Protocol):
    """One destination of per-step metrics."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


# The columns of a sample table, one row per response of a ledger sample.
SAMPLE_COLUMNS = ("group_id", "prompt", "response", "score", "length", "finish_reason")


def sample_rows(ledger: Ledger) -> list[dict[str, Any]]:
    """The responses of a ledger sample as table rows with :data:`SAMPLE_COLUMNS`."""
    return [{column: getattr(response, column) for column in SAMPLE_COLUMNS} for response in ledger.responses]


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    """The finite values (an int stays an int): trackers draw a missing point as a gap."""
    return {key: value for key, value in metrics.items() if math.isfinite(float(value))}


def _json_value(value: float) -> float | int | None:
    """An int stays an int (counts); a non-finite float becomes None (JSON null)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    value = float(value)
    return value if math.isfinite(value) else None


class JsonlSink:
    """Appends ``{"step": n, key: value, ...}`` to ``path``, one line per step.

    Each line is flushed when written, so a killed run keeps every step it logged. A symbolic
    link at ``path`` is refused (glassrl.files.open_append), never appended through.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open_append(self.path)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if "step" in metrics:
            raise ValueError("metrics must not contain the key 'step' (it is the row's step)")
        row = {"step": step, **{key: _json_value(v) for key, v in metrics.items()}}
        self._file.write(json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n")
        self._file.flush()

    def truncate_after(self, step: int) -> list[int]:
        """Keep the rows of steps up to ``step``; drop the later ones, a last line cut short by a
        kill, and every line that is not a metrics row (not UTF-8, not JSON, not an object with an
        integer ``step``). Returns the numbers of those last lines (1-based), for the caller to say.

        The rows kept go to a temp file renamed over the old one, so a kill during the truncation
        leaves either the old or the new file, never a mix.
        """
        self._file.close()
        kept, bad = [], []
        with self.path.open("rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.endswith(b"\n") or not line.strip():
                    continue  # a partial line written as the run was killed, or an empty one
                row = _metrics_row(line)
                if row is None:
                    bad.append(number)
                elif row["step"] <= step:
                    kept.append(line.decode("utf-8"))
        with replaced(self.path) as f:
            f.writelines(kept)
        self._file = open_append(self.path)
        return bad

    def close(self) -> None:
        self._file.close()


def _metrics_row(line: bytes) -> dict[str, Any] | None:
    """The row a line of metrics.jsonl holds, or None when it holds none (see JsonlSink.truncate_after)."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # RecursionError: [[[… nested too deep
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return row if isinstance(step, int) and not isinstance(step, bool) else None


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

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """The rows as one Markdown table under the tag ``samples`` (TensorBoard's Text tab)."""
        self._writer.add_text("samples", markdown_table(rows), global_step=step)
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


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """``rows`` as a Markdown table (columns of the first row); "|" and line breaks escaped."""
    if not rows:
        return "(no samples)"
    columns = list(rows[0])

    def cell(value: Any) -> str:
        return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- trackers (optional extras)


def _tracker(module: str, key: str, extra: str):
    """Import the tracker library ``module``; GlassrlError naming the config key and the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise GlassrlError(f"{key} is on, but {module} is not installed: pip install 'glassrl[{extra}]'") from None


def _tracker_id(run_dir: Path, tracker: str) -> str | None:
    path = run_dir / "tracking.json"
    return json.loads(path.read_text(encoding="utf-8")).get(tracker) if path.is_file() else None


def _keep_tracker_id(run_dir: Path, tracker: str, run_id: str) -> None:
    path = run_dir / "tracking.json"
    ids = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    with replaced(path) as f:
        f.write(json.dumps(ids | {tracker: run_id}, indent=2) + "\n")


class WandbSink:
    """Weights & Biases: a metric row per ``run.log(..., step=step)`` (non-finite values left out,
    as in TensorBoard), sample completions as a ``wandb.Table`` under ``samples``, the resolved
    config as the run's config. Files go under ``run_dir/wandb``; with ``WANDB_MODE=offline``
    nothing leaves the machine (``wandb sync`` uploads later).

    ``resume``: continue the W&B run of ``run_dir/tracking.json`` (W&B ignores a step it
    already holds, such as those logged between the last checkpoint and a crash).
    """

    def __init__(
        self,
        run_dir: Path,
        config: dict[str, Any],
        *,
        project: str,
        name: str | None = None,
        entity: str | None = None,
        resume: bool = False,
    ) -> None:
        self._wandb = _tracker("wandb", "logging.wandb", "wandb")
        run_dir = Path(run_dir)
        run_id = _tracker_id(run_dir, "wandb") if resume else None
        try:
            self._run = self._wandb.init(
                project=project,
                name=name or run_dir.resolve().name,
                entity=entity,
                dir=str(run_dir),
                config=config,
                id=run_id,
                resume="allow" if run_id else None,
                allow_val_change=True,  # a resumed run may change steps
            )
        except self._wandb.errors.Error as err:
            raise GlassrlError(
                f"logging.wandb: W&B could not start a run: {err} (offline: WANDB_MODE=offline)"
            ) from None
        _keep_tracker_id(run_dir, "wandb", self._run.id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(_finite(metrics), step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        columns = list(rows[0]) if rows else list(SAMPLE_COLUMNS)
        table = self._wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])
        self._run.log({"samples": table}, step=step)

    def close(self) -> None:
        self._run.finish()


# MLflow accepts letters, digits, "_", "-", ".", " " and "/" in a metric name.
_MLFLOW_UNSAFE = re.compile(r"[^\w\-. /]")


class MlflowSink:
    """MLflow, through ``MlflowClient`` (no global active run): each metric row as one batch
    (non-finite values left out; a character MLflow refuses in a name becomes "_"; in a file
    store, "/" becomes ".": it keeps a name as a path, where eval/accuracy beside
    eval/accuracy/en cannot be both a file and a folder), sample
    completions as a table artifact ``samples/step_XXXXXX.json`` (``log_table``: the UI's
    artifact view and ``mlflow.load_table``), the resolved config as flat params (``algo.kl.coef``).

    ``tracking_uri``: None = ``MLFLOW_TRACKING_URI``, else MLflow's default. ``resume``: continue
    the run of ``run_dir/tracking.json``; its params stay those of the run's start (MLflow
    params cannot change). A step logged again after a resume is a second point at that step.
    """

    def __init__(
        self,
        run_dir: Path,
        config: dict[str, Any],
        *,
        experiment: str,
        tracking_uri: str | None = None,
        name: str | None = None,
        resume: bool = False,
    ) -> None:
        mlflow = _tracker("mlflow", "logging.mlflow", "mlflow")
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        run_dir = Path(run_dir)
        run_id = _tracker_id(run_dir, "mlflow") if resume else None
        try:
            self._client = mlflow.MlflowClient(tracking_uri=tracking_uri)
            if run_id is None:
                found = self._client.get_experiment_by_name(experiment)
                experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
                run_id = self._client.create_run(experiment_id, run_name=name or run_dir.resolve().name).info.run_id
                params = [Param(key, str(value)) for key, value in flatten(config).items()]
                for start in range(0, len(params), 100):  # MLflow's limit of params per batch
                    self._client.log_batch(run_id, params=params[start : start + 100])
            else:
                self._client.update_run(run_id, status="RUNNING")
        except MlflowException as err:
            where = tracking_uri or mlflow.get_tracking_uri()
            raise GlassrlError(f"logging.mlflow: MLflow could not start a run at {where}: {err.message}") from None
        self._run_id = run_id
        self._file_store = urlparse(tracking_uri or mlflow.get_tracking_uri()).scheme in ("", "file")
        _keep_tracker_id(run_dir, "mlflow", run_id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(self.metric_name(k), float(v), now, step) for k, v in _finite(metrics).items()]
        for start in range(0, len(batch), 1000):  # MLflow's limit of metrics per batch
            self._client.log_batch(self._run_id, metrics=batch[start : start + 1000])

    def metric_name(self, key: str) -> str:
        """The MLflow name of metric ``key`` (see the class docstring)."""
        name = _MLFLOW_UNSAFE.sub("_", key)
        return name.replace("/", ".") if self._file_store else name

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        columns = list(rows[0]) if rows else list(SAMPLE_COLUMNS)
        data = {column: [row[column] for row in rows] for column in columns}
        self._client.log_table(self._run_id, data=data, artifact_file=f"samples/step_{step:06d}.json")

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


class MetricSinks:
    """Several sinks as one: each ``log``, ``log_samples`` and ``close`` goes to all, in order
    (``log_samples`` to those that show tables)."""

    def __init__(self, sinks: Sequence[MetricSink]) -> None:
        self.sinks = list(sinks)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        for sink in self.sinks:
            if hasattr(sink, "log_samples"):
                sink.log_samples(step, rows)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
