"""Padding-free passes (``model.padding_free``) against padded ones, on mixed lengths.

    .venv/bin/python benchmarks/bench_padding_free.py            # both model sizes
    .venv/bin/python benchmarks/bench_padding_free.py --quick    # the default size, fewer repeats
    .venv/bin/python benchmarks/bench_padding_free.py --batch 8 32

A micro-batch of ``--batch`` responses (8: the default ``batch.micro_batch_responses``; 32:
examples/grpo.yaml's) with prompt and response lengths drawn uniformly (seeded) from [P_min, P_max] and [1, T_max], laid
out as the trainer lays them out (left-padded prompt ⊕ right-padded response). Three passes,
each padded (``packed=False``) and packed (``packed=True``):

- logprobs: phase 3's actor pass, log-probs and entropy, no gradient (glassrl.models.response_logprobs);
- values:   the critic's pass, no gradient (glassrl.models.response_values, value head);
- train:    the update's forward and backward (glassrl.rl.update.actor_forward, a summed
            log-prob loss), gradients on.

Two sizes, Llama architecture, random weights, float32: "default" is the default model's
(hidden 128, 4 layers, vocabulary 512, prompts 8–48, responses 1–16); "large" is ~10× its
parameters (hidden 384, 8 layers, vocabulary 4,096, prompts 16–128, responses 1–256).

Time: the median over ``--repeats`` of each pass, padded and packed interleaved. Reported as
CPU seconds of this process (``time.process_time``) — with one intra-op thread (``--threads 1``,
the default) that is the work done, which other jobs on a shared machine do not inflate — and
as wall seconds. ratio = padded / packed (> 1: packing saves). The load average is printed
before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from glassrl.models import CausalLMWithValueHead, response_logprobs, response_values
from glassrl.rl.loss import actor_forward

SIZES = {
    # name: (hidden, layers, heads, intermediate, vocab, positions, prompt range, max response)
    "default": (128, 4, 4, 512, 512, 64, (8, 48), 16),
    "large": (384, 8, 6, 1536, 4096, 512, (16, 128), 256),
}


def _model(name: str) -> LlamaForCausalLM:
    hidden, layers, heads, inter, vocab, positions, _, _ = SIZES[name]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=positions,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def _batch(name: str, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """input_ids, attention_mask (B, P+T), T: mixed prompt and response lengths."""
    _, _, _, _, vocab, _, (p_min, p_max), t_max = SIZES[name]
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(p_min, p_max + 1, (batch,), generator=gen)
    responses = torch.randint(1, t_max + 1, (batch,), generator=gen)
    P, T = int(prompts.max()), int(responses.max())
    ids = torch.randint(3, vocab, (batch, P + T), generator=gen)
    mask = torch.zeros(batch, P + T, dtype=torch.bool)
    for b in range(batch):
        mask[b, P - prompts[b] : P + responses[b]] = True
    return ids, mask, T


def _time(fn: Callable[[], object]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def _passes(model, critic, ids, mask, T) -> dict[str, Callable[[bool], object]]:
    micro = {"input_ids": ids, "attention_mask": mask, "response_mask": mask[:, -T:], "old_logprobs": None}

    @torch.no_grad()
    def logprobs(packed):
        return response_logprobs(model, ids, mask, T, with_entropy=True, packed=packed)

    @torch.no_grad()
    def values(packed):
        return response_values(critic, ids, mask, T, packed=packed)

    def train(packed):
        model.zero_grad(set_to_none=True)
        out = actor_forward(1.0, False, model, micro, packed=packed)
        torch.where(micro["response_mask"], out["logprobs"], 0.0).sum().backward()

    return {"logprobs": logprobs, "values": values, "train": train}


def run(name: str, batch: int, repeats: int, seed: int) -> list[tuple]:
    """(model, batch, pass, real tokens, padded tokens, padded (cpu, wall), packed (cpu, wall)) per pass."""
    model = _model(name).train()
    critic = CausalLMWithValueHead(model)
    ids, mask, T = _batch(name, batch, seed)
    real, total = int(mask.sum()), mask.numel()
    rows = []
    for pass_name, fn in _passes(model, critic, ids, mask, T).items():
        runs = {False: [], True: []}
        for _ in range(2):  # warm-up
            fn(False), fn(True)
        for _ in range(repeats):
            for packed in (False, True):
                runs[packed].append(_time(partial(fn, packed)))
        med = {p: (statistics.median(c for c, _ in r), statistics.median(w for _, w in r)) for p, r in runs.items()}
        rows.append((name, batch, pass_name, real, total, med[False], med[True]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the default size only, 5 repeats")
    parser.add_argument("--batch", type=int, nargs="+", default=[8], help="responses per micro-batch (several: each)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (torch.set_num_threads)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes, repeats = (["default"], 5) if args.quick else (list(SIZES), args.repeats)
    print(
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; threads {args.threads}; "
        f"median of {repeats}; torch {torch.__version__}"
    )
    print(
        f"{'model':8} {'B':>3} {'pass':9} {'real/padded tokens':>19} {'padded cpu ms':>14} {'packed cpu ms':>14} "
        f"{'ratio':>6} {'padded wall ms':>15} {'packed wall ms':>15} {'ratio':>6}"
    )
    for name in sizes:
        for B in args.batch:
            for model, b, pass_name, real, total, (pc, pw), (kc, kw) in run(name, B, repeats, args.seed):
                print(
                    f"{model:8} {b:3} {pass_name:9} {f'{real}/{total} ({real / total:.0%})':>19} {pc * 1e3:14.1f} "
                    f"{kc * 1e3:14.1f} {pc / kc:6.2f} {pw * 1e3:15.1f} {kw * 1e3:15.1f} {pw / kw:6.2f}"
                )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
