"""The sync truth check's cost against a training step, measured in one run (issue 41; goal: < 2 %).

    .venv/bin/python benchmarks/bench_sync_truth.py              # the default model, 5 timed steps, 5 syncs each
    .venv/bin/python benchmarks/bench_sync_truth.py --steps 3 --syncs 3 --extra model.actor=/path/to/model

1. A step: examples/grpo.yaml (the default model, arith-verify, 16 prompts × 8 responses, 16 new
   tokens), no evaluation, ledger or checkpoint; 1 warm-up step, then ``--steps`` timed: the median
   wall seconds of a step.
2. The sync of that trained actor's weights to a copy (glassrl.workers.weight_sync, what a Ray rollout
   rank placed apart receives; sender and receiver in two threads of this process over gloo), three
   ways, interleaved, ``--syncs`` times each: without the check, with the checksums (``check.sync``),
   and with the checksums and the probe. The check's cost per step = (checksums − none) + (probe −
   checksums) / ``check.sync_probe_every`` (default 10); printed beside the step's time as a ratio.

Both sides run on the same cores here; on Ray each runs in its own process, so the cost each side adds
to the step is about half of what is printed (the sender's part delays the update, the receiver's the
sampling). The load average is printed: on a shared machine the figures move with it; the ratio is
taken within one run.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
from rich.console import Console

from glassrl.config import load_config
from glassrl.rl.config import TrainConfig
from glassrl.rl.config_check import CheckConfig
from glassrl.rl.loop import Trainer
from glassrl.workers.data_parallel import free_port
from glassrl.workers.sync_truth import Checker
from glassrl.workers.weight_sync import ModuleSink, WeightReceiver, WeightSender

ROOT = Path(__file__).resolve().parents[1]
SETTING = ["steps=1000", "data.eval_size=0", "logging.ledger_every=0", "logging.checkpoint_every=0"]
MODES = ("none", "checksums", "probe")


def step_seconds(steps: int, out: Path, extra: list[str]) -> tuple[float, torch.nn.Module]:
    """The median wall seconds of ``steps`` GRPO steps (after one warm-up), and the trained actor."""
    cfg = load_config(TrainConfig, ROOT / "examples" / "grpo.yaml", [*SETTING, *extra, f"output_dir={out}"])
    trainer = Trainer(cfg, console=Console(quiet=True), progress=False)
    try:
        trainer.step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            trainer.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times), trainer.workers.actor.model
    finally:
        trainer.close()


def sync_seconds(actor: torch.nn.Module, copy_model: torch.nn.Module, syncs: int) -> dict[str, float]:
    """Median seconds of one sync (send and receive, checked or not), per mode of MODES, interleaved."""
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    sides = {}
    for check in (False, True):
        port = free_port()
        sender = WeightSender(actor, is_main=True, check=check)
        checker = Checker(copy_model, "copy") if check else None
        receiver = WeightReceiver(ModuleSink(copy_model), checker)
        joined = threading.Thread(target=receiver.join, args=("127.0.0.1", port, 1, 2))
        joined.start()
        sender.join("127.0.0.1", port, 2)
        joined.join()
        sides[check] = (sender, receiver)
    for _ in range(syncs + 1):  # the first round warms up
        for mode in MODES:
            sender, receiver = sides[mode != "none"]
            thread = threading.Thread(target=receiver.receive_checked)
            start = time.perf_counter()
            thread.start()
            sender.send(0, probe=mode == "probe")
            thread.join()
            times[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(t[1:]) for mode, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed training steps")
    parser.add_argument("--syncs", type=int, default=5, help="timed syncs per mode")
    parser.add_argument("--extra", nargs="*", default=[], help="config overrides, KEY=VALUE")
    args = parser.parse_args()
    every = CheckConfig().sync_probe_every
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cores {os.cpu_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        step, actor = step_seconds(args.steps, Path(tmp) / "run", args.extra)
    params = sum(p.numel() for p in actor.parameters())
    seconds = sync_seconds(actor, copy.deepcopy(actor), args.syncs)
    checksums = seconds["checksums"] - seconds["none"]
    probe = seconds["probe"] - seconds["checksums"]
    per_step = checksums + probe / every
    print(f"model: {params / 1e6:.2f} M parameters, {len(list(actor.parameters()))} tensors")
    print(f"step (GRPO, median of {args.steps}): {step:.3f} s")
    print(
        f"sync: {seconds['none'] * 1e3:.1f} ms unchecked, {seconds['checksums'] * 1e3:.1f} ms with checksums, "
        f"{seconds['probe'] * 1e3:.1f} ms with checksums and the probe (medians of {args.syncs})"
    )
    print(
        f"check per step: checksums {checksums * 1e3:.1f} ms + probe {probe * 1e3:.1f} ms / {every} = "
        f"{per_step * 1e3:.1f} ms = {per_step / step:.2%} of a step (probe every step: "
        f"{(checksums + probe) / step:.2%})"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
