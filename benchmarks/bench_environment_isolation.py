"""A user's environment in a worker process per episode vs in the trainer (issue 37), on the bundled agentic
example: examples/tool_add.yaml's rollout (default-agent, 16 prompts × n 8 = 128 episodes, max_new_tokens 64,
3 turns, tagged calls, temperature 1), its tool-add environment named as a user's ``file.py:make``.

    python benchmarks/bench_environment_isolation.py [--prompts 16] [--n 8] [--repeats 3]

Per path: seconds per rollout (the step's generate: sampling and environment steps), the first worker
rollout apart (it starts the workers), the environment calls made, the overhead per call, and the
workers' resident memory. Same seeds on both paths: the batches must be equal (checked).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from glassrl.agents import AgentRolloutEngine, HFTurnSampler, environment_factory
from glassrl.builtin.agent_model import ensure_agent_model
from glassrl.data.tasks import tool_add
from glassrl.models import load_causal_lm, load_tokenizer
from glassrl.rollout.base import SamplingParams

ENV_FILE = "from glassrl.agents.tasks import TASK_ENVIRONMENTS\nmake = TASK_ENVIRONMENTS['tool-add']\n"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def untimed(batch) -> list:
    """The batch's turns, each call's "seconds" left out (a wall time)."""
    return [
        [(t.text, t.observation, t.finish_reason, [{**c, "seconds": 0} for c in t.tool_calls]) for t in turns]
        for turns in batch.turns
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model_dir = ensure_agent_model()
    model, tokenizer = load_causal_lm(model_dir, device="cpu"), load_tokenizer(model_dir)
    records = tool_add.records("train", 0, args.prompts)
    params = SamplingParams(max_new_tokens=64, temperature=1.0)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tool_add_env.py").write_text(ENV_FILE, encoding="utf-8")
        engines, batches, times = {}, {}, {"trainer": [], "worker": []}
        for name, in_process in (("trainer", True), ("worker", False)):
            make = environment_factory("tool_add_env.py:make", tmp, in_process=in_process)
            engines[name] = AgentRolloutEngine(
                HFTurnSampler(model, tokenizer),
                tokenizer,
                make,
                call_format="tagged",
                describe_tools=False,
                max_turns=3,
            )
        for r in range(args.repeats + 1):  # the two paths alternate: the machine's load falls on both
            for name, engine in engines.items():
                prompts = engine.format_prompts(records)
                start = time.perf_counter()
                batches[name, r] = engine.generate(
                    prompts, n=args.n, params=params, generator=torch.Generator().manual_seed(r), records=records
                )
                times[name].append(time.perf_counter() - start)
            a, b = batches["trainer", r], batches["worker", r]
            assert torch.equal(a.response_ids, b.response_ids) and untimed(a) == untimed(b), f"rollout {r} differs"
        turns = [turns for r in range(1, args.repeats + 1) for turns in batches["trainer", r].turns]
        steps = sum(len(t) for t in turns) / args.repeats
        pids = [w.process.pid for w in engines["worker"].make_environment.pool._live]
        for name in engines:
            first, steady = times[name][0], sum(times[name][1:]) / args.repeats
            print(f"{name}: first rollout {first:.2f} s, then {steady:.2f} s per rollout (~{steps:.0f} env steps)")
        print(f"worker: {len(pids)} workers, RSS {sum(rss_mib(p) for p in pids) / len(pids):.0f} MiB each")
        t_steady, w_steady = (sum(times[n][1:]) / args.repeats for n in ("trainer", "worker"))
        print(
            f"ratio worker/trainer per rollout: {w_steady / t_steady:.3f} (steady), first rollout "
            f"{times['worker'][0] / times['trainer'][0]:.2f}; batches equal"
        )
        # the cost of one step alone: a turn without a call (tool-add ends the episode), 200 times
        record = records[0]
        for name, engine in engines.items():
            env = engine.make_environment()
            env.reset(record)
            start = time.perf_counter()
            for _ in range(200):
                env.step("5796", [])
            per = (time.perf_counter() - start) / 200 * 1000
            getattr(env, "close", lambda: None)()
            print(f"{name}: one step {per:.3f} ms")
        print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
