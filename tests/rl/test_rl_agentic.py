"""Multi-turn training on the tiny model (CPU): GRPO and PPO runs whose ledgers hold every turn and
observation, tool-add with real tool calls, explain --model on a multi-turn run, the config keys.

The tiny model samples its own turns against ``agentic_env.Retry`` (a simulated user: one
observation after the first turn), so the runs are real end to end; for tool calls, which the
tiny model never writes, ``agentic_env.ScriptedSampler`` writes the turns while the trainer
computes every number with the model. The tiny model has 64 positions: responses of 40–50 tokens.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.rl.config import AgentConfig, TrainConfig, agent_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV = Path(__file__).resolve().parent / "agentic_env.py"


def _overrides(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"model.actor={model}",
        "data.train=task:tool-add",
        "data.eval_size=4",
        f"output_dir={out}",
        "steps=2",
        "rollout.n=2",
        "rollout.max_new_tokens=40",
        "batch.prompts_per_step=4",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=4",
        "logging.ledger_every=1",
        "logging.ledger_samples=64",
        "logging.eval_group_by=null",
        "reward.sources=[{name: numeric}]",
        *extra,
    ]


def _trainer(preset: str, overrides: list[str]):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / f"{preset}.yaml", overrides), progress=False)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _check_turns(response) -> None:
    """Every token of every turn is in the ledger, with its role and turn; observations carry no credit."""
    assert response.turns, response
    assert response.turns[-1].observation_end == response.length == len(response.tokens)
    for k, turn in enumerate(response.turns):
        generated = response.tokens[turn.start : turn.end]
        observed = response.tokens[turn.end : turn.observation_end]
        assert all(t.role == "generated" and t.turn == k for t in generated)
        assert all(t.role == "observation" and t.turn == k and not t.response_mask for t in observed)
        assert all(t.advantages is None and t.token_rewards is None for t in observed)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["grpo", "ppo"])
def test_multi_turn_run_keeps_every_turn_in_the_ledger(preset, tiny_model_dir, tmp_path):
    from glassrl.ledger import read_jsonl
    from glassrl.report.metrics_doc import undocumented

    run = tmp_path / "run"
    trainer = _trainer(preset, _overrides(tiny_model_dir, run, f"rollout.agent.environment={ENV}:Retry"))
    trainer.train()
    rows = _rows(run)
    keys = {k for r in rows for k in r if k != "step"}
    assert undocumented(keys) == []
    assert {"response/turns/mean", "tool/valid_call_rate", "reward/env/first/mean", "eval/tool/call_rate"} <= keys
    ledger = read_jsonl(run / "ledgers" / "step_000002.jsonl")
    assert len(ledger.responses) == trainer.resolved.responses_per_step
    two = [r for r in ledger.responses if len(r.turns) == 2]
    assert two, "no response reached its second turn"
    assert rows[-1]["response/turns/mean"] == pytest.approx(
        sum(len(r.turns) for r in ledger.responses) / len(ledger.responses)
    )
    for response in ledger.responses:
        _check_turns(response)
    gamma, lam = ledger.gamma, ledger.lam
    for response in two:
        first, second = response.turns
        assert first.finish_reason == "continue" and first.reward_parts == {"first": 0.25}
        k, m = first.end - 1, second.start  # the last generated token before the observation, the first after
        last = response.tokens[k]
        # the environment's reward sits on the turn's last generated token, beside the KL
        assert last.token_scores == pytest.approx(0.25) and last.token_rewards == pytest.approx(
            0.25 - ledger.beta * last.kl, abs=1e-6
        )
        valid = [t for t in response.tokens if t.response_mask]
        assert valid[-1].token_scores == pytest.approx(response.score)  # the outcome on the last generated token
        if preset == "ppo":  # GAE carries V and A across the observation (DESIGN §1)
            nxt = response.tokens[m]
            assert last.deltas == pytest.approx(last.token_rewards + gamma * nxt.values - last.values, abs=1e-5)
            assert last.advantages == pytest.approx(last.deltas + gamma * lam * nxt.advantages, abs=1e-5)
        else:  # one advantage for the response: S = Σ r_i counts the environment's reward
            assert {t.advantages for t in valid} == {valid[0].advantages}


def test_explain_on_a_multi_turn_checkpoint_reproduces_the_ledger(tiny_model_dir, tmp_path):
    """As tests/rl/test_rl_phases_explain_agree.py, with observations: explain recomputes every
    log-prob, value and reference log-prob with the observations in the context."""
    from glassrl.cli import build_parser
    from glassrl.commands import explain_model
    from glassrl.ledger import read_jsonl
    from glassrl.rl import explain
    from glassrl.rollout.base import Turn, concat_rollouts

    run_dir = tmp_path / "run"
    overrides = _overrides(
        tiny_model_dir,
        run_dir,
        f"rollout.agent.environment={ENV}:Retry",
        "data.eval_size=0",
        "logging.checkpoint_every=1",
        "logging.report=false",
    )
    _trainer("ppo", overrides).train()
    trained = read_jsonl(run_dir / "ledgers" / "step_000002.jsonl")
    checkpoint = run_dir / "checkpoints" / "step_00000001"
    args = build_parser(only="explain").parse_args(["explain", "--model", str(checkpoint), "--prompt", "-"])
    run = explain_model.open_run(args)
    policy = explain.load_policy(run)
    assert policy.multi_turn
    texts = {r.group_id: r.prompt for r in trained.responses}
    prompts = [explain.prompt_record(texts[g], None) for g in range(len(texts))]
    prompt_ids = policy.prompt_ids(prompts)
    parts = []
    for response in trained.responses:
        ids = [t.token_id for t in response.tokens]
        turns = [
            Turn(t.start, t.end, t.observation_end, t.finish_reason, "", "", t.tool_calls, t.reward_parts)
            for t in response.turns
        ]
        part = explain.given_response(
            policy, prompt_ids[response.group_id], ids, response.finish_reason, turns=turns, text=response.response
        )
        part.group_index = torch.full_like(part.group_index, response.group_id)
        parts.append(part)
    explained = explain.explain_rollout(run, policy, concat_rollouts(parts, policy.pad_id), prompts, prompt_ids)
    assert dataclasses.replace(explained, step=2) == trained
    assert any(len(r.turns) == 2 for r in trained.responses)


@pytest.mark.slow
def test_tool_add_with_tool_calls(tiny_model_dir, tmp_path, monkeypatch):
    """task:tool-add with a tool from the config: calls parsed and run, results in the context,
    valid_call on the calling turn, tool metrics; the model's sampling is scripted."""
    import agentic_env

    from glassrl.ledger import read_jsonl

    monkeypatch.setattr("glassrl.agents.HFTurnSampler", agentic_env.ScriptedSampler)
    run = tmp_path / "run"
    extra = [
        f"rollout.agent.tools=[{ENV}:c]",
        "rollout.agent.valid_call_reward=0.1",
        "rollout.agent.describe_tools=false",
        "rollout.max_new_tokens=50",
        "rollout.n=4",
    ]
    trainer = _trainer("grpo", _overrides(tiny_model_dir, run, *extra))
    metrics = trainer.train()
    assert 0 < metrics["tool/valid_call_rate"] < 1 and metrics["tool/calls/ok"] == 1.0
    assert metrics["reward/env/valid_call/mean"] == pytest.approx(0.1 * metrics["tool/valid_call_rate"])
    assert 0 < metrics["task/accuracy"] < 1
    ledger = read_jsonl(run / "ledgers" / "step_000002.jsonl")
    called = [r for r in ledger.responses if r.turns[0].finish_reason == "tool_call"]
    assert called
    for response in called:
        _check_turns(response)
        first = response.turns[0]
        call_text = "".join(t.token for t in response.tokens[first.start : first.end])
        observed = "".join(t.token for t in response.tokens[first.end : first.observation_end])
        a, b = call_text.removeprefix("<call>c ").removesuffix("</call>").split("+")
        assert observed == f" <result>{int(a) + int(b)}</result>\n"  # the calculator's answer, in the context
        assert first.tool_calls[0]["status"] == "ok" and first.reward_parts == {"valid_call": 0.1}
        assert response.tokens[first.end - 1].token_scores == pytest.approx(0.1)
        assert response.score == float(response.response == str(int(a) + int(b)))


