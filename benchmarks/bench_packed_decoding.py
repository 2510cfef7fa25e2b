"""The decoding loop with and without its weights reordered for oneDNN (glassrl.rollout.packed_weights),
on the CPU, alternated in one process (issue 40).

    .venv/bin/python benchmarks/bench_packed_decoding.py --model-dir /tmp/glassrl-q05          # 0.5 B
    .venv/bin/python benchmarks/bench_packed_decoding.py --model-dir /tmp/glassrl-q05 --threads 2
    .venv/bin/python benchmarks/bench_packed_decoding.py                                       # default model

The model is loaded in float32 (as training holds it on a CPU); ``--rows`` samples of one prompt of
``--prompt-tokens`` random ids decode ``--tokens`` tokens with no stop token (every row runs to the end:
the bench's batch does not shrink), from the same generator state each way, ``--repeats`` times
alternating plain / reordered. Printed per way: the median seconds of a whole rollout (prefill
included; the reordering included on the packed side), per decoding step, the ratio, and how far the
sampled tokens' log-probs and the tokens themselves differ between the two. The load average is printed
before and after: the ratio is what to read on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", help="a causal LM directory (default: the bundled default model)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=165)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from glassrl.builtin.default_model import ensure_default_model
    from glassrl.rollout.base import SamplingParams
    from glassrl.rollout.hf import decode
    from glassrl.rollout.packed_weights import last_level_cache_bytes, packed_path
    from glassrl.rollout.stops import StopSet

    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or str(ensure_default_model())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = model.config.get_text_config().vocab_size
    print(f"load average at start: {os.getloadavg()[0]:.2f}; threads {args.threads}; {model_dir}")
    cache = last_level_cache_bytes()
    print(f"last-level cache: {cache / 2**20:.0f} MiB" if cache else "last-level cache: unknown")
    print(f"auto (glassrl.rollout.hf.sampler_for): {packed_path(model)}")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, args.prompt_tokens), generator=g).expand(args.rows, -1).contiguous()
    mask = torch.ones_like(prompt, dtype=torch.bool)
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0)

    def rollout(packed: bool) -> tuple[float, torch.Tensor, torch.Tensor]:
        logprobs = torch.zeros(args.rows, args.tokens)
        generator = torch.Generator().manual_seed(1)
        start = time.perf_counter()
        tokens = decode(
            model,
            prompt,
            mask,
            params,
            stops=StopSet((), ()),
            pad_id=0,
            generator=generator,
            logprobs_out=logprobs,
            packed=packed,
        )
        return time.perf_counter() - start, tokens, logprobs

    rollout(False), rollout(True)  # warm-up: lazy initialisation, the allocator
    seconds: dict[bool, list[float]] = {False: [], True: []}
    outputs = {}
    for _ in range(args.repeats):
        for packed in (False, True):
            dt, tokens, logprobs = rollout(packed)
            seconds[packed].append(dt)
            outputs[packed] = (tokens, logprobs)
    plain, fast = statistics.median(seconds[False]), statistics.median(seconds[True])
    (t0, l0), (t1, l1) = outputs[False], outputs[True]
    print(f"{args.rows} rows × {args.tokens} tokens after a {args.prompt_tokens}-token prompt, {args.repeats} repeats:")
    print(f"  F.linear (MKL)       {plain:8.3f} s a rollout  {plain / args.tokens:7.4f} s a token")
    print(f"  reordered (oneDNN)   {fast:8.3f} s a rollout  {fast / args.tokens:7.4f} s a token")
    print(f"  plain / reordered    {plain / fast:8.2f}x")
    same = bool(torch.equal(t0, t1))
    print(f"  tokens equal: {same}; log-prob max |difference| {(l0 - l1).abs().max().item():.2e}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
