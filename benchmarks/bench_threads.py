"""Training steps under a competing load: 2 intra-op threads (torch's default on 2 cores) against the
count glassrl chooses (glassrl.models.threads: cores free, not cores present).

    .venv/bin/python benchmarks/bench_threads.py            # 1 busy-loop process, 6 steps, 2 pairs
    .venv/bin/python benchmarks/bench_threads.py --busy 0   # no competing load (the baseline)

The demo's training (the grpo preset, default model, 16 prompts × 8 samples, 16 new tokens; no
ledger or checkpoint) runs in a fresh process for ``--steps`` steps, once with 2 threads and once
with glassrl's choice, alternating, ``--pairs`` times, while ``--busy`` processes spin
(``while True: pass``, one core each). The competing load starts ``--settle`` seconds before the
first run: the choice reads the 1-minute load average, which needs about a minute to see it.
Printed: the threads chosen, the median step time of each (the first step left out) and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_vs_trl import SETTINGS, load_average, run, write_prompts
from glassrl.trainer.default_model import ensure_default_model

CHOICE = "glassrl's choice"


def step_seconds(result: dict) -> list[float]:
    ends = result["step_ends"]
    return [b - a for a, b in zip(ends[1:], ends[2:])]  # steps 2..N


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
    spec = {
        "model": str(ensure_default_model()),
        "prompts": str(write_prompts(work / "prompts.jsonl")),
        "steps": args.steps,
        "seed": 0,
        "device": "cpu",
        "settings": SETTINGS,
        "out_dir": str(work / "run"),
    }
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        print(f"{args.busy} busy-loop process(es) started; load average {load_average()}")
        time.sleep(args.settle if busy else 0)
        times: dict[str, list[float]] = {"2 threads": [], CHOICE: []}
        chosen = []
        for i in range(args.pairs):
            for name, threads in (("2 threads", 2), (CHOICE, 0)):
                print(f"pair {i + 1}/{args.pairs}, {name}: load average {load_average()}", flush=True)
                result = run(
                    "glassrl",
                    [sys.executable, str(Path(__file__).parent / "bench_vs_trl.py"), "--worker"],
                    {**spec, "threads": threads},
                    work,
                )
                times[name] += step_seconds(result)
                if not threads:
                    chosen.append(result["settings"]["threads"])
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    two, ours = statistics.median(times["2 threads"]), statistics.median(times[CHOICE])
    print(f"\nglassrl chose {', '.join(map(str, chosen))} thread(s) ({os.cpu_count()} cores present, {args.busy} busy)")
    print("| threads | median step s | steps timed |\n|---|---:|---:|")
    print(f"| 2 | {two:.2f} | {len(times['2 threads'])} |")
    print(f"| glassrl's choice ({', '.join(map(str, sorted(set(chosen))))}) | {ours:.2f} | {len(times[CHOICE])} |")
    print(f"\nstep time, 2 threads / glassrl's choice: {two / ours:.2f}")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
