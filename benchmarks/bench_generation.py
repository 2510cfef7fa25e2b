"""Generation tokens/s: glassrl's decoding loop (glassrl.rollout.hf.decode, preallocated KV cache,
ended rows dropped) against ``model.generate`` (transformers' DynamicCache), same model, same
prompts, same generator state; the tokens are checked identical before any figure is printed.

    .venv/bin/python benchmarks/bench_generation.py                          # lengths 16 64 256 1024
    .venv/bin/python benchmarks/bench_generation.py --lengths 16 64 --batch 32
    .venv/bin/python benchmarks/bench_generation.py --compile --lengths 64   # torch.compile'd forward too
    python3 benchmarks/bench_generation.py --device cuda                      # on a GPU

Two workloads on the default model's weights (``glassrl init-model``), B = 16 prompts × 8 samples:

- fixed length L (``--lengths``): EOS switched off, every row writes L tokens: the cost of a
  decoding step and of the cache. The default model has 64 positions
  (``max_position_embeddings``); its weights are loaded into the same architecture with
  P + L positions (RoPE has no weights: the same parameters), so L = 1024 runs. Beyond 64
  positions the text is out of what it was trained on, which does not change the arithmetic.
- RL setting: EOS on, 16 new tokens, temperature 1: rows end at different steps, as in
  ``make demo``; here ``decode`` also drops ended rows.

tokens/s = generated tokens (EOS included) / wall seconds of the whole call; each figure is the
best of ``--repeats`` after one warm-up call. The load average is printed: on a shared machine,
treat figures as noise beyond what its load explains.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from glassrl.builtin.default_model import ensure_default_model
from glassrl.data.formatting import format_prompt
from glassrl.data.tasks import load_task
from glassrl.models import load_tokenizer
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.hf import decode, generate_with_hf, left_pad
from glassrl.rollout.stops import StopSet, stop_set


def timed(sample, model, ids, mask, params, stops, pad_id, seed, repeats):
    """(tokens (B, T), best wall seconds, best CPU seconds) of ``repeats`` calls after a warm-up,
    each from generator state ``seed``."""
    wall, cpu, tokens = float("inf"), float("inf"), None
    for i in range(repeats + 1):
        g = torch.Generator(ids.device).manual_seed(seed)
        start, start_cpu = time.perf_counter(), time.process_time()
        tokens = sample(model, ids, mask, params, stops=stops, pad_id=pad_id, generator=g)
        if ids.device.type == "cuda":
            torch.cuda.synchronize()
        if i > 0:
            wall, cpu = min(wall, time.perf_counter() - start), min(cpu, time.process_time() - start_cpu)
    return tokens, wall, cpu


def generated(tokens: torch.Tensor, stops: StopSet) -> int:
    """Tokens up to and including each row's first stop token."""
    tokens = tokens.cpu()
    is_eos = torch.isin(tokens, torch.tensor(stops.ids, dtype=torch.long))
    return int(((is_eos.long().cumsum(-1) - is_eos.long()) == 0).sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 1024])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, help="intra-op threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--compile", action="store_true", help="also time decode with torch.compile(model) (dynamic)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"load average at start: {os.getloadavg()[0]:.2f}; {torch.get_num_threads()} threads; torch {torch.__version__}"
    )

    hf_logging.disable_progress_bar()
    path = ensure_default_model()
    tokenizer = load_tokenizer(path)
    pad_id = tokenizer.pad_token_id
    records = load_task("arith-verify", "train", size=args.prompts)
    ids, mask = left_pad([format_prompt(tokenizer, r.prompt) for r in records], pad_id)
    ids, mask = ids.repeat_interleave(args.samples, 0), mask.repeat_interleave(args.samples, 0)  # (B, P)
    config = AutoConfig.from_pretrained(path)
    config.max_position_embeddings = ids.shape[1] + max(args.lengths)
    model = AutoModelForCausalLM.from_pretrained(path, config=config).eval().to(args.device)
    ids, mask = ids.to(args.device), mask.to(args.device)
    compiled = torch.compile(model, dynamic=True) if args.compile else None
    print(f"default model weights, {config.max_position_embeddings} positions; B = {ids.shape[0]}, P = {ids.shape[1]}")

    print("\ntok/s: per wall second; tok/CPU-s: per CPU second of the process (steadier on a shared machine)")
    print(
        "| workload | new tokens | generate tok/s | decode tok/s | ratio "
        "| generate tok/CPU-s | decode tok/CPU-s | ratio | identical |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    eos, no_stop = stop_set(tokenizer, model.generation_config), StopSet(ids=())
    runs = [("RL setting, EOS on", 16, eos)] + [("fixed length", n, no_stop) for n in args.lengths]
    for name, length, stops in runs:
        params = SamplingParams(max_new_tokens=length)
        saved = model.generation_config.eos_token_id
        model.generation_config.eos_token_id = saved if stops.ids else None  # generate's fallback EOS: none
        ref, ref_s, ref_cpu = timed(generate_with_hf, model, ids, mask, params, stops, pad_id, 0, args.repeats)
        model.generation_config.eos_token_id = saved
        ours, ours_s, ours_cpu = timed(decode, model, ids, mask, params, stops, pad_id, 0, args.repeats)
        same = ref.shape == ours.shape and torch.equal(ref, ours)
        n = generated(ours, stops)
        row = (
            f"| {name} | {length} | {n / ref_s:,.0f} | {n / ours_s:,.0f} | {ref_s / ours_s:.2f} "
            f"| {n / ref_cpu:,.0f} | {n / ours_cpu:,.0f} | {ref_cpu / ours_cpu:.2f} | {'yes' if same else 'NO'} |"
        )
        if compiled is not None:
            comp, comp_s, comp_cpu = timed(decode, compiled, ids, mask, params, stops, pad_id, 0, args.repeats)
            same = comp.shape == ours.shape and torch.equal(comp, ours)
            row += (
                f" compiled: {generated(comp, stops) / comp_cpu:,.0f} tok/CPU-s, "
                f"{generated(comp, stops) / comp_s:,.0f} tok/s, tokens identical: {'yes' if same else 'NO'}"
            )
        print(row, flush=True)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
