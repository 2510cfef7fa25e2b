"""Step time of the same GRPO run in process and through Ray on 1 and 2 CPU workers.

    .venv/bin/python benchmarks/bench_ray.py                 # 5 steps each, median of steps 2..5
    .venv/bin/python benchmarks/bench_ray.py --steps 8 --prompts 32

The grpo preset on the default model (``glassrl init-model``), ``--prompts`` prompts × 8
samples per step, 16 new tokens, one mini-batch per step, no ledger; the KL is in the loss, so
a reference runs too. Three runs, one after the other in this process:

- ``in-process``: trainer.backend local, torch on 1 intra-op thread (what one Ray worker with
  1 CPU gets: Ray sets OMP_NUM_THREADS to a worker's CPUs);
- ``ray, 1 actor rank``: trainer.backend ray, the actor on 1 rank ({CPU: 1}), which samples;
- ``ray, 2 actor ranks``: 2 DDP ranks ({CPU: 1} each); both sample (their own RNGs), each
  computes the log-probs of half the rows and half of every mini-batch.

The reference is its own 1-rank group ({CPU: 0.5}); the reward is scored in the driver. A local
Ray cluster with 3 logical CPUs is started (on a 2-core machine: the roles never compute at the
same time, the trainer's phases run one after another). Printed per run: the median step
seconds (``perf/step_s``, steps 2..N), responses per second, and the ratios: Ray's overhead
(1 rank / in-process) and the scaling (2 ranks / 1 rank). The load average is printed: on a
shared machine, treat figures as noise beyond what its load explains.
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


def run(name: str, overrides: list[str], out: Path) -> dict:
    """Train; {name, build_s, median_step_s, responses_per_s} from the run's metrics.jsonl."""
    from glassrl.rl.loop import Trainer

    start = time.perf_counter()
    trainer = Trainer(
        load_config(TrainConfig, EXAMPLES / "grpo.yaml", [*overrides, f"output_dir={out}"]), progress=False
    )
    built = time.perf_counter() - start
    trainer.train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["perf/step_s"] for r in rows if "perf/step_s" in r][1:]  # the first step warms caches up
    median = statistics.median(steps)
    responses = trainer.resolved.responses_per_step
    return {"name": name, "build_s": built, "median_step_s": median, "responses_per_s": responses / median}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (× 8 samples)")
    args = p.parse_args()

    from glassrl.workers.ray_cluster import connect

    model = ensure_default_model()
    common = [
        f"model.actor={model}",
        f"steps={args.steps}",
        f"batch.prompts_per_step={args.prompts}",
        f"batch.mini_batch_prompts={args.prompts}",
        "batch.micro_batch_responses=32",
        "rollout.n=8",
        "rollout.max_new_tokens=16",
        "logging.ledger_every=0",
        "logging.report=false",
        "data.eval_size=16",
        "threads=1",  # the driver (and the in-process trainer): what one Ray worker with 1 CPU gets
        "model.shared_prefix=false",  # the passes Ray runs (shared prefix is not wired into Ray): same work
    ]
    ray = [
        "trainer.backend=ray",
        "ray.actor.resources={CPU: 1}",
        "ray.reference.resources={CPU: 0.5}",
    ]
    print(f"load average before: {load_average()}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        results.append(run("in-process", common, Path(tmp) / "local"))
        connect(None, num_cpus=3, object_store_memory=200 * 2**20, log_to_driver=False)
        results.append(run("ray, 1 actor rank", [*common, *ray, "ray.actor.world_size=1"], Path(tmp) / "ray1"))
        results.append(run("ray, 2 actor ranks", [*common, *ray, "ray.actor.world_size=2"], Path(tmp) / "ray2"))
    print(f"load average after: {load_average()}")
    print(f"{'run':<20} {'start s':>8} {'step s (median)':>16} {'responses/s':>12}")
    for r in results:
        print(f"{r['name']:<20} {r['build_s']:>8.1f} {r['median_step_s']:>16.3f} {r['responses_per_s']:>12.1f}")
    local, one, two = (r["median_step_s"] for r in results)
    print(f"Ray overhead, 1 rank / in-process: {one / local:.2f}×")
    print(f"scaling, 2 ranks / 1 rank: step time {two / one:.2f}×, throughput {one / two:.2f}×")


if __name__ == "__main__":
    main()
