"""Two run directories compared step by step, down to the token: what ``glassrl diff`` prints.

    result = diff_runs("runs/a", "runs/b", atol=0.0, rtol=0.0)
    result.first.line()   # "step 7, phase 3, response 12, token 5 ('等于'): logprobs -1.2031 vs -1.203"
    result.differs        # False: the runs agree (a run and its resume do)

Order of comparison: the configs by dotted key (``output_dir`` aside: two runs never share it),
then, for each step either run logged, its ledger sample, its metrics row and its checkpoint.
Within a step a difference is placed at the trainer phase that computes it (glassrl.rl.loop,
:data:`PHASES`); the first divergence is the one of the lowest (step, phase), and inside the
ledger the lowest (response, token) and the column in ledger order, so that it names the cause
rather than its consequences (a token sampled differently changes the response's text, its
score and everything after it). Wall-clock metrics (``perf/…``) are never compared. After the
first divergence each step gets a line of counts (:class:`StepSummary`): how it grows.

Equality: exact by default (NaN equals NaN); with tolerances, numbers a and b agree when
|a − b| <= atol + rtol·|b| (numpy.isclose's rule). Reads only files (no torch).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from glassrl.config import flatten, safe_load, yaml_error
from glassrl.diagnose.checkpoint_diff import compare_checkpoints, tensor_count
from glassrl.errors import GlassrlError
from glassrl.ledger import RESPONSE_FIELDS, RUN_FIELDS, TOKEN_FIELDS, Ledger
from glassrl.report.run_dir import RunDir, read_run

# The trainer's phase (glassrl.rl.loop, Trainer.step) that computes each ledger column and metric namespace.
PHASES = {
    "generate": 1,
    "score": 2,
    "logprobs": 3,
    "rewards": 4,
    "advantages": 5,
    "update": 6,
    "log": 7,
}
_COLUMN_PHASE = {
    **dict.fromkeys(("prompt", "prompt_as_seen", "response", "length", "finish_reason", "turns", "group_id"), 1),
    **dict.fromkeys(("token_id", "token", "role", "turn", "response_mask"), 1),
    **dict.fromkeys(("score", "baseline_reward", "token_scores", "step_end"), 2),
    **dict.fromkeys(("logprobs", "ref_logprobs", "kl", "values"), 3),
    **dict.fromkeys(("beta", "kl_kind", "token_rewards"), 4),
    **dict.fromkeys(("estimator", "gamma", "lam", "deltas", "advantages", "returns", "whitened_advantages"), 5),
}
# by key, else by namespace; anything else is phase 7 (logged)
_METRIC_PHASE = {"kl/beta": 4, "response": 1, "reward": 2, "kl": 3, "actor": 6, "critic": 6, "optim": 6}
IGNORED_CONFIG_KEYS = ("output_dir",)
IGNORED_METRICS = ("perf/",)  # wall-clock: no two runs share it
CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class Difference:
    """One value that differs: ``step`` and ``phase`` (1–7), ``where`` it sits ("response 12, token 5
    ('等于')", "metric reward/mean", "checkpoint actor/model.safetensors w[3, 1]"), the ``column``
    (a ledger field; empty for a metric or checkpoint) and the two values."""

    step: int
    phase: int
    where: str
    column: str
    a: Any
    b: Any
    order: tuple[Any, ...] = field(default=(), compare=False)  # sorts differences inside a step

    def line(self) -> str:
        """``step 7, phase 3, response 12, token 5 ('等于'): logprobs -1.2031 vs -1.203``."""
        a, b = _shown_pair(self.a, self.b)
        what = f"{self.column} " if self.column else ""
        return f"step {self.step}, phase {self.phase}, {self.where}: {what}{a} vs {b}"


@dataclass(frozen=True)
class StepSummary:
    """How much of one step differs: ledger token values, metrics, checkpoint tensors (counts of
    differing / compared), and the largest |a − b| among them with where it is."""

    step: int
    ledger: tuple[int, int] | None  # None: a side has no ledger for the step
    metrics: tuple[int, int] | None
    checkpoint: tuple[int, int] | None
    max_abs: float | None
    max_where: str

    def line(self) -> str:
        parts = [
            f"{name} {n}/{total} differ"
            for name, counts in (
                ("ledger values", self.ledger),
                ("metrics", self.metrics),
                ("tensors", self.checkpoint),
            )
            if counts is not None
            for n, total in [counts]
        ]
        if self.max_abs is not None:
            parts.append(f"max |Δ| {self.max_abs:.3g} ({self.max_where})")
        return f"step {self.step}: " + ", ".join(parts)


@dataclass(frozen=True)
class RunDiff:
    """What :func:`diff_runs` finds: config keys that differ ((key, a, b)), the first divergence, a
    summary per step from it on, and each run's steps."""

    name_a: str
    name_b: str
    config: list[tuple[str, Any, Any]]
    first: Difference | None
    after: list[StepSummary]
    steps_a: list[int]
    steps_b: list[int]

    @property
    def differs(self) -> bool:
        return bool(self.config or self.first or self.steps_a != self.steps_b)

    def lines(self) -> list[str]:
        """The text ``glassrl diff`` prints."""
        out = []
        if self.config:
            out.append(f"configs differ in {len(self.config)} key(s):")
            out += [f"  {key}: {_shown(a)} vs {_shown(b)}" for key, a, b in self.config]
        cause = f"; the configs differ in {', '.join(k for k, _, _ in self.config)}" if self.config else ""
        if self.first is not None:
            out.append(f"first divergence: {self.first.line()}{cause}")
            out.append("after it:")
            out += [f"  {s.line()}" for s in self.after]
        else:
            out.append(
                "no difference in metrics, ledgers or checkpoints"
                + (" (the steps both runs logged)" if self.steps_a != self.steps_b else "")
            )
        if self.steps_a != self.steps_b:
            out.append(
                f"{self.name_a} logged steps {_span(self.steps_a)}; {self.name_b} logged steps {_span(self.steps_b)}"
            )
        return out


def diff_runs(
    path_a: str | Path, path_b: str | Path, atol: float = 0.0, rtol: float = 0.0, checkpoints: bool = True
) -> RunDiff:
    """Compare two run directories (module docstring); GlassrlError when one is not a run. Without
    ``checkpoints`` the checkpoints are not read (the report's view: a model's weights can be large)."""
    if atol < 0 or rtol < 0:
        raise GlassrlError(f"--atol/--rtol: expected numbers >= 0, got {atol} and {rtol}")
    run_a, run_b = read_run(path_a, str(path_a)), read_run(path_b, str(path_b))
    close = _Close(atol, rtol)
    config = _config_diff(run_a, run_b, close)
    metrics_a, metrics_b = _metrics_by_step(run_a), _metrics_by_step(run_b)
    steps = sorted(
        (metrics_a.keys() & metrics_b.keys())
        | (run_a.ledger_paths.keys() & run_b.ledger_paths.keys())
        | ((_checkpoints(run_a).keys() & _checkpoints(run_b).keys()) if checkpoints else set())
    )
    first, after = None, []
    for step in steps:
        found, summary = _diff_step(step, run_a, run_b, metrics_a, metrics_b, close, atol, rtol, checkpoints)
        if first is None and found:
            first = min(found, key=lambda d: (d.phase, d.order))
        if first is not None:
            after.append(summary)
    return RunDiff(
        name_a=str(path_a),
        name_b=str(path_b),
        config=config,
        first=first,
        after=after,
        steps_a=sorted(metrics_a),
        steps_b=sorted(metrics_b),
    )


class _Close:
    """Equality of two values under the tolerances: numbers by numpy.isclose's rule (exact when
    both are 0; NaN equals NaN), lists and dicts element by element, anything else by ==."""

    def __init__(self, atol: float, rtol: float) -> None:
        self.atol, self.rtol = atol, rtol

    def __call__(self, a: Any, b: Any) -> bool:
        if _number(a) and _number(b):
            if math.isnan(a) or math.isnan(b):
                return math.isnan(a) and math.isnan(b)
            return a == b or abs(a - b) <= self.atol + self.rtol * abs(b)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(self(x, y) for x, y in zip(a, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(self(a[k], b[k]) for k in a)
        return a == b


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _config_diff(run_a: RunDir, run_b: RunDir, close: _Close) -> list[tuple[str, Any, Any]]:
    a, b = (_config(run) for run in (run_a, run_b))
    missing = "(absent)"
    return [
        (key, a.get(key, missing), b.get(key, missing))
        for key in sorted(a.keys() | b.keys())
        if key not in IGNORED_CONFIG_KEYS and not (key in a and key in b and close(a[key], b[key]))
    ]


def _config(run: RunDir) -> dict[str, Any]:
    try:
        tree = safe_load(run.config_text)
    except yaml.YAMLError as err:
        raise GlassrlError(f"{run.path}: its config: not valid YAML: {yaml_error(err)}") from None
    if not isinstance(tree, dict):
        raise GlassrlError(f"{run.path}: its config is not a YAML mapping")
    return flatten(tree)


def _metrics_by_step(run: RunDir) -> dict[int, dict[str, Any]]:
    """{step: metrics row}; where a step was logged twice (a resumed run's redone step), the last row."""
    out = {}
    for row in run.metrics:
        out[row["step"]] = {k: v for k, v in row.items() if k != "step" and not k.startswith(IGNORED_METRICS)}
    return out


def _checkpoints(run: RunDir) -> dict[int, Path]:
    root = run.path / CHECKPOINTS
    if not root.is_dir():
        return {}
    found = {}
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit() and (p / "manifest.json").is_file():
            found[int(p.name[5:])] = p
    return found


def _diff_step(
    step: int,
    run_a: RunDir,
    run_b: RunDir,
    metrics_a: dict[int, dict[str, Any]],
    metrics_b: dict[int, dict[str, Any]],
    close: _Close,
    atol: float,
    rtol: float,
    checkpoints: bool,
) -> tuple[list[Difference], StepSummary]:
    """The differences of one step and its summary line."""
    found: list[Difference] = []
    biggest: list[tuple[float, str]] = []
    ledger = metrics = checkpoint = None
    if step in run_a.ledger_paths and step in run_b.ledger_paths:
        diffs, compared = _ledger_diff(step, run_a.ledger(step), run_b.ledger(step), close)
        found += diffs
        ledger = (len(diffs), compared)
        biggest += [(abs(d.a - d.b), d.column) for d in diffs if _number(d.a) and _number(d.b)]
    if step in metrics_a and step in metrics_b:
        diffs = _metrics_diff(step, metrics_a[step], metrics_b[step], close)
        found += diffs
        metrics = (len(diffs), len(metrics_a[step].keys() | metrics_b[step].keys()))
        biggest += [(abs(d.a - d.b), d.where) for d in diffs if _number(d.a) and _number(d.b)]
    dirs_a, dirs_b = (_checkpoints(run_a), _checkpoints(run_b)) if checkpoints else ({}, {})
    if step in dirs_a and step in dirs_b:
        tensors = compare_checkpoints(dirs_a[step], dirs_b[step], close, atol, rtol)
        found += [
            Difference(step, PHASES["update"], f"checkpoint {t.where}", "", t.a, t.b, order=(2, k))
            for k, t in enumerate(tensors)
        ]
        checkpoint = (len(tensors), max(len(tensors), tensor_count(dirs_a[step])))
        biggest += [(t.max_abs, f"checkpoint {t.where.split('[')[0]}") for t in tensors if t.max_abs is not None]
    biggest = [(gap, where) for gap, where in biggest if not math.isnan(gap)]
    top = max(biggest, default=(None, ""))
    return found, StepSummary(step, ledger, metrics, checkpoint, top[0], top[1])


def _ledger_diff(step: int, a: Ledger, b: Ledger, close: _Close) -> tuple[list[Difference], int]:
    """Differences of two ledger samples of one step, and the number of values compared."""
    found, compared = [], 0
    for name in RUN_FIELDS:
        if name != "step" and not close(getattr(a, name), getattr(b, name)):
            # after the tokens of its phase: a run field repeats a config key (beta: the KL controller's value)
            found.append(
                Difference(step, _COLUMN_PHASE[name], "ledger", name, getattr(a, name), getattr(b, name), (0, math.inf))
            )
    if len(a.responses) != len(b.responses):
        found.append(Difference(step, 1, "ledger", "responses", len(a.responses), len(b.responses), (0, -1)))
    for r, (ra, rb) in enumerate(zip(a.responses, b.responses)):
        for name in RESPONSE_FIELDS[1:]:
            x, y = getattr(ra, name), getattr(rb, name)
            compared += 1
            if not close(_plain(x), _plain(y)):
                # the prompt before the response's tokens, its other fields after them: they follow from the tokens
                at = -1 if name in ("prompt", "prompt_as_seen") else math.inf
                found.append(Difference(step, _COLUMN_PHASE[name], f"response {r}", name, x, y, (0, r, at)))
        for ta, tb in zip(ra.tokens, rb.tokens):
            for c, name in enumerate(TOKEN_FIELDS[1:]):
                x, y = getattr(ta, name), getattr(tb, name)
                compared += 1
                if not close(x, y):
                    where = f"response {r}, token {ta.index} ({ta.token!r})"
                    found.append(Difference(step, _COLUMN_PHASE[name], where, name, x, y, (0, r, ta.index, c)))
    return found, compared


def _plain(value: Any) -> Any:
    """A response field as plain data (turns are dataclasses)."""
    if isinstance(value, tuple):
        return [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]
    return value


def _metrics_diff(step: int, a: dict[str, Any], b: dict[str, Any], close: _Close) -> list[Difference]:
    missing = "(absent)"
    return [
        Difference(step, _metric_phase(key), f"metric {key}", "", x, y, (1, key))
        for key in sorted(a.keys() | b.keys())
        for x, y in [(a.get(key, missing), b.get(key, missing))]
        if not close(x, y)
    ]


def _metric_phase(key: str) -> int:
    return _METRIC_PHASE.get(key, _METRIC_PHASE.get(key.split("/")[0], PHASES["log"]))


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) and value != "(absent)" else str(value)


def _shown_pair(a: Any, b: Any) -> tuple[str, str]:
    """Two numbers with as many digits as it takes to tell them apart (at least 4 decimals' worth)."""
    if _number(a) and _number(b) and a != b:
        for digits in range(5, 18):
            x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
            if x != y:
                return x, y
    return _shown(a), _shown(b)


def _span(steps: list[int]) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}–{steps[-1]}" if steps == list(range(steps[0], steps[-1] + 1)) else ", ".join(map(str, steps))
