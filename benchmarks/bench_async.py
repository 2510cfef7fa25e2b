"""Asynchronous training on Ray (issue 26): steps/s, samples/s and reward per sample seen for
``rollout.max_staleness`` k = 0, 1, 2, on the default model (GRPO, arith-verify) and on tool-add
(the default agent model, multi-turn episodes with the calculator).

    .venv/bin/python benchmarks/bench_async.py                      # both tasks, k = 0 1 2, 8 steps each
    .venv/bin/python benchmarks/bench_async.py --tasks default --steps 12 --ks 0 2

Each run: trainer.backend ray, the rollout on a rank of its own (``ray.rollout.placement: apart``,
{CPU: 1}) and the actor on another ({CPU: 1}), the reference (KL in the loss) in a third process
({CPU: 0.5}), one local Ray cluster of 3 logical CPUs for all runs (Ray's CPUs are a scheduling
count, not a pinning: on a 2-core machine the processes share the cores). k = 0 samples each
step's batch in that step (the synchronous step); k ≥ 1 has the rollout rank sample up to k
batches ahead while the actor trains (the deterministic schedule, ``rollout.partial_rollouts:
false``; no off-policy correction: the clip anchors at the policy that sampled).

Printed: per run the wall time of the steps (steps 2..N, after the pipeline has filled),
steps/s and samples (responses)/s over them, the mean wait for a batch (``perf/batch_wait_s``),
the rollout rank's idle time, and reward/mean against samples seen (first and last quarter of the
run). The load average is printed before and after: on a shared machine, treat figures as noise
beyond what its load explains.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench_vs_trl import load_average
from glassrl.builtin.default_model import ensure_default_model
from glassrl.config import load_config
from glassrl.rl.config import TrainConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

RAY = [
    "trainer.backend=ray",
    "ray.rollout.placement=apart",
    "ray.actor.resources={CPU: 1}",
    "ray.rollout.resources={CPU: 1}",
    "ray.reference.resources={CPU: 0.5}",
    "logging.ledger_every=0",
    "logging.report=false",
    "logging.eval_every=0",
    "logging.checkpoint_every=0",
    "threads=1",
]
TASKS = {
    "default": ("grpo.yaml", ["batch.prompts_per_step=16", "batch.mini_batch_prompts=16", "data.eval_size=16"]),
    "tool-add": ("tool_add.yaml", ["batch.prompts_per_step=8", "batch.mini_batch_prompts=8", "data.eval_size=8"]),
}


def run(task: str, k: int, steps: int, out: Path, model: Path) -> dict:
    """Train; the figures of the module docstring from the run's metrics.jsonl."""
    from glassrl.rl.loop import Trainer

    preset, more = TASKS[task]
    actor = [f"model.actor={model}"] if task == "default" else []
    overrides = [*RAY, *more, *actor, f"steps={steps}", f"rollout.max_staleness={k}", f"output_dir={out}"]
    trainer = Trainer(load_config(TrainConfig, EXAMPLES / preset, overrides), progress=False)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    rows = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "perf/step_s" in r]
    later = rows[1:]  # the first step fills the pipeline (and warms caches up)
    seconds = sum(r["perf/step_s"] for r in later)
    per_step = trainer.resolved.responses_per_step
    quarter = max(len(rows) // 4, 1)
    return {
        "task": task,
        "k": k,
        "wall_s": wall,
        "steps_per_s": len(later) / seconds,
        "samples_per_s": len(later) * per_step / seconds,
        "batch_wait_s": statistics.mean(r.get("perf/batch_wait_s", r["perf/generate_s"]) for r in later),
        "rollout_idle_s": statistics.mean(r.get("perf/rollout_idle_s", 0.0) for r in later),
        "staleness": statistics.mean(r.get("rollout/staleness", 0.0) for r in later),
        "reward_first": statistics.mean(r["reward/mean"] for r in rows[:quarter]),
        "reward_last": statistics.mean(r["reward/mean"] for r in rows[-quarter:]),
        "samples": len(rows) * per_step,
        "curve": [(i * per_step, r["reward/mean"]) for i, r in enumerate(rows, start=1)],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--curves", type=Path, help="write every run's (samples seen, reward/mean) here (JSON)")
    args = p.parse_args()

    from glassrl.workers.ray_cluster import connect

    model = ensure_default_model()
    connect(None, num_cpus=3, object_store_memory=200 * 2**20, log_to_driver=False)
    print(f"load average before: {load_average()}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            for k in args.ks:
                results.append(run(task, k, args.steps, Path(tmp) / f"{task}-{k}", model))
                r = results[-1]
                print(f"  {task} k={k}: {r['steps_per_s']:.3f} steps/s, load {load_average()}", flush=True)
    print(f"load average after: {load_average()}\n")
    print(
        "| task | k | steps/s | samples/s | batch wait | rollout idle | mean staleness | reward first → last quarter |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        base = next(b for b in results if b["task"] == r["task"] and b["k"] == min(args.ks))
        print(
            f"| {r['task']} | {r['k']} | {r['steps_per_s']:.3f} ({r['steps_per_s'] / base['steps_per_s']:.2f}×) "
            f"| {r['samples_per_s']:.1f} | {r['batch_wait_s']:.3f} s | {r['rollout_idle_s']:.3f} s "
            f"| {r['staleness']:.2f} | {r['reward_first']:.3f} → {r['reward_last']:.3f} ({r['samples']} samples) |"
        )
    if args.curves:
        args.curves.write_text(json.dumps({f"{r['task']} k={r['k']}": r["curve"] for r in results}, indent=1))


if __name__ == "__main__":
    main()
