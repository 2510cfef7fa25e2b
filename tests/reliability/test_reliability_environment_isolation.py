"""A user's environment cannot end its caller (issue 37): ``os._exit(0)``, ``sys.exit``, a segfault or an
endless loop in its ``reset`` or ``step`` ended or hung ``glassrl train`` while the environment ran in
the trainer. It now runs in a worker process per episode (glassrl.agents.isolated): each hostile
behaviour ends its own episode with finish reason "env_error" and the error in its turn, the other
episodes of the batch go on, and the caller lives (``glassrl audit`` run as a process of its own).

Controls: the same behaviour run in a child process of its own ends or holds it; and a well-behaved
environment gives the same episodes (tokens, turns, observations, rewards) in a worker as in the
trainer, on the same seeds, sampled by a real model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from harness import glassrl_process, in_a_child

from glassrl.agents import AgentRolloutEngine, HFTurnSampler, environment_factory
from glassrl.agents.metrics import turn_metrics
from glassrl.data.records import PromptRecord
from glassrl.diagnose.episode_audit import ScriptedTurns
from glassrl.errors import GlassrlError
from glassrl.ledger.model import _turn
from glassrl.models import load_causal_lm, load_tokenizer
from glassrl.rollout.base import SamplingParams

ENVIRONMENTS = '''
import ctypes, os, sys
from glassrl.agents import StepResult

BEHAVIOURS = {
    "quits": lambda: os._exit(0),
    "exits": lambda: sys.exit(3),
    "crashes": lambda: ctypes.string_at(0),
    "hangs": lambda: [None for _ in iter(int, 1)],
    "raises": lambda: 1 / 0,
}


class Hostile:
    """Misbehaves as its record's prompt says: "<behaviour> in step" or "<behaviour> in reset"."""

    tools = ()

    def reset(self, record):
        self.turn, (self.behaviour, _, self.where) = 0, record.prompt.partition(" in ")
        if self.where == "reset":
            BEHAVIOURS[self.behaviour]()

    def step(self, text, calls):
        self.turn += 1
        if self.where == "step" and self.turn == 2:
            BEHAVIOURS[self.behaviour]()
        return StepResult(observations=(f"turn {self.turn}",), done=self.turn == 3)


class Echo:
    """Well behaved and stateful: says what it read, pays for length, ends after three turns."""

    tools = ()

    def reset(self, record):
        self.turns, self.prompt = 0, record.prompt

    def step(self, text, calls):
        self.turns += 1
        return StepResult(
            observations=(f" [{self.prompt[:3]}|{len(text)}|{self.turns}] ",),
            done=self.turns == 3,
            reward_parts={"chars": len(text) / 100},
        )
