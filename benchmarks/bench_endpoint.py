"""The endpoint's cost: the tool-add agent as an OpenAI-client program over the endpoint against the native
loop, on the same prompts and seed (the same tokens: the script checks it), with the agent model on CPU.

    PYTHONPATH=src:examples/agents python benchmarks/bench_endpoint.py [PROMPTS] [N]

Prints each engine's seconds per rollout (the best of 2 after a warm-up), their ratio, the load average
and the peak RSS. What the endpoint adds: HTTP round trips, an OpenAI client per episode, a thread per
episode, rendering and capture; the sampling (batches in lockstep) is the same.
"""

from __future__ import annotations

import os
import resource
import sys
import time

import torch
from tool_add_agent import agent

from glassrl.agents import AgentRolloutEngine, HFTurnSampler, task_environment
from glassrl.agents.endpoint import EndpointRolloutEngine
from glassrl.builtin.agent_model import ensure_agent_model
from glassrl.data.tasks import load_task
from glassrl.models.loading import load_causal_lm, load_tokenizer
from glassrl.rollout.base import SamplingParams


def main(prompts: int = 25, n: int = 4) -> None:
    path = ensure_agent_model()
    tokenizer, model = load_tokenizer(path), load_causal_lm(path, device="cpu")
    records = load_task("tool-add", "test", size=prompts)
    params = SamplingParams(max_new_tokens=64)
    native = AgentRolloutEngine(
        HFTurnSampler(model, tokenizer), tokenizer, task_environment("tool-add"), call_format="tagged",
        describe_tools=False, max_turns=3,
    )  # fmt: skip
    endpoint = EndpointRolloutEngine(
        HFTurnSampler(model, tokenizer), tokenizer, agent, call_format="tagged", describe_tools=False
    )
    ids = native.format_prompts(records)
    seconds, batches = {}, {}
    for name, engine in (("native", native), ("endpoint", endpoint), ("native", native), ("endpoint", endpoint)):
        for _ in range(2):
            start = time.perf_counter()
            batches[name] = engine.generate(
                ids, n=n, params=params, generator=torch.Generator().manual_seed(0), records=records
            )
            seconds[name] = min(seconds.get(name, float("inf")), time.perf_counter() - start)
    endpoint.close()
    same = torch.equal(batches["native"].response_ids, batches["endpoint"].response_ids)
    print(f"{prompts} prompts x {n}: native {seconds['native']:.2f} s, endpoint {seconds['endpoint']:.2f} s, "
          f"ratio {seconds['endpoint'] / seconds['native']:.2f}; same tokens: {same}")  # fmt: skip
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    print(f"load average {os.getloadavg()[0]:.1f}; peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:3]))
