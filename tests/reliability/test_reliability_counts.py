"""Counts that become threads or processes are bounded where they are read (issue 37, item 4):
``threads=1000000`` made torch start a million OpenMP threads (the tokenizer's pool panicked, the
process segfaulted, every other process on the machine was starved of threads).

The rule (glassrl.cores, docs/reliability.md "Counts that become threads or processes"): a count
of threads or processes that compute is capped at the usable cores (CPU affinity, cgroup quota),
and the start-up line says so; a count of threads that wait is bounded by the work there is.
"""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import torch
from rich.console import Console

from glassrl import cores, worker_pool
from glassrl.agents import AgentRolloutEngine, FunctionTool, ToolEnvironment, sandbox
from glassrl.config import load_config
from glassrl.data.records import PromptRecord
from glassrl.diagnose.episode_audit import ScriptedTurns
from glassrl.models.loading import load_tokenizer
from glassrl.rl.build import environment_maker
from glassrl.rl.config import TrainConfig, agent_config
from glassrl.rollout.base import SamplingParams
from glassrl.supervised.sft import SFTConfig, train_sft


def test_a_million_threads_are_capped_at_the_usable_cores_and_the_line_says_so(tiny_model_dir, tmp_path):
    before = torch.get_num_threads()
    text = io.StringIO()
    try:
        cfg = SFTConfig(
            model=str(tiny_model_dir), data="task:add", steps=1, batch_size=4, output_dir=str(tmp_path / "sft")
        )
        cfg.threads = 1_000_000
        train_sft(cfg, console=Console(file=text, width=300))
        n = cores.usable_cores()
        assert torch.get_num_threads() == n
        assert text.getvalue().splitlines()[0] == (
            f"threads: {n} (threads = 1000000; capped at the {n} usable cores: "
            "more threads would only wait for each other)"
        )
    finally:
        torch.set_num_threads(before)


def test_the_reward_pool_has_a_worker_per_usable_core_not_per_core_of_the_machine(monkeypatch):
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: {0})  # this process may run on one core
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: None)
    pool = worker_pool.shared_pool(memory_limit_mb=1234, recycle_after=None)
    assert pool.size == 1
    pool.close()


def test_user_tool_processes_are_capped_at_the_usable_cores(tmp_path):
    (tmp_path / "tools.py").write_text("def echo(text: str) -> str:\n    '''Echo.'''\n    return text\n")
    cfg = load_config(TrainConfig, None, [f"rollout.agent.tools=[{tmp_path}/tools.py:echo]"])
    agent = agent_config(cfg)
    agent.tool_workers = 1_000_000
    env = environment_maker(cfg, agent)()
    assert env.tools[0].pool.size == cores.usable_cores()
    assert env.tools[0].call({"text": "hi"}) == "hi"


def test_environments_stepped_at_once_never_outnumber_the_episodes(tiny_model_dir):
    """rollout.agent.tool_workers = 1,000,000: the rollout starts one thread per episode, no more."""
    seen: list[int] = []

    def look() -> str:
        """Look."""
        seen.append(sum(t.name.startswith("agent-env") for t in threading.enumerate()))
        return "ok"

    tokenizer = load_tokenizer(tiny_model_dir)
    engine = AgentRolloutEngine(
        ScriptedTurns(tokenizer, ['<tool_call>{"name": "look", "arguments": {}}</tool_call>', "done"]),
        tokenizer,
        lambda: ToolEnvironment([FunctionTool(look)]),
        call_format="hermes",
        max_turns=3,
        tool_workers=1_000_000,
    )
    records = [PromptRecord(prompt="go")] * 3
    engine.generate(
        engine.format_prompts(records),
        n=1,
        params=SamplingParams(max_new_tokens=400, temperature=1.0),
        generator=torch.Generator().manual_seed(0),
        records=records,
    )
    assert len(seen) == 3 and max(seen) <= 3


def test_python_sandboxes_at_once_never_outnumber_the_usable_cores(monkeypatch):
    """rollout.agent.tool_workers × max_calls python calls at once: one sandbox per usable core runs."""
    monkeypatch.setattr(sandbox, "_running", lru_cache(maxsize=1)(lambda: threading.BoundedSemaphore(1)))
    running, most, lock = [0], [0], threading.Lock()
    run = sandbox._run

    def counted(*args):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            return run(*args)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(sandbox, "_run", counted)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: sandbox.run_python("print(1)", sandbox.SandboxLimits(wall_s=20.0)), range(4)))
    assert [r.stdout for r in results] == ["1\n"] * 4 and most[0] == 1
