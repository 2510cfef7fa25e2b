"""Training steps under a competing load: ``threads: auto`` (glassrl.models.threads: the cores free,
not the cores present) against ``threads: 2``, torch's default on this 2-core machine.

    .venv/bin/python benchmarks/bench_threads.py            # 1 busy-loop process, 6 steps, 2 pairs
    .venv/bin/python benchmarks/bench_threads.py --busy 0   # no competing load (the baseline)

``glassrl train grpo`` (the demo's training: the grpo preset, default model, 16 prompts × 8
samples, 16 new tokens; no evaluation, ledger or report) runs in a fresh process for ``--steps``
steps, once with ``threads=2`` and once with ``threads=auto``, alternating, ``--pairs`` times,
while ``--busy`` processes spin (``while True: pass``, one core each). GLASSRL_THREADS and
OMP_NUM_THREADS are left out of the runs' environment, so that auto reads the load. The load
starts ``--settle`` seconds before the first run: auto reads the 1-minute load average, which
needs about a minute to see it.

Printed per run: the count and why, as the run recorded them (its environment.json), the load
average before it, and its ``perf/step_s``; then the median step time of each setting (the
first step of each run left out) and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from glassrl.builtin.default_model import ensure_default_model

SETTINGS = ("2", "auto")
OVERRIDES = ["data.eval_size=0", "logging.ledger_every=0", "logging.report=false", "logging.checkpoint_every=0"]


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def train(threads: str, steps: int, out: Path) -> tuple[list[float], int, str]:
    """One ``glassrl train grpo threads=THREADS`` in a fresh process: its step times (the first
    left out), and the thread count it ran with and why (environment.json)."""
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("GLASSRL_THREADS", "OMP_NUM_THREADS")}
    env |= {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = [sys.executable, "-m", "glassrl.cli", "train", "grpo", f"threads={threads}", f"steps={steps}"]
    command += [f"output_dir={out}", *OVERRIDES]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"$ {' '.join(command)}\nexit {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    environment = json.loads((out / "environment.json").read_text(encoding="utf-8"))
    return (
        [r["perf/step_s"] for r in rows if "perf/step_s" in r][1:],
        environment["threads"],
        environment["threads_why"],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--busy", type=int, default=1, help="busy-loop processes competing (one core each)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--settle", type=float, default=60.0, help="seconds between starting the load and the first run")
    p.add_argument("--out", default=str(Path.home() / ".cache" / "glassrl" / "bench-threads"))
    args = p.parse_args()
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}")
    ensure_default_model()  # built once, outside the timed runs
    print(f"{len(os.sched_getaffinity(0))} usable cores; load average before the busy loop: {load_average()}")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    chosen: dict[str, list[int]] = {s: [] for s in SETTINGS}
    try:
        time.sleep(args.settle if busy else 0)
        for i in range(args.pairs):
            for setting in SETTINGS:
                before = load_average()
                steps, count, why = train(setting, args.steps, work / f"run-{setting}")
                times[setting] += steps
                chosen[setting].append(count)
                print(f"pair {i + 1}/{args.pairs}, threads={setting}: load average {before} before", flush=True)
                print(f"  threads: {count} ({why}); step s: {', '.join(f'{s:.2f}' for s in steps)}", flush=True)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    print(f"\n{args.busy} busy-loop process(es); load average at the end: {load_average()}")
    print("| threads | count used | median step s | steps timed |\n|---|---|---:|---:|")
    for setting in SETTINGS:
        counts = ", ".join(map(str, chosen[setting]))
        print(f"| {setting} | {counts} | {statistics.median(times[setting]):.2f} | {len(times[setting])} |")
    ratio = statistics.median(times["2"]) / statistics.median(times["auto"])
    print(f"\nstep time, threads=2 / threads=auto: {ratio:.2f}")


if __name__ == "__main__":
    main()
