"""Steps per second of the GRPO step with each of issue 14's step-level options, on the default model.

    .venv/bin/python benchmarks/bench_step.py                 # 10 timed steps per run, 3 runs per variant
    .venv/bin/python benchmarks/bench_step.py --steps 5 --runs 1 --threads 2
    python3 benchmarks/bench_step.py --device cuda --extra model.compute_dtype=float32   # on a GPU

The setting of issue 14's comparison with TRL: examples/grpo.yaml (the default model,
arith-verify, 16 prompts × 8 responses, 16 new tokens, one optimiser step per batch, k3 KL in the
loss, β = 0.001), no evaluation, no ledger, no checkpoint. Variants, each adding one option:

- baseline:      phase 3 computes log π_old with its own actor pass (the skip turned off), padded passes;
- skip:          the update's forward gives log π_old (one optimiser step: π_old = π_θ);
- padding-free:  + model.padding_free = true;
- overlap:       + rollout.overlap = true (the next batch sampled in a thread during the update);
- shared-prefix: skip + model.shared_prefix = true (packed, each distinct prompt once per chunk; the
                 default on CPU since it became one pass).

Each run builds a Trainer, runs 2 warm-up steps, then times ``--steps`` steps: wall seconds per
step (steps/s = 1 / that) and CPU seconds of the process per step (all threads; the work done).
Runs of the variants are interleaved so that a change in the machine's load spreads over all.
Medians over ``--runs``. The load average is printed before and after; on a shared machine the
wall times move with it, the CPU times much less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console

from glassrl.config import load_config
from glassrl.rl.config import TrainConfig
from glassrl.rl.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "baseline": ["model.shared_prefix=false"],
    "skip": ["model.shared_prefix=false"],
    "padding-free": ["model.padding_free=true", "model.shared_prefix=false"],
    "overlap": ["model.padding_free=true", "model.shared_prefix=false", "rollout.overlap=true"],
    "shared-prefix": ["model.shared_prefix=true"],
}
SETTING = [
    "steps=1000",  # more than are run: no last-step evaluation or checkpoint
    "data.eval_size=0",
    "logging.ledger_every=0",
    "logging.checkpoint_every=0",
    "logging.report=false",
]


def run(variant: str, steps: int, out: Path, extra: list[str]) -> tuple[float, float, dict[str, float]]:
    """(wall s per step, CPU s per step, mean perf/ metrics) of ``steps`` timed steps."""
    overrides = [*SETTING, *VARIANTS[variant], *extra, f"output_dir={out}"]
    cfg = load_config(TrainConfig, ROOT / "examples" / "grpo.yaml", overrides)
    trainer = Trainer(cfg, console=Console(quiet=True), progress=False)
    try:
        trainer.old_logprobs_from_update = variant != "baseline" and trainer.old_logprobs_from_update
        for _ in range(2):
            trainer.step()
        wall, cpu = time.perf_counter(), time.process_time()
        perf: dict[str, list[float]] = {}
        for _ in range(steps):
            for key, value in trainer.step().items():
                if key.startswith("perf/") and key.endswith("_s"):
                    perf.setdefault(key, []).append(value)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        trainer.close()
    return wall / steps, cpu / steps, {k: statistics.mean(v) for k, v in perf.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per variant (interleaved)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (torch.set_num_threads)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--device", default="cpu", help="model.device of every run (cpu, cuda)")
    parser.add_argument("--extra", nargs="*", default=[], help="more config overrides, KEY=VALUE, for every variant")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; threads {args.threads}; "
        f"{args.steps} steps × {args.runs} runs; cores {os.cpu_count()}"
    )
    results: dict[str, list] = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.runs):
            for variant in args.variants:
                extra = [f"model.device={args.device}", *args.extra]
                results[variant].append(run(variant, args.steps, Path(tmp) / f"{variant}-{r}", extra))
    phases = ["generate", "score", "logprobs", "rewards", "advantages", "update"]
    print(
        f"{'variant':13} {'steps/s':>8} {'wall s/step':>12} {'cpu s/step':>11} " + " ".join(f"{p:>10}" for p in phases)
    )
    base = statistics.median(w for w, _, _ in results[args.variants[0]])
    for variant, runs in results.items():
        wall = statistics.median(w for w, _, _ in runs)
        cpu = statistics.median(c for _, c, _ in runs)
        perf = {p: statistics.median(m.get(f"perf/{p}_s", float("nan")) for _, _, m in runs) for p in phases}
        print(
            f"{variant:13} {1 / wall:8.3f} {wall:12.3f} {cpu:11.3f} "
            + " ".join(f"{perf[p]:10.3f}" for p in phases)
            + f"   ×{base / wall:.2f}"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
