"""AdamW's step on CPU: torch's one-tensor-at-a-time kernel against its fused one (``OptimConfig.kernel``
single / fused; kernel auto picks fused from glassrl.optim.FUSED_ON_CPU_FROM), issue 40.

    .venv/bin/python benchmarks/bench_adamw.py                     # Qwen2.5-0.5B's shapes, then 2 layers of them
    .venv/bin/python benchmarks/bench_adamw.py --layers 2 --rounds 5

The parameters are Qwen2.5-0.5B's shapes (vocabulary 151,936, width 896, 24 layers, MLP 4,864, 2 key-value
heads of 64, tied embeddings: 494 M float32 values, 1.98 GB), random, built in this process: no model file.
Each has a random gradient. The optimiser is glassrl's own (glassrl.optim.make_optimizer: AdamW, betas 0.9/0.95,
weight decay on matrices), with malloc set as ``glassrl train`` sets it on CPU (glassrl.models.allocator). One
thread. The kernels alternate round by round, each round a fresh optimiser whose first step (the moments
allocated) is not timed, then ``--steps`` timed steps; the median seconds per step of each kernel, their ratio
and the load average (other processes on this machine) are printed, and the most memory a step added above
what the process held before it (peak RSS, VmHWM reset through /proc/self/clear_refs, minus RSS: the
temporaries of the one-tensor kernel).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from glassrl.models.allocator import keep_freed_memory
from glassrl.optim import OptimConfig, make_optimizer

VOCAB, WIDTH, MLP, KV = 151936, 896, 4864, 128  # Qwen2.5-0.5B's config.json (KV = 2 heads × 64)


def qwen_shapes(layers: int) -> list[tuple[int, ...]]:
    """Every trainable tensor's shape: the tied embedding, per layer q/k/v (with biases), o, gate/up/down
    and two norms, the final norm."""
    layer = [(WIDTH, WIDTH), (WIDTH,), (KV, WIDTH), (KV,), (KV, WIDTH), (KV,), (WIDTH, WIDTH)]
    layer += [(MLP, WIDTH), (MLP, WIDTH), (WIDTH, MLP), (WIDTH,), (WIDTH,)]
    return [(VOCAB, WIDTH), *layer * layers, (WIDTH,)]


def model_of(shapes: list[tuple[int, ...]]) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Module()
    model.weights = torch.nn.ParameterList(
        torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.02) for shape in shapes
    )
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    return model


def _status(key: str) -> int:
    """VmRSS or VmHWM of this process, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def seconds_per_step(model: torch.nn.Module, kernel: str, steps: int) -> tuple[list[float], int]:
    """The seconds of each timed step, and the most bytes the steps added above the RSS before them."""
    optimizer, _ = make_optimizer(model, OptimConfig(lr=1e-5, weight_decay=0.1, kernel=kernel), 100)
    assert bool(optimizer.defaults["fused"]) == (kernel == "fused")
    optimizer.step()  # the moments allocated: not timed
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times, _status("VmHWM") - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[24, 2], help="decoder layers of each run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of single then fused")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    kept = keep_freed_memory()
    print(f"torch {torch.__version__}, 1 thread; malloc: {kept or 'glibc keeps freed memory (as glassrl train)'}")
    for layers in args.layers:
        model = model_of(qwen_shapes(layers))
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        times: dict[str, list[float]] = {"single": [], "fused": []}
        added = dict.fromkeys(times, 0)
        load = [os.getloadavg()[0]]
        for _ in range(args.rounds):
            for kernel in times:
                seconds, extra = seconds_per_step(model, kernel, args.steps)
                times[kernel] += seconds
                added[kernel] = max(added[kernel], extra)
                load.append(os.getloadavg()[0])
        single, fused = (statistics.median(times[k]) for k in ("single", "fused"))
        print(
            f"{layers} layers, {size / 1e9:.2f} GB of parameters: single {single:.3f} s/step "
            f"(range {min(times['single']):.3f}-{max(times['single']):.3f}), fused {fused:.3f} s/step "
            f"(range {min(times['fused']):.3f}-{max(times['fused']):.3f}), {single / fused:.2f}x; a step adds "
            f"{added['single'] / 2**20:.0f} / {added['fused'] / 2**20:.0f} MiB above the RSS before it; "
            f"load average {min(load):.2f}-{max(load):.2f}",
            flush=True,
        )
        del model


if __name__ == "__main__":
    main()
