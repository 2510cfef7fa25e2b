"""A user's tool cannot end its caller (issue 37, item 10): a tool calling ``os._exit(0)`` made
``glassrl audit`` print nothing and exit 0, and would have ended ``train`` with 0 mid-run.

A user's tool (``file.py:attribute``, ``module:attribute``) runs in a worker process
(glassrl.agents.registry.WorkerTool). Each hostile tool — ``os._exit(0)``, ``sys.exit(3)``,
a segfault (ctypes), an endless loop — is an error or timeout observation for that call; the
episode goes on, the next call gets a fresh worker, and the caller lives: the environment's
step, an agentic rollout, and ``glassrl audit`` run as a process of its own (exit code and output
checked). The control of each: the same function called in a child process of its own ends it
the way it would have ended the caller.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
import torch
from harness import glassrl_process, in_a_child

from glassrl.agents import AgentRolloutEngine, ToolEnvironment, build_tools
from glassrl.agents.tools import ToolCall
from glassrl.data.records import PromptRecord
from glassrl.diagnose.episode_audit import ScriptedTurns
from glassrl.errors import GlassrlError
from glassrl.models.loading import load_tokenizer
from glassrl.rollout.base import SamplingParams

HOSTILE = '''
import ctypes, os, sys

def quits() -> str:
    """Ends its process with exit code 0."""
    os._exit(0)

def exits() -> str:
    """Raises SystemExit(3)."""
    sys.exit(3)

def crashes() -> str:
    """Reads address 0: a segfault."""
    return ctypes.string_at(0)

def hangs() -> str:
    """Never returns."""
    while True:
        pass

def fine() -> str:
    """Answers."""
    return "fine"
'''
NAMES = ("quits", "exits", "crashes", "hangs", "fine")
EXPECTED = {
    "quits": ("error", "error: quits: tool worker died (exit code 0)"),
    "exits": ("error", "error: exits: SystemExit: 3"),
    "crashes": ("error", "error: crashes: tool worker died (killed by SIGSEGV)"),
    "hangs": ("timeout", "error: hangs: no result after 3 s (worker killed)"),
    "fine": ("ok", "fine"),
}
TIMEOUT_S = 3.0


@pytest.fixture
def hostile(tmp_path) -> Path:
    path = tmp_path / "hostile_tools.py"
    path.write_text(HOSTILE, encoding="utf-8")
    return path


def test_the_control_each_tool_ends_or_holds_the_process_that_calls_it(hostile):
    assert in_a_child(hostile, "['quits']", TIMEOUT_S) == 0  # ended, and "successfully"
    assert in_a_child(hostile, "['exits']", TIMEOUT_S) == 3
    assert in_a_child(hostile, "['crashes']", TIMEOUT_S) == -11  # SIGSEGV
    assert in_a_child(hostile, "['hangs']", TIMEOUT_S) is None


def test_each_hostile_tool_is_an_observation_and_the_next_call_gets_an_answer(hostile):
    tools = build_tools([f"{hostile}:{name}" for name in NAMES], call_timeout_s=TIMEOUT_S, processes=2)
    env = ToolEnvironment(tools, call_timeout_s=TIMEOUT_S + 5, max_calls=len(NAMES))
    env.reset(PromptRecord(prompt="go"))
    result = env.step("calls", [ToolCall(name, arguments={}) for name in NAMES])
    got = {call["name"]: (call["status"], text) for call, text in zip(result.tool_calls, result.observations)}
    assert got == EXPECTED and not result.done
    again = env.step("again", [ToolCall("fine", arguments={}), ToolCall("quits", arguments={})])
    assert again.observations == ("fine", EXPECTED["quits"][1])
    assert multiprocessing.parent_process() is None and os.getpid() > 0  # this process goes on


def test_a_tools_file_that_exits_while_loading_is_one_error_line(tmp_path):
    (tmp_path / "leaves.py").write_text("import os\nos._exit(0)\ndef f() -> str:\n    return ''\n", encoding="utf-8")
    with pytest.raises(GlassrlError, match=r"tool 'leaves.py:f': .*tool worker died \(exit code 0\)"):
        build_tools(["leaves.py:f"], base_dir=tmp_path)


def _script(calls: list[str]) -> list[str]:
    """One turn calling every tool in ``calls`` (hermes format), then a final answer."""
    turn = "".join(f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>' for name in calls)
    return [turn, "done"]


def test_an_agentic_rollout_goes_on_past_every_hostile_tool(hostile, tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    tools = build_tools([f"{hostile}:{name}" for name in NAMES], call_timeout_s=TIMEOUT_S, processes=2)
    engine = AgentRolloutEngine(
        ScriptedTurns(tokenizer, _script(list(NAMES))),
        tokenizer,
        lambda: ToolEnvironment(tools, call_timeout_s=TIMEOUT_S + 5, max_calls=len(NAMES)),
        call_format="hermes",
        max_turns=3,
    )
    records = [PromptRecord(prompt="go")]
    batch = engine.generate(
        engine.format_prompts(records),
        n=1,
        params=SamplingParams(max_new_tokens=2000, temperature=1.0),
        generator=torch.Generator().manual_seed(0),
        records=records,
    )
    turns = batch.turns[0]
    assert [t.finish_reason for t in turns] == ["tool_call", "stop"] and batch.texts == ["done"]
    statuses = {call["name"]: call["status"] for call in turns[0].tool_calls}
    assert statuses == {name: status for name, (status, _) in EXPECTED.items()}
    for _, text in EXPECTED.values():
        assert text in turns[0].observation


@pytest.mark.slow
def test_glassrl_audit_survives_every_hostile_tool_and_reports(hostile, tiny_model_dir, tmp_path):
    """Run as a process of its own: before, os._exit(0) in a tool ended it with exit code 0 and no output."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "go"}) + "\n", encoding="utf-8")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script(list(NAMES))), encoding="utf-8")
    tools = ", ".join(f"{hostile}:{name}" for name in NAMES)
    argv = [
        "audit",
        "grpo",
        f"data.train={prompts}",
        f"model.actor={tiny_model_dir}",
        f"rollout.agent.tools=[{tools}]",
        f"rollout.agent.call_timeout_s={TIMEOUT_S}",
        f"rollout.agent.max_calls={len(NAMES)}",
        "rollout.agent.call_format=hermes",
        "rollout.max_new_tokens=2000",
        "--script",
        str(script),
        "--episodes",
        "1",
    ]
    done = glassrl_process(argv)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in lines[1:9]] == [
        "render",
        "mask",
        "gradient",
        "kl",
        "length",
        "carry",
        "stop",
        "limits",
    ], done.stdout
