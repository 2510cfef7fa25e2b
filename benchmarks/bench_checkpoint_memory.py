"""What a checkpoint adds to a training process's memory: a model and its AdamW state saved as a run saves
them (glassrl.run.checkpoint: the model as a Hugging Face directory, the optimiser's state as JSON plus
safetensors, each part read back and compared before the checkpoint counts), issue 40.

    .venv/bin/python benchmarks/bench_checkpoint_memory.py --model-dir /tmp/glassrl-q05
    .venv/bin/python benchmarks/bench_checkpoint_memory.py --model-dir DIR --src /path/to/older/checkout/src

The model (float32, as training holds it on a CPU) and an AdamW state (one step on a zero gradient: both
moments allocated, as after any step) are built first; then the peak RSS (VmHWM, reset through
/proc/self/clear_refs) is read across ``CheckpointManager.save`` of the two parts. ``--src`` runs the same in
a subprocess with another checkout's ``src`` first on the path: the figure before a change.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 2**30


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM")


def measure(model_dir: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    import glassrl
    from glassrl.run.checkpoint import CheckpointManager, Part

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    root = Path(tempfile.mkdtemp(prefix="ckpt-memory-"))
    try:
        Path("/proc/self/clear_refs").write_text("5")
        before, start = vm_hwm(), time.perf_counter()
        CheckpointManager(root, keep=1).save(
            1, {"actor": Part("hf", model), "optim": Part("torch", optimizer.state_dict())}
        )
        added, seconds = vm_hwm() - before, time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"glassrl from {Path(glassrl.__file__).parent.parent}: weights {weights / GIB:.2f} GiB, AdamW state "
        f"{2 * weights / GIB:.2f} GiB; the checkpoint added {added / GIB:.2f} GiB at its peak "
        f"({added / weights:.2f}x the weights), {seconds:.1f} s"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True, help="a Hugging Face model directory (glassrl init-model --arch ...)")
    p.add_argument("--src", help="another checkout's src/ to measure instead (a subprocess)")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        return measure(args.model_dir)
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}; load average {os.getloadavg()}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(args.src).resolve()), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, __file__, "--model-dir", args.model_dir, "--measure"], env=env, check=True)


if __name__ == "__main__":
    main()
