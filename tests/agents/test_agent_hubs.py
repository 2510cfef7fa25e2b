"""The hub adapters (glassrl.agents.hubs) on real environments of their packages, each through
``glassrl audit`` (masks, re-rendering, and for reasoning-gym the reward red-team) with a scripted
policy: reasoning-gym's chain_sum, skyrl-gym's gsm8k_multi_turn, and the echo environment that
``openenv init`` writes, served by uvicorn on 127.0.0.1 and stopped by the test.
Each part skips, saying which extra, where its package is not installed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glassrl.cli import main
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError

CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def _audit(tiny_model_dir, tmp_path, data: str, environment: str, turns: list[str], episodes: int = 2) -> list[str]:
    script = _write(tmp_path / "script.json", json.dumps(turns))
    argv = ["audit", "grpo", f"data.train={data}", f"model.actor={tiny_model_dir}", "rollout.max_new_tokens=200"]
    argv += [f"rollout.agent.environment={environment}", "rollout.agent.max_turns=3"]
    return [*argv, "--script", script, "--episodes", str(episodes)]


# ---------------------------------------------------------------- reasoning-gym


def test_reasoning_gym_records_are_seeded_and_scored_by_score_answer(tmp_path):
    pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra: pip install -e '.[reasoning-gym]'")
    from glassrl.agents.hubs import reasoning_gym as rg

    train = rg.records("chain_sum", seed=1, size=50, config=CHAIN_SUM)
    assert [r.prompt for r in train] == [r.prompt for r in rg.records("chain_sum", seed=1, size=50, config=CHAIN_SUM)]
    # upstream draws entry i of seed s from Random(s + i): seed 2 is seed 1 shifted by one entry
    shifted = rg.records("chain_sum", seed=2, size=50, config=CHAIN_SUM)
    assert [r.prompt for r in shifted[:49]] == [r.prompt for r in train[1:]]
    held_out = rg.records("chain_sum", seed=1_000_000, size=50, config=CHAIN_SUM)
    assert [r.prompt for r in train] != [r.prompt for r in held_out]
    record = train[0]
    assert record.prompt == "State the final answer to the following arithmetic problem: 4 - 1 ="
    assert record.answer == "3"
    assert rg.score("", " 3 ", None, record.metadata) == 1.0
    assert rg.score("", "so <answer>3</answer>", None, record.metadata) == 1.0
    assert rg.score("", "<answer>4</answer> 3", None, record.metadata) == 0.0  # the tag, not the rest
    assert rg.score("", "4", None, record.metadata) == 0.0
    with pytest.raises(ValueError, match="has no 'reasoning_gym' field"):
        rg.score("", "3", "3", {})
    env = rg.ReasoningGymEnvironment()
    env.reset(record)
    assert env.step("3", ()).reward_parts == {"reasoning_gym": 1.0} and env.step("3", ()).done
    with pytest.raises(GlassrlError, match="reasoning-gym dataset 'no_such_task'"):
        rg.entries("no_such_task", seed=0, size=1)


def test_reasoning_gym_export_writes_what_data_train_reads(tmp_path, capsys):
    pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra: pip install -e '.[reasoning-gym]'")
    from glassrl.agents.hubs.reasoning_gym import main as export_main
    from glassrl.data.datasets import load_prompts

    out = tmp_path / "rg.jsonl"
    config = json.dumps(CHAIN_SUM)
    assert export_main(["chain_sum", "--seed", "1", "--size", "5", "--out", str(out), "--config", config]) == 0
    read = load_prompts(str(out))
    assert len(read) == 5 and read[0].answer == "3" and "reasoning_gym" in read[0].metadata
    assert capsys.readouterr().out == f"wrote 5 chain_sum entries (seed 1) to {out}\n"
    held_out = tmp_path / "held_out.jsonl"
    argv = [
        "chain_sum",
        "--seed",
        "2",
        "--size",
        "5",
        "--out",
        str(held_out),
        "--config",
        config,
        "--exclude",
        str(out),
    ]
    assert export_main(argv) == 0  # seed 2's first four entries are seed 1's last four
    assert capsys.readouterr().out == f"wrote 1 chain_sum entries (seed 2, 4 left out (in {out})) to {held_out}\n"
    (kept,) = load_prompts(str(held_out))
    assert kept.prompt not in {r.prompt for r in read}
    assert export_main(["chain_sum", "--seed", "1", "--size", "5", "--out", str(out), "--config", "[1]"]) == 2
    assert export_main(["nope", "--seed", "1", "--size", "5", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: reasoning-gym dataset 'nope'")


def test_reasoning_gym_passes_the_audit_and_its_reward_the_red_team(tiny_model_dir, tmp_path, capsys):
    pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra: pip install -e '.[reasoning-gym]'")
    from glassrl.agents.hubs.reasoning_gym import export

    data = str(export("chain_sum", tmp_path / "rg.jsonl", seed=1, size=40, config=CHAIN_SUM)[0])
    env = "glassrl.agents.hubs.reasoning_gym:ReasoningGymEnvironment"
    assert main(_audit(tiny_model_dir, tmp_path, data, env, ["3"])) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("render        2/2   ok") and out[2].startswith("mask          2/2   ok")
    reward = "reward.sources=[{name: user_function, spec: 'glassrl.agents.hubs.reasoning_gym:score', weight: 1.0}]"
    argv = ["audit", "--reward", "grpo", f"data.train={data}", f"model.actor={tiny_model_dir}", reward]
    argv += ["--samples", "8"]
    assert main(argv) == 0, capsys.readouterr().out


# ---------------------------------------------------------------- skyrl-gym


def test_skyrl_gsm8k_multi_turn_steps_and_passes_the_audit(tiny_model_dir, tmp_path, capsys):
    pytest.importorskip("skyrl_gym", reason="the skyrl-gym extra: pip install -e '.[skyrl-gym]'")
    from glassrl.agents.hubs.skyrl import SkyRLEnvironment, gsm8k_multi_turn

    env = gsm8k_multi_turn()
    env.reset(PromptRecord("What is 2+3?", "5", {"extra_info": {"max_turns": 3}}))
    first = env.step("I think #### 4", ())
    assert not first.done and "#### ANSWER" in first.observations[0]
    assert first.reward_parts == {"skyrl": pytest.approx(0.2 / 3)}  # its format score per turn
    last = env.step("#### 5", ())
    assert last.done and last.observations == () and last.reward_parts == {"skyrl": 1.0}
    with pytest.raises(GlassrlError, match="'nope': not registered; registered: aime, gsm8k"):
        SkyRLEnvironment("nope")

    rows = [{"prompt": f"What is {a}+{a}?", "answer": str(2 * a), "extra_info": {"max_turns": 3}} for a in range(4)]
    data = _write(tmp_path / "gsm.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    argv = _audit(tiny_model_dir, tmp_path, data, "glassrl.agents.hubs.skyrl:gsm8k_multi_turn", ["#### 1", "#### 0"])
    assert main(argv) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.splitlines()[1].startswith("render        2/2   ok")


# ---------------------------------------------------------------- OpenEnv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def echo_server(tmp_path):
    """The echo environment ``openenv init`` writes, served on 127.0.0.1 (its base URL); stopped after."""
    pytest.importorskip("openenv.core", reason="the openenv extra: pip install -e '.[openenv]'")
    pythonpath = os.pathsep.join([str(tmp_path), *sys.path])
    env = {**os.environ, "PYTHONPATH": pythonpath}
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env", "--output-dir", str(tmp_path)],
                   check=True, capture_output=True, env=env, timeout=120)  # fmt: skip
    app = tmp_path / "echo_env" / "server" / "app.py"  # its own advice: raise it for concurrent sessions
    app.write_text(app.read_text().replace("max_concurrent_envs=1", "max_concurrent_envs=8"))
    port = _free_port()
    command = [sys.executable, "-m", "uvicorn", "echo_env.server.app:app", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None, "the echo server exited"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_openenv_echo_steps_and_passes_the_audit(echo_server, tiny_model_dir, tmp_path, capsys):
    from glassrl.agents.hubs.openenv import OpenEnvEnvironment

    env = OpenEnvEnvironment(echo_server, observation_field="echoed_message")
    env.reset(PromptRecord("Say something."))
    step = env.step("hello", ())
    assert step.observations == ("hello",) and not step.done
    assert step.reward_parts == {"openenv": pytest.approx(0.5)}  # the echo environment's 0.1 per character
    wrong = OpenEnvEnvironment(echo_server, observation_field="text")
    wrong.reset(PromptRecord("Say something."))
    with pytest.raises(GlassrlError, match="has no field 'text'; it has echoed_message, message_length"):
        wrong.step("hello", ())
    with pytest.raises(GlassrlError, match="OpenEnv server http://127.0.0.1:1: ConnectionError"):
        OpenEnvEnvironment("http://127.0.0.1:1").reset(PromptRecord("x"))

    maker = _write(
        tmp_path / "echo.py",
        "from glassrl.agents.hubs.openenv import OpenEnvEnvironment\n\n\ndef make():\n"
        f"    return OpenEnvEnvironment({echo_server!r}, observation_field='echoed_message')\n",
    )
    data = _write(tmp_path / "echo.jsonl", "".join(json.dumps({"prompt": f"Say {w}."}) + "\n" for w in ("a", "b")))
    assert main(_audit(tiny_model_dir, tmp_path, data, f"{maker}:make", ["hi", "there", "again"])) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("render        2/2   ok")


def test_the_chain_sum_example_reads_the_exported_files_beside_the_examples():
    """examples/hubs/reasoning_gym_chain_sum.yaml (its data exported first, as its header says)."""
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig

    examples = Path(__file__).resolve().parents[2] / "examples"
    cfg = load_config(TrainConfig, examples / "hubs" / "reasoning_gym_chain_sum.yaml", [])
    assert cfg.data.train == str(examples / "data" / "rg_chain_sum_train.jsonl")
    assert cfg.data.test == str(examples / "data" / "rg_chain_sum_eval.jsonl")
    assert cfg.model.actor == "default-rg"
    # what moved greedy accuracy (docs/agentic.md): greedy evaluation, a small annealed lr, groups of 16 at T 0.7
    assert (cfg.logging.eval_k, cfg.actor_optim.decay, cfg.rollout.n, cfg.rollout.temperature) == (1, "cosine", 16, 0.7)
    assert cfg.actor_optim.lr <= 5e-5 and cfg.algo.positive_nll_coef > 0
