"""The sync truth check during a run: the verdicts of the step's weight syncs (glassrl.workers.sync_truth)
read once a step by the training loop, which hands over its metrics and calls :meth:`SyncTruth.update`.

A step's verdicts become metrics (``sync/checks``, ``sync/tensors``, ``sync/breaches``,
``sync/probe_max_diff``, ``perf/sync_check_s``: docs/metrics.md). A breach is printed on the console
("sync truth check at step N: …", naming the receiver, the version, the tensor and its layer or the
first probe token whose log-prob moved) and appended to ``output_dir/watch.jsonl`` as an alert of kind
"sync truth" (``rows`` empty), which the report lists beside the reward watch's; then, under
``check.on_sync_breach: stop``, the run stops with that line (exit 2) once the step is logged.
"""

from __future__ import annotations

import json
from pathlib import Path

from glassrl.errors import GlassrlError
from glassrl.files import open_append
from glassrl.report.run_dir import WATCH
from glassrl.workers.sync_truth import SyncLog

KIND = "sync truth"


class SyncBreach(GlassrlError):
    """A weight sync the check could not prove (``check.on_sync_breach: stop``)."""


class SyncTruth:
    """The loop's side of the check: ``log`` (the workers'), ``on_breach`` "stop" or "warn"."""

    def __init__(self, log: SyncLog, on_breach: str, out: Path, console) -> None:
        self.log, self.on_breach, self.out, self.console = log, on_breach, out, console

    def update(self, step: int, metrics: dict[str, float]) -> list[str]:
        """The step's verdicts into ``metrics``; each breach printed and written to watch.jsonl; the
        sentences returned (:meth:`stop` raises on them after the step is logged)."""
        found, breaches = self.log.drain()
        metrics.update(found)
        level = "alert" if self.on_breach == "stop" else "warning"
        lines = [f"sync truth check at step {step}: {breach}" for breach in breaches]
        if lines:
            with open_append(self.out / WATCH) as f:
                for breach, line in zip(breaches, lines):
                    self.console.print(line, markup=False, soft_wrap=True)
                    alert = {"step": step, "kind": KIND, "level": level, "message": breach, "rows": []}
                    f.write(json.dumps(alert, ensure_ascii=False) + "\n")
        return lines

    def stop(self, lines: list[str]) -> None:
        """Under ``check.on_sync_breach: stop``: SyncBreach with the first breach (and how many more)."""
        if lines and self.on_breach == "stop":
            more = f" (and {len(lines) - 1} more breaches)" if len(lines) > 1 else ""
            raise SyncBreach(
                f"{lines[0]}{more}; the run stops (check.on_sync_breach: stop; docs/debugging.md, sync truth check)"
            )
