"""Wall time of one weight sync (glassrl.workers.weight_sync) from 1 sender to W receivers.

    .venv/bin/python benchmarks/bench_weight_sync.py                        # 100 M float32 parameters, 1 receiver
    .venv/bin/python benchmarks/bench_weight_sync.py --params-m 500 --receivers 2 --buckets-mb 1 64 256

Processes from torch.multiprocessing (spawn), gloo over loopback on CPU, what ``ray.rollout.placement:
apart`` runs on CPU ranks: rank 0 holds a transformer-shaped stack of float32 tensors (per layer:
4 d×d attention matrices, 2 d×4d MLP matrices, 2 norm vectors; d = 1024) of about ``--params-m``
million parameters, the receivers the same stack (ModuleSink copies into it). For each bucket size
(``--buckets-mb``; 0 = one broadcast per tensor, as OpenRLHF does) the sync runs ``--repeat`` times
after one warm-up; printed: buckets (collectives) per sync, the median seconds, and GB/s (the
model's bytes over that time). The load average is printed: on a shared machine the figures move
with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.multiprocessing as mp
from torch import nn

from glassrl.workers.data_parallel import free_port
from glassrl.workers.weight_sync import ModuleSink, WeightReceiver, WeightSender

D = 1024


def stack(params_m: float) -> nn.Module:
    """Layers of 12·d² + 2·d float32 parameters until about ``params_m`` million."""
    layers = max(1, round(params_m * 1e6 / (12 * D * D)))
    model = nn.Module()
    for i in range(layers):
        layer = nn.ParameterDict(
            {
                **{f"attn_{k}": nn.Parameter(torch.zeros(D, D)) for k in "qkvo"},
                "mlp_up": nn.Parameter(torch.zeros(4 * D, D)),
                "mlp_down": nn.Parameter(torch.zeros(D, 4 * D)),
                "norm_1": nn.Parameter(torch.ones(D)),
                "norm_2": nn.Parameter(torch.ones(D)),
            }
        )
        model.register_module(f"layer_{i}", layer)
    return model


def rank_main(rank: int, world: int, port: int, params_m: float, buckets_mb: list[float], repeat: int, queue) -> None:
    torch.set_num_threads(1)
    model = stack(params_m)
    for b, mb in enumerate(buckets_mb):
        bucket_bytes = max(1, int(mb * 2**20))  # 0 → 1 byte: every tensor a bucket alone
        if rank == 0:
            side = WeightSender(model, is_main=True, bucket_bytes=bucket_bytes)
            side.join("127.0.0.1", port + b, world)
        else:
            side = WeightReceiver(ModuleSink(model))
            side.join("127.0.0.1", port + b, rank, world)
        times = []
        for _ in range(repeat + 1):  # the first one warms up
            start = time.perf_counter()
            side.send() if rank == 0 else side.receive()
            times.append(time.perf_counter() - start)
        if rank == 0:
            nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
            queue.put((mb, len(side.buckets), statistics.median(times[1:]), nbytes))
        del side  # its TCPStore (rank 0's server) goes with it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-m", type=float, default=100.0)
    parser.add_argument("--receivers", type=int, default=1)
    parser.add_argument("--buckets-mb", type=float, nargs="+", default=[0, 1, 64, 256])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    world = 1 + args.receivers
    port = free_port()  # the bucket sizes use port, port + 1, ...: free on an idle machine
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(
        rank_main,
        args=(world, port, args.params_m, args.buckets_mb, args.repeat, queue),
        nprocs=world,
        join=True,
    )
    print(f"load average {os.getloadavg()[0]:.1f}; {args.receivers} receiver(s), gloo on CPU")
    print("| bucket MB | broadcasts per sync | model MB | sync s (median) | GB/s |")
    print("|---:|---:|---:|---:|---:|")
    while not queue.empty():
        mb, buckets, seconds, nbytes = queue.get()
        label = "per tensor" if mb == 0 else f"{mb:g}"
        print(f"| {label} | {buckets} | {nbytes / 2**20:.0f} | {seconds:.3f} | {nbytes / seconds / 1e9:.2f} |")


if __name__ == "__main__":
    main()
