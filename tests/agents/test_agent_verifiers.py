"""The verifiers adapter (glassrl.agents.hubs.verifiers) on a real verifiers 0.4.0 environment: a taskset
built from an in-memory list with verifiers' own API (vf.Taskset, vf.Task, @vf.reward), played by
verifiers' SingleAgentEnv through its interception server, whose requests go to glassrl's endpoint.
The episode runs, its call is captured token-exact, the environment's own reward reaches the sample,
and ``glassrl audit`` passes on the config. Skips, naming the extra, where verifiers is not installed."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

pytest.importorskip("verifiers.v1", reason="verifiers is not installed: pip install 'glassrl[verifiers]'")

from glassrl.cli import main  # noqa: E402
from glassrl.data.records import PromptRecord  # noqa: E402
from glassrl.errors import GlassrlError  # noqa: E402
from glassrl.rollout.base import ROLE_GENERATED, SamplingParams  # noqa: E402

TASKSET = textwrap.dedent('''
    import verifiers.v1 as vf
    from glassrl.agents.hubs.verifiers import ChatHarness

    class SumData(vf.TaskData):
        answer: str

    class SumTask(vf.Task[SumData]):
        @vf.reward(weight=0.5)
        async def correct(self, trace: vf.Trace) -> float:
            return float(trace.last_reply.strip() == self.data.answer)

    class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
        def load(self):
            rows = [(2, 3), (4, 2)]
            return [SumTask(SumData(prompt=f"{a}+{b}=?", answer=str(a + b)), self.config.task) for a, b in rows]

    __all__ = ["SumTaskset", "ChatHarness"]
''')


@pytest.fixture
def taskset(tmp_path, monkeypatch):
    (tmp_path / "vf_toy_sum.py").write_text(TASKSET)
    (tmp_path / "vf_agent.py").write_text(
        "from glassrl.agents.hubs.verifiers import VerifiersAgent\nagent = VerifiersAgent('vf_toy_sum')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "vf_toy_sum"


def test_records_name_their_task(taskset, tmp_path, capsys):
    from glassrl.agents.hubs.verifiers import main as export

    assert export([taskset, "--out", str(tmp_path / "d.jsonl")]) == 0
    assert "2 tasks of vf_toy_sum" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert rows == [{"prompt": "2+3=?", "verifiers_idx": 0}, {"prompt": "4+2=?", "verifiers_idx": 1}]


def test_the_environment_s_episode_runs_through_the_endpoint_and_its_score_is_the_reward(taskset, tokenizer, scripted):
    from glassrl.agents.endpoint import EndpointRolloutEngine
    from glassrl.agents.hubs.verifiers import VerifiersAgent

    agent = VerifiersAgent(taskset)
    records = [
        PromptRecord("2+3=?", None, {"verifiers_idx": 0}, "d#0"),
        PromptRecord("4+2=?", None, {"verifiers_idx": 1}, "d#1"),
    ]
    # the scripted policy answers 5 to both: right for the first task, wrong for the second
    engine = EndpointRolloutEngine(scripted(tokenizer, lambda context: "5"), tokenizer, agent, describe_tools=False)
    try:
        batch = engine.generate([[0]] * 2, n=1, params=SamplingParams(max_new_tokens=16), generator=torch.Generator(),
                                records=records)  # fmt: skip
    finally:
        engine.close()
    assert batch.texts == ["5", "5"]
    # the environment's own score: @vf.reward "correct", weighted 0.5, on the episode's (only) turn
    assert [turns[-1].reward_parts for turns in batch.turns] == [{"verifiers/correct": 0.5}, {"verifiers/correct": 0.0}]
    for i in range(2):  # the call was captured: its sampled tokens are the sample's generated tokens
        (turn,) = batch.turns[i]
        roles = batch.token_roles[i].tolist()
        assert turn.end > turn.start and roles[turn.start : turn.end] == [ROLE_GENERATED] * (turn.end - turn.start)


def test_a_record_without_its_task_or_a_missing_taskset_is_one_error(taskset):
    from glassrl.agents.hubs.verifiers import VerifiersAgent

    with pytest.raises(GlassrlError, match=r"verifiers taskset 'no_such_taskset': ModuleNotFoundError: taskset"):
        VerifiersAgent("no_such_taskset")

    with pytest.raises(GlassrlError, match=r"d#7: metadata\.verifiers_idx = None: expected a task index below 2"):
        VerifiersAgent(taskset)("http://127.0.0.1:9/v1", {"prompt": "x", "metadata": {}, "source": "d#7"})


def test_glassrl_audit_passes_on_a_verifiers_config(taskset, tiny_model_dir, tmp_path, capsys):
    from glassrl.agents.hubs.verifiers import records

    records(taskset, tmp_path / "d.jsonl")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["5"]))
    argv = ["audit", "grpo", f"data.train={tmp_path / 'd.jsonl'}", f"model.actor={tiny_model_dir}",
            "rollout.max_new_tokens=32", f"rollout.agent.endpoint.agent={tmp_path / 'vf_agent.py'}:agent",
            "--script", str(script), "--episodes", "2"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().out


def test_the_agent_runs_on_this_host_unless_the_env_block_names_a_runtime(taskset):
    """verifiers' default runtime is a Prime sandbox (needs a tunnel and a login); the endpoint is on 127.0.0.1."""
    from glassrl.agents.hubs.verifiers import VerifiersAgent

    agent = VerifiersAgent(taskset, env={"agent": {"max_turns": 2}})
    assert (agent.config.agent.runtime.type, agent.config.agent.max_turns) == ("subprocess", 2)
    assert agent.config.agent.harness is None  # the taskset's own (ChatHarness, exported by the taskset module)
