"""The reward-hacking watch of a training run: glassrl.diagnose.watch's rules on every step's metrics.

An alert (with ``reward.gold``) or a warning is printed on the console, counted in the step's
metrics (``watch/alerts``), and appended to ``output_dir/watch.jsonl`` with the ledger rows it points
at: the step's ledger sample is written (whatever ``logging.ledger_every`` says), and its responses
that earned more proxy reward than the batch's mean while their gold score fell below the batch's
(with gold), or that earned more proxy than the mean (without), are the alert's ``rows``
((step, response index) in ``ledgers/step_XXXXXX.jsonl``). The report draws each alert on the
curves and highlights its rows. A resumed run replays the metrics.jsonl rows up to its checkpoint,
so its alerts are those of a run that went straight through.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from glassrl.diagnose.watch import GOLD, PROXY, Alert, RewardWatch
from glassrl.files import open_append
from glassrl.jsonl import read_utf8
from glassrl.report.run_dir import METRICS, WATCH, read_metrics
from glassrl.run.atomic import write_text


class TrainingWatch:
    """``update`` once a step, before the step's metrics are logged."""

    def __init__(self, window: int, threshold: float, out: Path, console, resumed_at: int | None = None) -> None:
        self.watch = RewardWatch(window, threshold)
        self.out, self.console = out, console
        self.gold = False  # whether the last step's metrics had a gold reward (the rows' criterion)
        if resumed_at is not None:  # the steps up to the checkpoint, as they were logged; later alerts are redone
            if (out / METRICS).is_file():
                for row in read_metrics(out / METRICS):
                    if row["step"] <= resumed_at:
                        self.watch.update(row)
            if (out / WATCH).is_file():
                kept = [line for line in read_utf8(out / WATCH).splitlines() if json.loads(line)["step"] <= resumed_at]
                write_text(out / WATCH, "".join(line + "\n" for line in kept))

    def update(self, step: int, metrics: dict[str, Any]) -> list[Alert]:
        """The alerts that fire at ``step``; ``metrics`` gains ``watch/divergence`` (with gold) and,
        when some fire, ``watch/alerts``."""
        row = {"step": step, **metrics}
        self.gold = GOLD in metrics
        alerts = self.watch.update(row)
        if "watch/divergence" in row:
            metrics["watch/divergence"] = row["watch/divergence"]
        if alerts:
            metrics["watch/alerts"] = len(alerts)
        return alerts

    def record(self, alerts: list[Alert], rows: list[tuple[int, int]]) -> None:
        """Print and append ``alerts`` to watch.jsonl, each pointing at ``rows``."""
        criterion = "more proxy reward than the batch's mean" + (
            " and a gold score below its mean" if self.gold else ""
        )
        with open_append(self.out / WATCH) as f:
            for alert in alerts:
                alert = Alert(alert.step, alert.kind, alert.level, alert.message, tuple(rows))
                ledger = f"ledgers/step_{alert.step:06d}.jsonl"
                if rows:
                    shown = f"responses {', '.join(str(i) for _, i in rows)} of {ledger} earned {criterion}"
                else:
                    shown = f"no response of the ledger sample ({ledger}) earned {criterion}"
                self.console.print(
                    f"reward watch {alert.level} at step {alert.step} ({alert.kind}): {alert.message}; {shown}",
                    markup=False,
                    soft_wrap=True,
                )
                f.write(json.dumps(alert.to_dict(), ensure_ascii=False) + "\n")


def proxy_only_rows(
    step: int, metrics: dict[str, Any], proxy: Sequence[float | None], gold: Sequence[float | None] | None
) -> list[tuple[int, int]]:
    """(step, index) of the ledger sample's responses earning proxy reward above the batch's mean
    whose gold score is below the batch's (every one above the proxy mean when there is no gold)."""
    proxy_mean = metrics.get(PROXY, metrics.get("reward/mean"))
    rows = []
    for b, p in enumerate(proxy):
        if p is None or proxy_mean is None or p <= proxy_mean:
            continue
        if gold is not None and (gold[b] is None or GOLD not in metrics or gold[b] >= metrics[GOLD]):
            continue
        rows.append((step, b))
    return rows