'''
BEHAVIOURS = ("quits", "exits", "crashes", "hangs", "raises")
EXPECTED = {
    "quits": "environment worker died (exit code 0)",
    "exits": "error: SystemExit: 3",
    "crashes": "environment worker died (killed by SIGSEGV)",
    "hangs": "timeout: no result after 3 s (worker killed)",
    "raises": "error: ZeroDivisionError: division by zero",
}
TIMEOUT_S = 3.0
PARAMS = SamplingParams(max_new_tokens=400, temperature=1.0)


@pytest.fixture
def envs(tmp_path) -> Path:
    path = tmp_path / "envs.py"
    path.write_text(ENVIRONMENTS, encoding="utf-8")
    return path


def test_the_control_each_behaviour_ends_or_holds_the_process_that_runs_it(envs):
    assert [in_a_child(envs, f"['BEHAVIOURS'][{b!r}]", TIMEOUT_S) for b in BEHAVIOURS] == [0, 3, -11, None, 1]


def _generate(engine, records, n=1, seed=0):
    prompts = engine.format_prompts(records)
    return engine.generate(prompts, n=n, params=PARAMS, generator=torch.Generator().manual_seed(seed), records=records)


@pytest.mark.parametrize("where", ["step", "reset"])
def test_each_hostile_environment_ends_its_own_episode_with_a_reason(envs, tiny_model_dir, where):
    tokenizer = load_tokenizer(tiny_model_dir)
    make = environment_factory(f"{envs}:Hostile", timeout_s=TIMEOUT_S)
    engine = AgentRolloutEngine(ScriptedTurns(tokenizer, ["one", "two", "three"]), tokenizer, make, max_turns=4)
    records = [PromptRecord(f"{b} in {where}") for b in BEHAVIOURS] + [PromptRecord("none in neither")]
    batch = _generate(engine, records)
    fails = 2 if where == "step" else 1  # the turn whose step failed
    for b, behaviour in enumerate(BEHAVIOURS):
        turns = batch.turns[b]
        assert [t.finish_reason for t in turns] == ["continue"] * (fails - 1) + ["env_error"]
        assert turns[-1].error.startswith(f"environment {where}: ") and EXPECTED[behaviour] in turns[-1].error
        assert _turn(turns[-1]).error == turns[-1].error  # what the ledger keeps
    assert [t.finish_reason for t in batch.turns[-1]] == ["continue", "continue", "stop"]  # the sound episode
    assert batch.finish_reasons[:-1] == ["env_error"] * len(BEHAVIOURS)
    assert turn_metrics(batch)["agent/env_error_rate"] == len(BEHAVIOURS) / len(records)
    # the workers of the failed episodes were replaced: the next rollout runs
    again = _generate(engine, [PromptRecord("none in neither")])
    assert again.finish_reasons == ["stop"]


def test_a_bad_environment_spec_fails_at_once_naming_it_from_a_worker(envs, tmp_path):
    (tmp_path / "leaves.py").write_text("import os\nos._exit(0)\n", encoding="utf-8")
    with pytest.raises(GlassrlError, match=r"environment 'leaves.py:make': .*environment worker died \(exit code 0\)"):
        environment_factory("leaves.py:make", tmp_path)
    with pytest.raises(GlassrlError, match=r"environment '.*:BEHAVIOURS': made a dict, not an environment|expected"):
        environment_factory(f"{envs}:BEHAVIOURS")


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    return load_causal_lm(tiny_model_dir, device="cpu"), load_tokenizer(tiny_model_dir)


def test_control_a_sound_environment_gives_the_same_episodes_in_a_worker_as_in_the_trainer(envs, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    records = [PromptRecord("12+30=?"), PromptRecord("7+5=?")]
    batches = []
    for in_process in (True, False):
        make = environment_factory(f"{envs}:Echo", in_process=in_process)
        engine = AgentRolloutEngine(HFTurnSampler(model, tokenizer), tokenizer, make, max_turns=4)
        batches.append(_generate(engine, records, n=3, seed=7))
    trainer, worker = batches
    assert torch.equal(trainer.response_ids, worker.response_ids)
    assert torch.equal(trainer.response_mask, worker.response_mask)
    assert trainer.turns == worker.turns and trainer.texts == worker.texts
    assert trainer.finish_reasons == worker.finish_reasons
    assert sum(len(t) for t in worker.turns) > len(worker.turns)  # observations were read: more than one turn


@pytest.mark.slow
def test_glassrl_audit_survives_a_hostile_environment_and_prints_its_table(envs, tiny_model_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "quits in step"}) + "\n", encoding="utf-8")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["one", "two", "three"]), encoding="utf-8")
    argv = [
        "audit",
        "grpo",
        f"data.train={prompts}",
        f"model.actor={tiny_model_dir}",
        f"rollout.agent.environment={envs}:Hostile",
        f"rollout.agent.environment_timeout_s={TIMEOUT_S}",
        "rollout.max_new_tokens=200",
        "--script",
        str(script),
        "--episodes",
        "1",
    ]
    done = glassrl_process(argv)
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:9]] == [
        "render",
        "mask",
        "gradient",
        "kl",
        "length",
        "carry",
        "stop",
        "limits",
    ], done.stdout + done.stderr