def test_config_selects_the_environment(tiny_model_dir, tmp_path):
    from glassrl.agents import ToolEnvironment
    from glassrl.models import load_tokenizer
    from glassrl.rl.build import environment_maker, prompt_format

    cfg = load_config(TrainConfig, None, ["data.train=task:tool-add"])
    assert agent_config(cfg) == AgentConfig()  # an agentic task: multi-turn with its defaults
    env = environment_maker(cfg, agent_config(cfg))()
    assert isinstance(env, ToolEnvironment) and [t.name for t in env.tools] == ["calculator"]
    assert env.valid_call_reward == 0.1  # tool-add's format reward
    tokenizer = load_tokenizer(tiny_model_dir)
    (ids,) = prompt_format(cfg, tokenizer)(
        [dataclasses.replace(_record("12+34=?"), metadata={"sum": 46, "task": "tool-add"})]
    )
    assert "calculator" in tokenizer.decode(ids)  # the tools described before the prompt
    assert agent_config(load_config(TrainConfig, None, [])) is None  # arith-verify: single-turn
    cfg = load_config(TrainConfig, None, ["rollout.agent.tools=[calculator, python]", "rollout.agent.max_calls=2"])
    env = environment_maker(cfg, cfg.rollout.agent)()
    assert [t.name for t in env.tools] == ["calculator", "python"] and env.max_calls == 2


