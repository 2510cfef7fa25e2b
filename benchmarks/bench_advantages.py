"""GAE: glassrl's vectorised/chunked path vs the Python loop over time steps.

    .venv/bin/python benchmarks/bench_advantages.py
    .venv/bin/python benchmarks/bench_advantages.py --repeats 5 --lengths 1024 8192 --threads 1

Setting: B = 256 rows, T ∈ {1024, 8192}, float32, γ = 1, λ = 0.95. Each row
has a random length in [T/2, T] (right padding) and ~10% observation tokens
inside (mask False), so the masked carry is exercised.

- loop: glassrl.algos.advantages.gae.gae_reference, a backward Python loop
  over T vectorised over B (verl's compute_gae_advantage_return)
- fast: glassrl.algos.advantages.gae.gae (valid tokens packed left, chunked scan)

Both run in this process on the same inputs; each figure is the best of
``--repeats`` runs after one warm-up, and the two outputs are checked equal
before timing is reported. Prints one table row per T with the ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from glassrl.algos.advantages.gae import gae, gae_reference

B, GAMMA, LAM = 256, 1.0, 0.95


def best_of(fn, args: tuple, repeats: int) -> float:
    fn(*args)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return min(times)


def batch(T: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(1)) & (torch.rand(B, T, generator=g) >= 0.1)
    return rewards, values, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu}")
    print(f"B = {B}, float32, gamma = {GAMMA}, lambda = {LAM}, best of {args.repeats}")
    # Other processes distort both timings (the fast path more: it uses all threads).
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'T':>6} | {'loop (ms)':>10} | {'fast (ms)':>10} | {'speed-up':>8}")
    for T in args.lengths:
        r, v, m = batch(T)
        ref_adv = gae_reference(r, v, m, GAMMA, LAM)[0]
        adv = gae(r, v, m, GAMMA, LAM)[0]
        torch.testing.assert_close(adv, ref_adv, atol=1e-4, rtol=1e-4)
        loop = best_of(gae_reference, (r, v, m, GAMMA, LAM), args.repeats)
        fast = best_of(gae, (r, v, m, GAMMA, LAM), args.repeats)
        print(f"{T:>6} | {loop * 1e3:>10.1f} | {fast * 1e3:>10.1f} | {loop / fast:>7.1f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
