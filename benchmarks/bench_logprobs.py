"""Peak memory of per-token log-probs: naive full-vocabulary log-softmax vs glassrl's chunked path.

    .venv/bin/python benchmarks/bench_logprobs.py            # B = 1
    .venv/bin/python benchmarks/bench_logprobs.py --batch 2
    .venv/bin/python benchmarks/bench_logprobs.py --backward   # + forward/backward (minutes on 2 cores)
    .venv/bin/python benchmarks/bench_logprobs.py --backward --tokens 4096 --hidden 896 --chunk 0 --entropy \
        --only chunked+bwd
        # issue 40: 4 k response tokens at Qwen2.5-0.5B's width, log-probs and entropy (≈ 12 GB for naive)
    .venv/bin/python benchmarks/bench_logprobs.py --backward --tokens 4096 --hidden 896 --chunk 0 --entropy \
        --bf16 --only chunked+bwd chunked-ckpt+bwd
        # the same under model.compute_dtype: bfloat16 (autocast over float32 weights); chunked-ckpt: the
        # checkpointed autograd chunks the fused head backward replaces

Setting: V = 151,936 (a real large vocabulary), T = 1,024 response tokens,
H = 256, float32, LM head without bias, chunk_size = 128 (the default at this V and B = 1:
glassrl.models.logprobs.CHUNK_LOGITS).

- naive:   logits = lm_head(hidden) (B, T, V); log_softmax(logits).gather(targets)
- chunked: glassrl.models.logprobs.logprobs_from_hidden (gather - logsumexp per chunk)

Each variant runs in a fresh subprocess (CPU). The process allocates its inputs
(hidden, LM-head weight, targets) in place, reads its current RSS (/proc/self/statm)
as the baseline (checking that setting up never went higher), runs the variant
once, and reads ``ru_maxrss`` (the high-water RSS) afterwards: the difference
is the peak memory the computation added. Large tensors are
mmap-backed in glibc and returned on free, so RSS follows torch's live
tensors. On a GPU the same variants also run with
``torch.cuda.max_memory_allocated`` minus the memory allocated before the call.

With ``--backward``, "+bwd" variants make hidden and the LM-head weight require grad
and backpropagate the sum of log-probs (and of the entropy with ``--entropy``: naive then also builds
softmax · log-softmax over (B, T, V), the way the field computes the entropy bonus); "no-ckpt" is the
chunked path without torch.utils.checkpoint (what the chunks would keep alive for backward). The LM-head
weight's ``.grad`` is allocated (zeros) before the baseline is read, as in training after the first
micro-batch: that buffer is the weights' own (the memory estimate counts weights × 4), the same for
every variant, and the peak is what the log-prob computation adds on top of it.

``--bf16``: every variant runs under ``torch.autocast(dtype=torch.bfloat16)`` over the same float32 inputs, as
``model.compute_dtype: bfloat16`` trains (float32 master weights; the LM head's matmul in bfloat16, its
logits made float32 by glassrl and by the naive reference alike). "chunked-ckpt+bwd" (only with ``--only``)
is the chunked path with the fused head backward switched off: autograd through checkpointed chunks, which
a wrapped head (LoRA's) takes, and which bfloat16 autocast took before the fused backward handled it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from contextlib import nullcontext

import torch

import glassrl.models.logprobs as logprobs_module
from glassrl.models.logprobs import _chunk, logprobs_from_hidden, naive_entropy, naive_logprobs

V, CHUNK = 151_936, 128
T, H, ENTROPY, BF16 = 1_024, 256, False, False  # set from the command line (main, child)
FORWARD = ["naive", "chunked"]
BACKWARD = ["naive+bwd", "chunked-no-ckpt+bwd", "chunked+bwd"]
ONLY = ["chunked-ckpt+bwd"]  # run when named by --only


def _inputs(batch: int, device: str, grad: bool):
    """Built in place, so that setting up never allocates more than it keeps (the baseline stays honest)."""
    gen = torch.Generator(device).manual_seed(0)
    hidden = torch.randn(batch, T, H, generator=gen, device=device).requires_grad_(grad)
    head = torch.nn.Linear(H, V, bias=False, device="meta")
    weight = torch.randn(V, H, generator=gen, device=device).div_(H**0.5)
    head.weight = torch.nn.Parameter(weight, requires_grad=grad)
    if grad:
        head.weight.grad = torch.zeros_like(weight)  # held by training anyway: part of the baseline
    targets = torch.randint(0, V, (batch, T), generator=gen, device=device)
    return hidden, head, targets


def _rss_kb() -> int:
    """Current resident set size in KiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def _chunked_no_checkpoint(hidden, head, targets):
    """The chunked loop with the checkpoint removed: each chunk's logits stay alive for backward."""
    c = CHUNK or 128
    parts = [_chunk(head, hidden[:, s : s + c], targets[:, s : s + c], 1.0, ENTROPY) for s in range(0, T, c)]
    entropy = torch.cat([e for _, e in parts], dim=1) if ENTROPY else None
    return torch.cat([lp for lp, _ in parts], dim=1), entropy


def _run(variant: str, hidden, head, targets) -> torch.Tensor:
    casting = torch.autocast(hidden.device.type, dtype=torch.bfloat16) if BF16 else nullcontext()
    fused = logprobs_module._fused_head
    if variant.startswith("chunked-ckpt"):
        logprobs_module._fused_head = lambda *a: False
    try:
        with casting:
            out, entropy = _forward(variant, hidden, head, targets)
    finally:
        logprobs_module._fused_head = fused
    if variant.endswith("+bwd"):
        (out.sum() + (entropy.sum() if ENTROPY else 0)).backward()
    return out


