"""The two real cases of docs/debugging.md's `glassrl explain --mismatch` section, run again:

1. ``async``: 4 GRPO steps on the Ray backend, the rollout rank apart, ``rollout.max_staleness: 1``
   (each batch sampled by the version before the one that scores it);
2. ``bf16``: 3 synchronous GRPO steps on the local backend with ``model.compute_dtype: bfloat16``.

Both keep every checkpoint and the whole batch in the ledger, log μ included, then print
``glassrl explain --mismatch`` of step 2 (async) and step 3 (bf16).

    python benchmarks/mismatch_cases.py MODEL_DIR TRAIN.jsonl TEST.jsonl OUT_DIR

The docs' figures come from the tests' tiny model (tests/conftest.py, ``tiny_model_dir``) and 8
arith-verify prompts each (``write_prompts``); a local Ray cluster of 2 CPUs is started here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from glassrl import cli
from glassrl.config import load_config
from glassrl.rl.config import TrainConfig
from glassrl.rl.loop import Trainer
from glassrl.workers.ray_cluster import connect

GRPO = Path(__file__).resolve().parents[1] / "examples" / "grpo.yaml"


def common(model: str, train: str, test: str, out: Path) -> list[str]:
    return [
        f"model.actor={model}",
        f"data.train={train}",
        f"data.test={test}",
        "data.eval_size=8",
        f"output_dir={out}",
        "rollout.n=4",
        "rollout.max_new_tokens=16",
        "batch.prompts_per_step=4",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=4",
        "logging.ledger_every=1",
        "logging.checkpoint_every=1",
        "logging.keep_checkpoints=5",
        "logging.ledger_samples=16",
        "logging.report=false",
        "rollout.sampling_logprobs=true",
    ]


def main(model: str, train: str, test: str, out: str) -> None:
    root = Path(out)
    asynchronous = [
        *common(model, train, test, root / "async"),
        "steps=4",
        "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]",
        "actor_optim.lr=0.01",
        "actor_optim.warmup_steps=0",
        "trainer.backend=ray",
        "ray.actor.resources={CPU: 0.25}",
        "ray.reference.resources={CPU: 0.25}",
        "ray.rollout.placement=apart",
        "ray.rollout.resources={CPU: 0.25}",
        "rollout.max_staleness=1",
    ]
    connect(None, num_cpus=2, object_store_memory=100 * 2**20, log_to_driver=False)
    Trainer(load_config(TrainConfig, GRPO, asynchronous), progress=False).train()
    bf16 = [*common(model, train, test, root / "bf16"), "steps=3", "model.compute_dtype=bfloat16"]
    Trainer(load_config(TrainConfig, GRPO, bf16), progress=False).train()
    for run, step in (("async", "2"), ("bf16", "3")):
        print(f"$ glassrl explain --mismatch {run} --step {step}")
        cli.main(["explain", "--mismatch", str(root / run), "--step", step])


if __name__ == "__main__":
    main(*sys.argv[1:5])
