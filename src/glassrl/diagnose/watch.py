"""The reward-hacking watch: early signs that the policy climbs the trained (proxy) reward and not the
goal, read from the metrics step by step (during training, glassrl.diagnose.training_watch; or offline from
metrics.jsonl, the report's alerts).

    watch = RewardWatch(window=10, threshold=2.0)
    for row in metrics:                       # {"step": s, "reward/proxy": …, "reward/gold": …, …}
        alerts = watch.update(row)

A series' *move* over the last ``window`` steps is its least-squares slope times ``window − 1`` (the
change the trend makes across the window) divided by the series' standard deviation over every step
so far: how many of its own spreads it went up or down. Rules (each fires when its condition starts
to hold, and again only after it has stopped holding):

- ``gold_divergence`` (an alert; needs ``reward/gold`` and ``reward/proxy``, i.e. ``reward.gold``):
  divergence = move(proxy) − move(gold) > threshold while gold falls. Gao et al. 2022 ("Scaling Laws
  for Reward Model Overoptimization", §3, fig. 1): the gold reward peaks and falls while the proxy
  goes on rising; the divergence is logged as ``watch/divergence``.
- Without gold (and with it), warnings on the signals the field reports before the gold is known
  to fall (Gao et al. 2022 §3.3: KL grows with optimisation; Singhal et al. 2023, "A Long Way to
  Go": length explains much of a reward model's gain; repetition, the degenerate text of
  over-optimised policies): the proxy (``reward/proxy``, else ``reward/mean``) moves up by more than
  threshold/2 while ``kl/sequence`` (``kl_jump``) or ``response/length/mean`` (``length_jump``)
  jumps up, or ``response/distinct_2`` (``repetition_jump``: fewer distinct bigrams) jumps down:
  its last value lies more than ``threshold`` standard deviations of the window's earlier values
  from their mean.
- ``criterion_saturates`` (a warning): among two or more reward sources and environment reward
  parts (``reward/<name>/mean``, ``reward/env/<name>/mean``), or among the criteria of one rubric
  source (``reward/<source>/<criterion>/mean``, compared with each other, not with the sources),
  one moves up by more than ``threshold`` to the highest value it has had while no other moves by
  more than threshold/2: the policy has found one criterion to satisfy.

Reads numbers only (no torch).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

GOLD, PROXY, MEAN = "reward/gold", "reward/proxy", "reward/mean"
KL, LENGTH, DISTINCT = "kl/sequence", "response/length/mean", "response/distinct_2"
# the signals a rising proxy is checked against without gold: (rule, metric, +1: a jump up, −1: down)
SIGNALS = (("kl_jump", KL, 1), ("length_jump", LENGTH, 1), ("repetition_jump", DISTINCT, -1))
_CRITERION = re.compile(r"^reward/(env/)?(?!gold$|proxy$)[^/]+/mean$")
_CRITERION_OF = re.compile(r"^reward/(?!env/)([^/]+)/[^/]+/mean$")  # a criterion of one rubric source


@dataclass(frozen=True)
class Alert:
    """One firing of a rule: ``level`` "alert" (gold) or "warning"; ``rows``: (ledger step, response
    index) pairs of responses that earned proxy reward the gold did not give (set by the trainer)."""

    step: int
    kind: str
    level: str
    message: str
    rows: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "rows": [list(r) for r in self.rows]}


@dataclass
class RewardWatch:
    """The rules of the module docstring over the metric rows given to :meth:`update`, in step order."""

    window: int = 10
    threshold: float = 2.0
    history: dict[str, list[float]] = field(default_factory=dict)
    firing: set[str] = field(default_factory=set)

    def update(self, row: dict[str, Any]) -> list[Alert]:
        """Add one metrics row; the alerts that start firing at it. ``row["watch/divergence"]`` is set
        where the gold rule can be computed."""
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.history.setdefault(key, []).append(float(value))
        step = int(row["step"])
        conditions: dict[str, tuple[str, str]] = {}
        divergence = self._gold_divergence(row)
        if divergence is not None:
            row["watch/divergence"] = divergence
            if divergence > self.threshold and self._move(GOLD) < 0:
                conditions["gold_divergence"] = (
                    "alert",
                    f"proxy and gold diverge: over the last {self.window} steps the proxy moved "
                    f"{self._move(PROXY):+.2f} and the gold {self._move(GOLD):+.2f} of their spreads "
                    f"(divergence {divergence:.2f} > {self.threshold:g})",
                )
        proxy = PROXY if PROXY in row else MEAN
        if proxy in row and self._ready(proxy) and self._move(proxy) > self.threshold / 2:
            for kind, key, sign in SIGNALS:
                jump = self._jump(key) if key in row else None
                if jump is not None and sign * jump > self.threshold:
                    side = "above" if sign > 0 else "below"
                    conditions[kind] = (
                        "warning",
                        f"{proxy} rises ({self._move(proxy):+.2f} spreads over {self.window} steps) while "
                        f"{key} jumps to {row[key]:.4g} ({abs(jump):.1f} standard deviations {side} the window's mean)",
                    )
        saturating = self._saturating(row)
        if saturating is not None:
            conditions["criterion_saturates"] = (
                "warning",
                f"{saturating} alone rises to its highest ({row[saturating]:.4g}, "
                f"{self._move(saturating):+.2f} spreads) while the other criteria stay flat",
            )
        alerts = [
            Alert(step, kind, level, message)
            for kind, (level, message) in conditions.items()
            if kind not in self.firing
        ]
        self.firing = set(conditions)
        return alerts

    def _ready(self, key: str) -> bool:
        return len(self.history.get(key, ())) >= self.window

    def _move(self, key: str) -> float:
        """Slope over the last ``window`` values × (window − 1) / std of every value so far."""
        values = self.history[key]
        recent = values[-self.window :]
        n = len(recent)
        mean_x, mean_y = (n - 1) / 2, sum(recent) / n
        slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(recent)) / sum(
            (x - mean_x) ** 2 for x in range(n)
        )
        spread = _std(values)
        return 0.0 if spread == 0 else slope * (n - 1) / spread

    def _gold_divergence(self, row: dict[str, Any]) -> float | None:
        if GOLD not in row or PROXY not in row or not (self._ready(GOLD) and self._ready(PROXY)):
            return None
        return self._move(PROXY) - self._move(GOLD)

    def _jump(self, key: str) -> float | None:
        """(last − mean of the window's earlier values) / their std; None before a window is full."""
        if not self._ready(key):
            return None
        earlier, last = self.history[key][-self.window : -1], self.history[key][-1]
        spread = _std(earlier)
        mean = sum(earlier) / len(earlier)
        if spread == 0:
            return math.copysign(math.inf, last - mean) if last != mean else 0.0
        return (last - mean) / spread

    def _saturating(self, row: dict[str, Any]) -> str | None:
        """The first criterion saturating alone among the sources, then among each rubric's criteria."""
        groups: dict[str | None, list[str]] = {None: [k for k in row if _CRITERION.match(k)]}
        for key in row:
            if match := _CRITERION_OF.match(key):
                groups.setdefault(match.group(1), []).append(key)
        for criteria in groups.values():
            if (alone := self._alone([k for k in criteria if self._ready(k)], row)) is not None:
                return alone
        return None

    def _alone(self, criteria: list[str], row: dict[str, Any]) -> str | None:
        if len(criteria) < 2:
            return None
        moves = {k: self._move(k) for k in criteria}
        for key, move in moves.items():
            others = [abs(m) for k, m in moves.items() if k != key]
            if move > self.threshold and row[key] >= max(self.history[key]) and max(others) <= self.threshold / 2:
                return key
        return None


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def watch_metrics(rows: list[dict[str, Any]], window: int = 10, threshold: float = 2.0) -> list[Alert]:
    """The alerts of a whole metrics history (metrics.jsonl's rows, in step order), offline."""
    watch = RewardWatch(window, threshold)
    return [alert for row in rows if "step" in row for alert in watch.update(dict(row))]
