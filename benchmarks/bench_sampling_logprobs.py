"""What ``rollout.sampling_logprobs`` costs the HF decoding loop: two engines over one model, the
log-probs kept and not, 64 responses × 32 tokens, medians of 6 alternating runs each (BENCHMARKS.md).

    python benchmarks/bench_sampling_logprobs.py MODEL_DIR
"""

from __future__ import annotations

import os
import sys
import time

import torch

from glassrl.data.formatting import format_prompt
from glassrl.data.tasks import load_task
from glassrl.models import load_causal_lm, load_tokenizer
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.hf import HFRolloutEngine


def main(model_dir: str) -> None:
    model, tokenizer = load_causal_lm(model_dir, dtype="float32", device="cpu"), load_tokenizer(model_dir)
    prompts = [format_prompt(tokenizer, r.prompt) for r in load_task("arith-verify", "train", size=16)]
    params = SamplingParams(max_new_tokens=32, temperature=1.0, top_p=1.0, top_k=0, greedy=False)
    engines = {keep: HFRolloutEngine(model, tokenizer, sampling_logprobs=keep) for keep in (False, True)}
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(12):
        for keep in (False, True) if rep % 2 else (True, False):
            start = time.perf_counter()
            engines[keep].generate(prompts, n=4, params=params, generator=torch.Generator().manual_seed(rep))
            seconds[keep].append(time.perf_counter() - start)
    median = {keep: sorted(v)[len(v) // 2] for keep, v in seconds.items()}
    print(
        f"{model_dir}: median s without {median[False]:.3f}, with {median[True]:.3f}; "
        f"ratio {median[True] / median[False]:.3f}; load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
