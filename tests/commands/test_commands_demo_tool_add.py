"""`glassrl demo --task tool-add` and the tool-using agent model it trains (glassrl.builtin.agent_model).

The real agent model takes minutes to build; these tests build a tiny one (``TINY``) with the same
recipe: transcripts from the real environment, the tokenizer with the call tags as whole tokens,
SFT, the held-out rates.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

from glassrl import presets
from glassrl.agents import TaggedFormat, task_environment
from glassrl.builtin import agent_model, shipped
from glassrl.cli import main
from glassrl.commands import demo
from glassrl.config import load_config
from glassrl.data.collate import encode_responses
from glassrl.data.formatting import format_prompts
from glassrl.data.tasks import load_task
from glassrl.models.default_model import AGENT_SPEC, MARKER, AgentModelSpec, spec_json
from glassrl.rl.config import TrainConfig, agent_config
from glassrl.rl.resolve import resolve

TINY = AgentModelSpec(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    sft_examples=256,
    sft_steps=150,
    lr=1e-2,
    warmup_steps=5,
    eval_size=8,
)
QUIET = Console(file=io.StringIO())


@pytest.fixture(scope="module")
def tiny_agent(tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("tiny_agent")
    return path, agent_model.build_agent_model(path, seed=0, spec=TINY, console=QUIET)


def _episodes() -> list[agent_model.Episode]:
    return agent_model.sft_episodes(dataclasses.replace(AGENT_SPEC, sft_examples=400), seed=0)


def test_transcripts_answer_three_ways_with_the_environments_observations():
    episodes = _episodes()
    shares = Counter(e.behaviour for e in episodes)
    assert set(shares) == set(agent_model.BEHAVIOURS)
    assert abs(shares["call"] / 400 - AGENT_SPEC.valid_call) < 0.07
    assert abs(shares["malformed"] / 400 - AGENT_SPEC.malformed_call) < 0.07
    for e in episodes:
        a, b, total = e.record.metadata["a"], e.record.metadata["b"], str(e.record.metadata["sum"])
        assert e.turns[-1] == total  # the final answer: the sum (worked out in its head unless a call gave it)
        if e.behaviour == "head":
            assert e.turns == (total,) and e.observations == ()
        elif e.behaviour == "call":
            assert e.turns[0] == f"<call>calculator {a}+{b}</call>" and e.observations == ((total,),)
        else:  # the environment refused the call and said why
            assert len(e.observations) == 1 and e.observations[0][0].startswith("error: ")
    # the same environment the trainer runs answers the same call the same way
    call = next(e for e in episodes if e.behaviour == "malformed")
    env = task_environment("tool-add")()
    env.reset(call.record)
    assert env.step(call.turns[0], TaggedFormat(None).parse(call.turns[0])).observations == call.observations[0]
    assert agent_model.sft_episodes(dataclasses.replace(AGENT_SPEC, sft_examples=400), seed=1) != episodes


def test_sft_tokens_are_the_rollouts_tokens():
    """SFT encodes a transcript in one piece; a rollout appends each observation's own encoding to
    the sampled turns. With the tags as whole tokens the two agree token for token."""
    episodes = _episodes()
    tokenizer = agent_model.agent_tokenizer(episodes, AGENT_SPEC)
    call_format = TaggedFormat(tokenizer, describe_tools=False)
    rows = agent_model.sft_rows(episodes, tokenizer)
    for e, row in zip(episodes, rows):
        rollout = []
        for i, turn in enumerate(e.turns):
            rollout += tokenizer.encode(turn, add_special_tokens=False)
            if i < len(e.observations):
                rollout += call_format.observation(e.observations[i])[1]
        assert encode_responses(tokenizer, [row["response"]])[0] == [*rollout, tokenizer.eos_token_id]
        assert call_format.prompt_ids(e.record.prompt, ()) == format_prompts(tokenizer, [row["prompt"]])[0]
    for tag in agent_model.TAGS:  # one token each, decoded back as written
        ids = tokenizer.encode(tag, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.decode(ids) == tag
    # the longest transcript fits the model's positions with room to spare
    longest = max(
        len(p) + len(r)
        for p, r in zip(
            format_prompts(tokenizer, [r["prompt"] for r in rows]),
            encode_responses(tokenizer, [r["response"] for r in rows]),
        )
    )
    assert longest <= AGENT_SPEC.max_position_embeddings // 2


@pytest.mark.slow  # builds the tiny model (~30 s on 2 busy cores)
def test_build_records_its_mix_and_held_out_rates(tiny_agent):
    path, info = tiny_agent
    assert json.loads((path / MARKER).read_text(encoding="utf-8")) == info
    assert info["version"] == "default-agent-v1" and info["spec"] == spec_json(TINY)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    assert model.config.max_position_embeddings == TINY.max_position_embeddings
    assert model.config.vocab_size == len(tokenizer) == info["vocab_size"]
    assert sum(info["sft_behaviours"].values()) == pytest.approx(1.0)
    for how in ("greedy", "sampled"):
        rates = info[f"heldout_tool_add_{how}"]
        assert rates["n"] == TINY.eval_size and 0 <= rates["correct"] <= 1 and 0 <= rates["valid_call"] <= 1
    rows = [json.loads(line) for line in (path / "sft_data.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == TINY.sft_examples and {r["behaviour"] for r in rows} == set(agent_model.BEHAVIOURS)
    # the loaded model answers as the in-memory one did in the build
    records = load_task("tool-add", "test", size=TINY.eval_size)
    assert agent_model.heldout_tool_use(model, tokenizer, records, greedy=True) == info["heldout_tool_add_greedy"]


@pytest.mark.slow  # a second tiny build
def test_same_seed_gives_bit_identical_weights(tiny_agent, tmp_path):
    path, _ = tiny_agent
    agent_model.build_agent_model(tmp_path / "again", seed=0, spec=TINY, console=QUIET)
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (path / "model.safetensors").read_bytes()


def test_ensure_builds_once_into_its_own_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("GLASSRL_HOME", str(tmp_path))
    monkeypatch.setattr(shipped, "SHIPPED", {})  # the build path (the shipped one: test_builtin_shipped.py)
    calls = []

    def stub(out_dir, *, seed, console):  # the real build is tested above; this tests the caching
        calls.append(seed)
        out_dir.mkdir()
        (out_dir / MARKER).write_text(json.dumps({"seed": seed, "spec": spec_json(AGENT_SPEC)}))

    monkeypatch.setattr(agent_model, "build_agent_model", stub)
    path = agent_model.ensure_agent_model(console=QUIET)
    assert path == tmp_path / "models" / "default-agent-v1" and calls == [0]
    assert agent_model.ensure_agent_model(console=QUIET) == path and calls == [0]  # cached
    assert not (tmp_path / "models" / "default-v2").exists()  # the default model is another directory


def test_tool_add_preset_trains_the_agent_model_on_the_task():
    cfg = load_config(TrainConfig, presets.path(presets.TASKS["tool-add"]), [])
    resolve(cfg)
    assert cfg.model.actor == agent_model.AGENT_MODEL and cfg.data.train == "task:tool-add"
    agent = agent_config(cfg)
    assert agent is not None and agent.call_format == "tagged" and not agent.describe_tools
    assert cfg.algo.advantage == "grpo" and cfg.logging.eval_k > 1  # sampled: the rates of behaviours
    assert "tool_add" not in presets.rl_names()  # a task's preset, not an algorithm's


def test_demo_task_errors(capsys):
    assert main(["demo", "--task", "chess"]) == 2
    assert (
        capsys.readouterr().err == "glassrl demo: error: --task: no demo for task 'chess'; valid: tool-add, research\n"
    )
    assert main(["demo", "--task", "tool-add", "--algo", "ppo"]) == 2
    assert "--algo: not with --task" in capsys.readouterr().err


def test_tool_rates_reads_the_first_and_last_evaluation(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        '{"step": 0, "eval/accuracy": 0.25, "eval/tool/valid_call_rate": 0.3, "eval/tool/call_rate": 0.5}\n'
        '{"step": 1, "reward/mean": 0.5}\n'
        '{"step": 2, "eval/accuracy": 0.75, "eval/tool/valid_call_rate": 0.9, "eval/tool/call_rate": 1.0}\n'
    )
    assert demo.tool_rates(metrics) == {
        "eval/tool/valid_call_rate": (0.3, 0.9),
        "eval/accuracy": (0.25, 0.75),
        "eval/tool/call_rate": (0.5, 1.0),
    }


@pytest.mark.slow  # ~25 s on 2 busy cores: the tiny model's build (module fixture) and a 1-step run
def test_demo_task_trains_and_explains_a_multi_turn_response(tiny_agent, tmp_path, capsys):
    path, _ = tiny_agent
    out = tmp_path / "demo-tool-add"
    overrides = [
        f"model.actor={path}",
        "data.eval_size=4",
        "rollout.n=2",
        "batch.prompts_per_step=2",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=4",
    ]
    assert main(["demo", "--task", "tool-add", "--steps", "1", "--out", str(out), *overrides]) == 0
    text = capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0], rows[-1]
    for key, label in demo.TOOL_ROWS.items():  # the table shows the run's own figures
        before, after = first[key], last[key]
        cells = [f"{100 * before:.1f}%", f"{100 * after:.1f}%", f"{100 * (after - before):+.1f} points"]
        assert re.search(re.escape(label) + r"\s+│\s+" + r"\s+│\s+".join(map(re.escape, cells)) + r" │", text), key
    prompt = load_task("tool-add", "test", size=1)[0].prompt
    assert f"$ glassrl explain --model {out} --prompt '{prompt}' --sample {demo.TASK_SAMPLES}" in text
    assert f"response 0 · prompt '{prompt}'" in text and "Turns of response 0" in text
    # a sampled call: its result is in the ledger, marked as an observation (mask 0) and given no credit
    assert re.search(r"\s<result>\s.*\s—\s+—\s+0\s+obs\s*$", text, re.M)
    assert "calls calculator: ok; environment reward valid_call 0.1" in text
    assert "demo finished in" in text