def _record(prompt: str):
    from glassrl.data.records import PromptRecord

    return PromptRecord(prompt, None, {}, "test")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.agent=true"], "rollout.agent: no environment for the episodes"),
        (["rollout.agent.environment=tool-add", "rollout.agent.tools=[calculator]"], "brings its own tools"),
        (["rollout.agent.environment=chess"], "rollout.agent.environment = 'chess': unknown; valid: tool-add"),
        (["rollout.agent.environment=tool-add", "rollout.agent.max_calls=2"], "rollout.agent.max_calls = 2: ignored"),
        (
            ["rollout.agent.tools=[calculator]", "rollout.agent.max_turns=0"],
            "rollout.agent.max_turns = 0: must be >= 1",
        ),
        (["data.train=[{path: 'task:tool-add'}, {path: 'task:research'}]"], "mixes agentic tasks"),
    ],
)
def test_config_errors_name_the_key(overrides, message):
    with pytest.raises(GlassrlError, match=message.replace("(", r"\(")):
        load_config(TrainConfig, None, overrides)


def test_a_bad_tool_or_environment_spec_names_its_key(tmp_path):
    from glassrl.rl.build import environment_maker

    cfg = load_config(TrainConfig, None, ["rollout.agent.tools=[calculator, nowhere.py:tool]"])
    with pytest.raises(GlassrlError, match="rollout.agent.tools: tool 'nowhere.py:tool': no file"):
        environment_maker(cfg, cfg.rollout.agent)
    cfg = load_config(TrainConfig, None, [f"rollout.agent.environment={ENV}:c"])
    with pytest.raises(GlassrlError, match="rollout.agent.environment: environment .*: calling it raised"):
        environment_maker(cfg, cfg.rollout.agent)
    cfg = load_config(TrainConfig, None, [f"rollout.agent.environment={ENV}:ScriptedSampler"])
    with pytest.raises(GlassrlError, match="not an environment|calling it raised"):
        environment_maker(cfg, cfg.rollout.agent)


QWEN2_TEXTS = ["What is 1+2=? Use the calculator tool to compute a sum, then answer with the number."] * 20


@pytest.mark.parametrize("call_format", ["tagged", "hermes"])
def test_the_ledger_prompt_is_the_ids_the_policy_saw(call_format, tmp_path):
    """issue 31, item 6: the ledger showed the reward's prompt text (18 tokens), not the 81 the
    model saw, the tools' system message missing. prompt_as_seen, decoded from the rollout's own
    ids, encodes back to the prompt as the call format renders it."""
    from glassrl.ledger import read_jsonl
    from helpers import QWEN25_TEMPLATE, tiny_qwen2_dir

    specials = dict.fromkeys(("eos_token", "pad_token", "unk_token"), "<|im_end|>")
    config = {"tokenizer_class": "Qwen2Tokenizer", **specials, "chat_template": QWEN25_TEMPLATE}
    model = tiny_qwen2_dir(tmp_path / "qwen2", QWEN2_TEXTS, config, positions=2048)
    run = tmp_path / "run"
    overrides = _overrides(model, run, f"rollout.agent.call_format={call_format}", "steps=1")
    trainer = _trainer("grpo", [*overrides, "rollout.max_new_tokens=8", "data.eval_size=0"])
    trainer.train()
    formatted = {tuple(ids) for ids in trainer.data.ids(trainer.data.sources[0].records)}
    ledger = read_jsonl(run / "ledgers" / "step_000001.jsonl")
    for response in ledger.responses:
        ids = trainer.tokenizer(response.prompt_as_seen, add_special_tokens=False)["input_ids"]
        assert tuple(ids) in formatted
        assert "calculator" in response.prompt_as_seen  # the tools' description: the system message (tagged) or schemas
        assert "calculator" not in response.prompt  # the text the rewards read: the task's prompt
