"""Ledger files against the response length: size, write and read time, the writer's peak memory.

    .venv/bin/python benchmarks/bench_ledger.py
    .venv/bin/python benchmarks/bench_ledger.py --lengths 1024 4096 16384 65536 --flat-max 8192

Setting: one response of T tokens with every quantity of a PPO ledger (log-probs, reference
log-probs, KL, scores, rewards, values, TD errors, advantages, returns, whitened advantages,
token ids), each token's text 4 characters, the prompt 60 characters.

- rows: the ledger file as glassrl writes it (issue 33): the response's fields once, then one
  row per token (``Ledger.write_jsonl``, a row at a time), read back by ``read_jsonl``
- flat: the first layout, every response field (the response text among them) on every token
  row, written as one string (what ``Ledger.to_jsonl`` did before); read back by the same
  ``read_jsonl``. Its size grows with T², so it runs only up to ``--flat-max``.

Each time is the best of ``--repeats``; peak memory is tracemalloc's peak over the write alone
(a separate pass, since tracing slows the code). Prints one row per T and layout, then the time of
the report's token view of the same ledger (``glassrl.report.html.token_payload``: every token's
row and legend) under GAE and REINFORCE++, whose legends once re-read the response per token.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

from glassrl.ledger import Ledger, read_jsonl
from glassrl.report.html import token_payload


def ledger(T: int) -> Ledger:
    g = torch.Generator().manual_seed(T)

    def r() -> torch.Tensor:
        return torch.randn(1, T, generator=g)

    return Ledger.from_tensors(
        prompts=["Natalia sold clips to 48 of her friends in April. How many?"],
        token_texts=[[f"w{i % 97:02d} " for i in range(T)]],
        response_mask=torch.ones(1, T, dtype=torch.bool),
        estimator="gae",
        gamma=1.0,
        lam=0.95,
        beta=0.05,
        kl_kind="k1",
        token_ids=torch.arange(T).view(1, T),
        **{name: r() for name in ("logprobs", "ref_logprobs", "kl", "token_scores", "token_rewards", "values")},
        **{name: r() for name in ("deltas", "advantages", "returns", "whitened_advantages")},
        scores=torch.tensor([1.0]),
        group_ids=torch.tensor([0]),
        finish_reasons=["stop"],
        step=1,
    )


def write_rows(lg: Ledger, path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        lg.write_jsonl(f)


def write_flat(lg: Ledger, path: Path) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lg.rows()), encoding="utf-8")


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def peak_kib(fn) -> float:
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--flat-max", type=int, default=8192, help="longest T written in the flat layout")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print("| T | layout | file MiB | bytes/token | write s | read s | write peak KiB |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step_000001.jsonl"
        for T in args.lengths:
            lg = ledger(T)
            for layout, write in (("rows", write_rows), ("flat", write_flat)):
                if layout == "flat" and T > args.flat_max:
                    continue
                seconds = best_of(lambda w=write, lg=lg: w(lg, path), args.repeats)
                size = path.stat().st_size
                read = best_of(lambda: read_jsonl(path), args.repeats)
                assert read_jsonl(path) == lg
                peak = peak_kib(lambda w=write, lg=lg: w(lg, path))
                print(
                    f"| {T:,} | {layout} | {size / 2**20:,.2f} | {size / T:,.0f} | {seconds:.3f} | {read:.3f} "
                    f"| {peak:,.0f} |",
                    flush=True,
                )
    print("\n| T | report token view s, gae | report token view s, reinforce_pp |\n|---:|---:|---:|")
    for T in args.lengths:
        lg = ledger(T)
        views = [
            best_of(lambda lg=dataclasses.replace(lg, estimator=e): token_payload([("run", [lg])], (0, 0)), 1)
            for e in ("gae", "reinforce_pp")
        ]
        print(f"| {T:,} | {views[0]:.2f} | {views[1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
