"""``glassrl train --profile``: where a training step's time goes.

Two views of the same run:

- the per-phase table: the wall time of each phase (``perf/<phase>_s``, recorded by every step's
  PhaseTimer, glassrl.rl.metrics) summed over the run's steps, its share of the step time
  (``perf/step_s``), and the profiled step's own times; printed at the end of the run;
- a torch.profiler trace of one step (every operator with its CPU time and, on a GPU, its CUDA
  kernels), written as Chrome trace JSON to ``output_dir/profile/step_XXXXXX.trace.json``: open
  it in https://ui.perfetto.dev or chrome://tracing. The phases appear in it as ranges named
  ``phase/<name>`` (PhaseTimer marks them with torch.profiler.record_function).

The profiled step is the run's second (its first when it trains one step only): the first pays
one-time costs (lazy initialisation, the allocator growing) that no later step pays.

The profiler wraps ``Trainer.step`` from outside (:meth:`StepProfiler.wrap`), so the step code
carries no profiling code of its own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from rich.table import Table

# The phases of a step in the order they run (Trainer.step); any other timed phase follows.
PHASES = ("generate", "score", "logprobs", "rewards", "advantages", "update")


class StepProfiler:
    """Profiles step ``at`` and sums every step's phase times; ``start`` is the number of the first
    step it sees (a resumed run starts past 1).

        profiler = StepProfiler(run_dir, at=2)
        trainer.step = profiler.wrap(trainer.step)
        trainer.train()
        console.print(profiler.table())
    """

    def __init__(self, out_dir: Path, at: int, start: int = 1) -> None:
        self.out_dir, self.at, self.start = Path(out_dir), at, start
        self.totals: dict[str, float] = defaultdict(float)  # phase -> seconds over the steps seen
        self.steps = 0  # steps seen
        self.profiled: dict[str, float] | None = None  # the profiled step's perf/ metrics
        self.trace: Path | None = None

    def wrap(self, step: Callable[[], dict[str, float]]) -> Callable[[], dict[str, float]]:
        """``step`` (Trainer.step) recording its phase times, under the profiler at step ``at``."""

        def profiled_step() -> dict[str, float]:
            self.steps += 1
            number = self.start + self.steps - 1
            if number != self.at:
                metrics = step()
            else:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                with torch.profiler.profile(activities=activities) as prof:
                    metrics = step()
                self.profiled = {k: v for k, v in metrics.items() if k.startswith("perf/")}
                self.trace = self.out_dir / "profile" / f"step_{number:06d}.trace.json"
                self.trace.parent.mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(str(self.trace))
            for key, value in metrics.items():
                if key.startswith("perf/") and key.endswith("_s") and not key.endswith("_per_s"):  # seconds
                    self.totals[key.removeprefix("perf/").removesuffix("_s")] += value
            return metrics

        return profiled_step

    def table(self) -> Table:
        """Per phase: seconds over the run, share of the step time, mean per step, the profiled step's seconds."""
        step_total = self.totals.get("step", math.nan)
        profiled_step = (self.profiled or {}).get("perf/step_s", math.nan)
        names = [p for p in PHASES if p in self.totals] + sorted(set(self.totals) - {*PHASES, "step"})
        table = Table(title=f"glassrl train --profile: time per phase, {self.steps} steps", title_justify="left")
        for column in ("phase", "seconds", "share of step", "mean per step", f"step {self.at}"):
            table.add_column(column, justify="left" if column == "phase" else "right")
        rows = [(name, self.totals[name], (self.profiled or {}).get(f"perf/{name}_s", math.nan)) for name in names]
        rows.append(("other", step_total - sum(t for _, t, _ in rows), profiled_step - sum(p for _, _, p in rows)))
        rows.append(("step", step_total, profiled_step))
        for name, total, profiled in rows:
            share = total / step_total if step_total > 0 else math.nan
            table.add_row(name, f"{total:.3f}", f"{share:.1%}", f"{total / max(self.steps, 1):.3f}", f"{profiled:.3f}")
        return table
