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
score and everything after it). After the first divergence each step gets a line of counts
(:class:`StepSummary`): how it grows.

Every step either run logged is compared, not only those both did: a part (a metrics row, a ledger,
a checkpoint, a file inside one) present in one run and missing in the other is a difference
(phase 7, where the trainer writes them); a part that cannot be read (a FIFO, a link loop, no
permission, a truncated or garbled file) is a GlassrlError naming it (exit 2), never a part left
out. The last line says how much of each run was compared.

Measurements of the machine (:data:`MEASURED`: wall-clock seconds) are not outcomes of the run: two
runs equal to the bit differ in them. They are left out of the verdict and counted apart.

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
from glassrl.report.run_dir import RunDir, read_run, reading, regular_file

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
# Measurements of the machine, not outcomes of the run (issue 45 item 2): every field of a run's
# metrics and ledgers that times, or names the machine, found by name (seconds, _s, time, duration,
# host, pid) and classified here once. Left out of the verdict, shown apart:
#   perf/…                          metrics.jsonl: each phase's wall time and tokens per second
#                                   (glassrl.rl.metrics.PhaseTimer, perf/step_s, the Ray ranks' waits)
#   turns[].tool_calls[].seconds    a ledger's tool calls: each call's wall time (glassrl.agents.tools)
# Not read by diff at all: environment.json (hostname, cpu_count, versions) and a checkpoint's
# manifest.json (the save's time; its files are compared).
MEASURED = {"perf/…": "perf/", "tool-call seconds": "seconds"}
MEASURED_METRICS = MEASURED["perf/…"]  # a metric key prefix
MEASURED_TOOL_CALL = MEASURED["tool-call seconds"]  # a key of a tool call record
CHECKPOINTS = "checkpoints"
PARTS = ("metrics row", "ledger", "checkpoint")  # what a step may have, in the order a difference names them


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
    differing / compared), the parts one run has and the other not, and the largest |a − b| among
    them with where it is."""

    step: int
    ledger: tuple[int, int] | None  # None: a side has no ledger for the step
    metrics: tuple[int, int] | None
    checkpoint: tuple[int, int] | None
    max_abs: float | None
    max_where: str
    only: tuple[str, ...] = ()  # "ledger only in runs/a"

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
        parts += self.only
        if self.max_abs is not None:
            parts.append(f"max |Δ| {self.max_abs:.3g} ({self.max_where})")
        return f"step {self.step}: " + ", ".join(parts)


@dataclass(frozen=True)
class Tally:
    """What was read of one run: its steps, metric rows, ledgers, checkpoints and their tensors."""

    steps: list[int]
    metric_rows: int
    ledgers: int
    checkpoints: int | None  # None: checkpoints not read
    tensors: int

    def words(self) -> str:
        parts = [f"{self.metric_rows} metric rows", f"{self.ledgers} ledgers"]
        if self.checkpoints is not None:
            parts.append(f"{self.checkpoints} checkpoints ({self.tensors} tensors)")
        return f"steps {_span(self.steps)}: " + ", ".join(parts)


@dataclass(frozen=True)
class RunDiff:
    """What :func:`diff_runs` finds: config keys that differ ((key, a, b)), the first divergence, a
    summary per step from it on, each run's steps, what was read of each run, and the measurements
    of the machine left out of the verdict ({kind: (values compared, values that differ)})."""

    name_a: str
    name_b: str
    config: list[tuple[str, Any, Any]]
    first: Difference | None
    after: list[StepSummary]
    steps_a: list[int]
    steps_b: list[int]
    tally_a: Tally | None = None
    tally_b: Tally | None = None
    measured: dict[str, tuple[int, int]] = field(default_factory=dict)

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
            out.append("no difference in metrics, ledgers or checkpoints")
        if self.steps_a != self.steps_b:
            out.append(
                f"{self.name_a} logged steps {_span(self.steps_a)}; {self.name_b} logged steps {_span(self.steps_b)}"
            )
        if self.tally_a is not None and self.tally_b is not None:
            out.append(f"compared {self.name_a} ({self.tally_a.words()}) with {self.name_b} ({self.tally_b.words()})")
        if any(n for n, _ in self.measured.values()):
            kinds = ", ".join(f"{kind} {d}/{n} differ" for kind, (n, d) in self.measured.items() if n)
            out.append(f"not compared, measurements of the machine: {kinds}")
        return out


def diff_runs(
    path_a: str | Path, path_b: str | Path, atol: float = 0.0, rtol: float = 0.0, checkpoints: bool = True
) -> RunDiff:
    """Compare two run directories (module docstring); GlassrlError when one is not a run or a part
    of one cannot be read. Without ``checkpoints`` the checkpoints are not read (the report's view: a
    model's weights can be large)."""
    if not (math.isfinite(atol) and math.isfinite(rtol) and atol >= 0 and rtol >= 0):
        raise GlassrlError(f"--atol/--rtol: expected finite numbers >= 0, got {atol} and {rtol}")
    run_a, run_b = read_run(path_a, str(path_a)), read_run(path_b, str(path_b))
    close = _Close(atol, rtol)
    config = _config_diff(run_a, run_b, close)
    measured = {kind: [0, 0] for kind in MEASURED}
    metrics_a, metrics_b = _metrics_by_step(run_a), _metrics_by_step(run_b)
    dirs_a, dirs_b = (_checkpoints(run_a), _checkpoints(run_b)) if checkpoints else ({}, {})
    sides = (
        (metrics_a, metrics_b),
        (run_a.ledger_paths, run_b.ledger_paths),
        (dirs_a, dirs_b),
    )
    steps = sorted(set().union(*(a.keys() | b.keys() for a, b in sides)))
    first, after, tensors = None, [], [0, 0]
    for step in steps:
        found, summary = _diff_step(step, run_a, run_b, sides, close, atol, rtol, measured, tensors)
        if first is None and found:
            first = min(found, key=lambda d: (d.phase, d.order))
        if first is not None:
            after.append(summary)
    tallies = [
        Tally(
            steps=sorted(set().union(*(part[k].keys() for part in sides))),
            metric_rows=len(sides[0][k]),
            ledgers=len(sides[1][k]),
            checkpoints=len(sides[2][k]) if checkpoints else None,
            tensors=tensors[k],
        )
        for k in (0, 1)
    ]
    return RunDiff(
        name_a=str(path_a),
        name_b=str(path_b),
        config=config,
        first=first,
        after=after,
        steps_a=sorted(metrics_a),
        steps_b=sorted(metrics_b),
        tally_a=tallies[0],
        tally_b=tallies[1],
        measured={kind: (n, d) for kind, (n, d) in measured.items()},
    )


class _Close:
    """Equality of two values under the tolerances: numbers by numpy.isclose's rule (exact when
    both are 0; NaN equals NaN), lists and dicts element by element, anything else by ==."""

    def __init__(self, atol: float, rtol: float) -> None:
        self.atol, self.rtol = atol, rtol

    def __call__(self, a: Any, b: Any) -> bool:
        if _number(a) and _number(b):
            if a == b:
                return True
            a, b = float(a), float(b)  # the readers refuse integers beyond a float's range
            if math.isnan(a) or math.isnan(b):
                return math.isnan(a) and math.isnan(b)
            return abs(a - b) <= self.atol + self.rtol * abs(b)
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
    except yaml.YAMLError as err:  # a tag (!!python/object), a syntax error, nesting past the bound
        raise GlassrlError(f"{run.path}: its config is not valid YAML: {yaml_error(err)}") from None
    if not isinstance(tree, dict):
        raise GlassrlError(f"{run.path}: its config is not a YAML mapping")
    return flatten(tree)


def _metrics_by_step(run: RunDir) -> dict[int, dict[str, Any]]:
    """{step: metrics row}; where a step was logged twice (a resumed run's redone step), the last row."""
    return {row["step"]: {k: v for k, v in row.items() if k != "step"} for row in run.metrics}


def _checkpoints(run: RunDir) -> dict[int, Path]:
    """{step: checkpoint directory}: each ``step_XXXXXXXX`` under checkpoints/ (glassrl.run.checkpoint;
    ``tmp-*`` saves in progress and ``latest`` aside). One that is not a directory, or has no
    manifest (a checkpoint is renamed into place only once complete), is a GlassrlError."""
    root = run.path / CHECKPOINTS
    if not regular_file(root, directory=True):
        return {}
    found = {}
    with reading(root):
        entries = sorted(root.iterdir())
    for p in entries:
        if p.name.startswith("step_") and p.name[5:].isdigit():
            regular_file(p, directory=True)
            if not regular_file(p / "manifest.json"):
                raise GlassrlError(f"{p}: a checkpoint without its manifest.json (incomplete or damaged)")
            found[int(p.name[5:])] = p
    return found


def _diff_step(
    step: int,
    run_a: RunDir,
    run_b: RunDir,
    sides: tuple[tuple[dict[int, Any], dict[int, Any]], ...],
    close: _Close,
    atol: float,
    rtol: float,
    measured: dict[str, list[int]],
    tensors: list[int],
) -> tuple[list[Difference], StepSummary]:
    """The differences of one step and its summary line; ``measured`` and ``tensors`` (per run)
    count on."""
    found: list[Difference] = []
    biggest: list[tuple[float, str]] = []
    ledger = metrics = checkpoint = None
    only = []
    for k, (part, (a, b)) in enumerate(zip(PARTS, sides)):
        if (step in a) != (step in b):
            name = run_a.name if step in a else run_b.name
            where = " ".join(filter(None, (part, _relative(a.get(step) or b.get(step), run_a if step in a else run_b))))
            x, y = ("present", "missing") if step in a else ("missing", "present")
            found.append(Difference(step, PHASES["log"], where, "", x, y, order=(3, k)))
            only.append(f"{part} only in {name}")
    (metrics_a, metrics_b), _, (dirs_a, dirs_b) = sides
    if step in run_a.ledger_paths and step in run_b.ledger_paths:
        diffs, compared = _ledger_diff(step, run_a.ledger(step), run_b.ledger(step), close, measured)
        found += diffs
        ledger = (len(diffs), compared)
        biggest += [(abs(d.a - d.b), d.column) for d in diffs if _number(d.a) and _number(d.b)]
    if step in metrics_a and step in metrics_b:
        diffs, compared = _metrics_diff(step, metrics_a[step], metrics_b[step], close, measured)
        found += diffs
        metrics = (len(diffs), compared)
        biggest += [(abs(d.a - d.b), d.where) for d in diffs if _number(d.a) and _number(d.b)]
    for k, dirs in enumerate((dirs_a, dirs_b)):
        if step in dirs:
            tensors[k] += tensor_count(dirs[step])
    if step in dirs_a and step in dirs_b:
        differ = compare_checkpoints(dirs_a[step], dirs_b[step], close, atol, rtol)
        found += [
            Difference(step, PHASES["update"], f"checkpoint {t.where}", "", t.a, t.b, order=(2, k))
            for k, t in enumerate(differ)
        ]
        checkpoint = (len(differ), max(len(differ), tensor_count(dirs_a[step])))
        biggest += [(t.max_abs, f"checkpoint {t.where.split('[')[0]}") for t in differ if t.max_abs is not None]
    biggest = [(gap, where) for gap, where in biggest if not math.isnan(gap)]
    top = max(biggest, default=(None, ""))
    return found, StepSummary(step, ledger, metrics, checkpoint, top[0], top[1], tuple(only))


def _relative(path: Path, run: RunDir) -> str:
    """A part's path inside its run (a metrics row has none: "step N" says it)."""
    return path.relative_to(run.path).as_posix() if isinstance(path, Path) else ""


def _ledger_diff(
    step: int, a: Ledger, b: Ledger, close: _Close, measured: dict[str, list[int]]
) -> tuple[list[Difference], int]:
    """Differences of two ledger samples of one step, and the number of values compared (tool-call
    seconds counted in ``measured`` instead)."""
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
            if name == "turns":
                x, y = _without_measurements(x, y, close, measured)
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


def _without_measurements(x: Any, y: Any, close: _Close, measured: dict[str, list[int]]) -> tuple[Any, Any]:
    """Two responses' turns without their tool calls' seconds; those counted in ``measured``
    (compared, differing) where both sides have the call."""
    seconds = ([], [])
    out = []
    for k, turns in enumerate((x, y)):
        if not turns:
            out.append(turns)
            continue
        plain = _plain(turns)
        for turn in plain:
            calls = turn.get("tool_calls", ())
            seconds[k].append([call.get(MEASURED_TOOL_CALL) for call in calls])
            turn["tool_calls"] = [{n: v for n, v in call.items() if n != MEASURED_TOOL_CALL} for call in calls]
        out.append(plain)
    counts = measured["tool-call seconds"]
    for ta, tb in zip(*seconds):
        for sa, sb in zip(ta, tb):
            counts[0] += 1
            counts[1] += not close(sa, sb)
    return out[0], out[1]


def _plain(value: Any) -> Any:
    """A response field as plain data (turns are dataclasses)."""
    if isinstance(value, tuple):
        return [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]
    return value


def _metrics_diff(
    step: int, a: dict[str, Any], b: dict[str, Any], close: _Close, measured: dict[str, list[int]]
) -> tuple[list[Difference], int]:
    """Differences of two metrics rows and the number compared; the perf/… keys counted in ``measured``."""
    missing = "(absent)"
    found, compared = [], 0
    for key in sorted(a.keys() | b.keys()):
        x, y = a.get(key, missing), b.get(key, missing)
        if key.startswith(MEASURED_METRICS):
            measured["perf/…"][0] += 1
            measured["perf/…"][1] += not close(x, y)
            continue
        compared += 1
        if not close(x, y):
            found.append(Difference(step, _metric_phase(key), f"metric {key}", "", x, y, (1, key)))
    return found, compared


def _metric_phase(key: str) -> int:
    return _METRIC_PHASE.get(key, _METRIC_PHASE.get(key.split("/")[0], PHASES["log"]))


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) and value not in ("(absent)", "present", "missing") else str(value)


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