def _forward(variant: str, hidden, head, targets):
    if variant.startswith("naive"):
        logits = head(hidden)
        out, entropy = naive_logprobs(logits, targets), (naive_entropy(logits) if ENTROPY else None)
    elif variant.startswith("chunked-no-ckpt"):
        out, entropy = _chunked_no_checkpoint(hidden, head, targets)
    else:
        out, entropy = logprobs_from_hidden(hidden, head, targets, chunk_size=CHUNK or None, with_entropy=ENTROPY)
    return out, entropy


def child(variant: str, batch: int) -> None:
    """Run one variant on CPU; print JSON {peak_mb, seconds}."""
    torch.set_grad_enabled(variant.endswith("+bwd"))
    hidden, head, targets = _inputs(batch, "cpu", variant.endswith("+bwd"))
    base_kb = _rss_kb()
    # ru_maxrss is a high-water mark: if setting up had gone above the current RSS,
    # a smaller peak during the call would be invisible.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb < 8 * 1024, "setup overshoot"
    start = time.perf_counter()
    _run(variant, hidden, head, targets)
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mb": (peak_kb - base_kb) / 1024, "seconds": seconds}))


def gpu(variant: str, batch: int) -> float:
    torch.set_grad_enabled(variant.endswith("+bwd"))
    hidden, head, targets = _inputs(batch, "cuda", variant.endswith("+bwd"))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    _run(variant, hidden, head, targets)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    del hidden, head, targets
    torch.cuda.empty_cache()
    return peak


def main() -> None:
    global T, H, ENTROPY, CHUNK, BF16
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--backward", action="store_true", help="also measure forward+backward")
    parser.add_argument("--tokens", type=int, default=T, help="response tokens per row (T)")
    parser.add_argument("--hidden", type=int, default=H, help="hidden width (H): 896 is Qwen2.5-0.5B's")
    parser.add_argument("--entropy", action="store_true", help="entropy too (and its gradient with --backward)")
    parser.add_argument("--skip-no-ckpt", action="store_true", help="leave out the chunked path without checkpoint")
    parser.add_argument("--chunk", type=int, default=CHUNK, help="positions per chunk; 0 = glassrl's own choice")
    parser.add_argument("--bf16", action="store_true", help="under bfloat16 autocast (model.compute_dtype)")
    parser.add_argument("--only", nargs="+", choices=FORWARD + BACKWARD + ONLY, help="run these variants only")
    parser.add_argument("--child", choices=FORWARD + BACKWARD + ONLY, help=argparse.SUPPRESS)
    args = parser.parse_args()
    T, H, ENTROPY, CHUNK, BF16 = args.tokens, args.hidden, args.entropy, args.chunk, args.bf16
    shape = ["--batch", str(args.batch), "--tokens", str(T), "--hidden", str(H), "--chunk", str(CHUNK)]
    shape += ["--entropy"] * ENTROPY + ["--bf16"] * BF16
    if args.child:
        child(args.child, args.batch)
        return
    variants = FORWARD + (BACKWARD if args.backward else [])
    if args.skip_no_ckpt:
        variants = [v for v in variants if "no-ckpt" not in v]
    if args.only:
        variants = args.only

    what = "log-probs and entropy" if ENTROPY else "log-probs"
    print(
        f"per-token {what}, V={V:,} T={T} H={H} B={args.batch} float32"
        f"{' under bfloat16 autocast' if BF16 else ''}, "
        f"chunk_size={CHUNK or 'the default, 128 at this V'}"
    )
    print("CPU peak = ru_maxrss after the call minus the RSS after allocating inputs, fresh process per variant")
    cpu = {}
    for variant in variants:
        cmd = [sys.executable, __file__, "--child", variant, *shape]
        cpu[variant] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        print(f"  {variant:22s} peak {cpu[variant]['peak_mb']:8.0f} MiB   time {cpu[variant]['seconds']:6.2f} s")
    if {"naive", "chunked"} <= set(cpu):
        _ratios("CPU", {variant: r["peak_mb"] for variant, r in cpu.items()})

    if torch.cuda.is_available():
        print(f"GPU ({torch.cuda.get_device_name()}) peak = max_memory_allocated minus allocated before the call")
        peaks = {variant: gpu(variant, args.batch) for variant in variants}
        for variant, peak in peaks.items():
            print(f"  {variant:22s} peak {peak:8.0f} MiB")
        _ratios("GPU", peaks)


def _ratios(where: str, peaks: dict[str, float]) -> None:
    fwd = peaks["chunked"] / peaks["naive"]
    verdict = "met" if fwd <= 0.25 else "NOT met"
    print(f"{where} ratio chunked/naive, forward: {fwd:.3f} (1/{1 / fwd:.1f}); goal <= 1/4: {verdict}")
    if "naive+bwd" in peaks:
        bwd = peaks["chunked+bwd"] / peaks["naive+bwd"]
        no_ckpt = peaks.get("chunked-no-ckpt+bwd", float("nan")) / peaks["naive+bwd"]
        print(
            f"{where} ratio chunked/naive, forward+backward: {bwd:.3f} (1/{1 / bwd:.1f}) with checkpoint, "
            f"{no_ckpt:.3f} without"
        )
    print(
        f"{where} issue 40 goal, chunked peak >= 10x below naive: forward 1/{1 / fwd:.1f}"
        + (f", forward+backward 1/{1 / bwd:.1f}" if "naive+bwd" in peaks else "")
        + (" met" if fwd <= 0.1 and ("naive+bwd" not in peaks or bwd <= 0.1) else " NOT met")
    )


if __name__ == "__main__":
    main()
