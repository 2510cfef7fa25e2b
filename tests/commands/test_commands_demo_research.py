"""`glassrl demo --task research`: PPO and GRPO on the research task, their held-out rubric, the
decision probability and the credit read from their ledgers (glassrl.commands.demo_research).

The real research-agent model takes minutes to build; the end-to-end test builds a tiny one with
the same recipe and runs each algorithm for a few steps: what it checks is the wiring (every turn
in the ledger, the tables from the runs' own files), not that the tiny model learns.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from glassrl import presets
from glassrl.builtin import research_model
from glassrl.builtin.registry import BUILTIN_MODELS, REBUILD
from glassrl.cli import main
from glassrl.config import load_config
from glassrl.data.tasks import research
from glassrl.ledger import read_jsonl
from glassrl.ledger.credit import action_rows, observation_values, turn_credit
from glassrl.ledger.model import LedgerTurn, ResponseLedger, TokenRow
from glassrl.models.default_model import RESEARCH_SPEC
from glassrl.rl.config import TrainConfig, agent_config
from glassrl.rl.resolve import resolve

TINY = dataclasses.replace(
    RESEARCH_SPEC,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    sft_examples=128,
    sft_steps=40,
    batch_size=16,
    lr=1e-2,
    warmup_steps=5,
    eval_size=2,
)
QUIET = Console(file=io.StringIO())


def test_the_presets_train_the_research_model_on_the_task_with_ppo_and_grpo():
    assert presets.TASKS["research"] == "research_grpo" and presets.COMPANIONS["research"] == ("research_ppo",)
    ppo, grpo = (load_config(TrainConfig, presets.path(p), []) for p in ("research_ppo", "research_grpo"))
    for cfg in (ppo, grpo):
        resolve(cfg)
        assert cfg.model.actor == research_model.RESEARCH_MODEL and cfg.data.train == "task:research"
        agent = agent_config(cfg)
        assert agent is not None and agent.max_turns == 3 and not agent.describe_tools
        assert cfg.reward.sources == [{"name": "research_rubric", "weight": 1.0}]
    assert ppo.algo.advantage == "gae" and grpo.algo.advantage == "grpo"
    # the same episodes, batches and rollouts: only the credit differs
    for key in ("seed", "steps", "rollout", "batch", "data"):
        assert getattr(ppo, key) == getattr(grpo, key), key
    assert not {"research_ppo", "research_grpo"} & set(presets.rl_names())
    assert research_model.RESEARCH_MODEL in BUILTIN_MODELS and "--agent research" in REBUILD["default-research"]


def test_demo_research_refuses_algo(capsys):
    assert main(["demo", "--task", "research", "--algo", "ppo"]) == 2
    assert "--algo: not with --task research" in capsys.readouterr().err


def _response(kind_turns: list[tuple[int, int, int]], values: list[float | None], advantages: list[float | None]):
    """A hand-made multi-turn response: turns (start, end, observation_end), V and A per token."""
    n = kind_turns[-1][2]
    generated = {i for start, end, _ in kind_turns for i in range(start, end)}
    rows = tuple(
        TokenRow(
            index=i,
            token_id=None,
            token=f"t{i}",
            logprobs=None,
            ref_logprobs=None,
            kl=None,
            token_scores=None,
            token_rewards=None,
            values=values[i],
            deltas=None if advantages[i] is None or i not in generated else advantages[i] / 2,
            advantages=advantages[i] if i in generated else None,
            returns=None,
            whitened_advantages=None,
            response_mask=i in generated,
            step_end=None,
            role="generated" if i in generated else "observation",
        )
        for i in range(n)
    )
    turns = tuple(
        LedgerTurn(
            s, e, o, "tool_call" if o > e else "stop", ({"name": "open_page", "arguments": "u"},) if o > e else ()
        )
        for s, e, o in kind_turns
    )
    return ResponseLedger("p", "r", 2.5, 0, n, "stop", None, rows, turns)


def test_credit_per_turn_and_across_the_observation_hand_table():
    # turn 0: tokens 0-1 generated, 2-3 observation; turn 1: token 4 generated
    values = [0.5, 1.5, 1.6, 1.7, 2.0]
    response = _response([(0, 2, 4), (4, 5, 5)], values, [0.2, 1.0, None, None, 0.5])
    first, second = turn_credit(response)
    assert (first.sum_advantage, first.mean_advantage, first.peak) == (pytest.approx(1.2), pytest.approx(0.6), 1)
    assert first.calls == ("open_page u",) and second.calls == () and second.peak == 4
    assert [r.index for r in action_rows(response, 0)] == [0, 1]
    assert observation_values(response, 0) == ([1.6, 1.7], 2.0)  # V across the page, then V(s_m)
    assert observation_values(response, 1) == ([], None)
    # GRPO: no critic, the same A on every generated token, no δ: no peak
    grpo = _response([(0, 2, 4), (4, 5, 5)], [None] * 5, [0.7, 0.7, None, None, 0.7])
    assert [(c.mean_advantage, c.peak) for c in turn_credit(grpo)] == [(pytest.approx(0.7), 1), (0.7, 4)]


def _opener(record, kind: str, score: float, finish: str = "stop") -> ResponseLedger:
    """A two-turn response to ``record`` that opened the episode's page of ``kind``."""
    url = research.episode_of(record).url(kind)
    response = _response([(0, 2, 4), (4, 5, 5)], [None] * 5, [score] * 5)
    call = ({"name": "open_page", "arguments": url},)
    first = dataclasses.replace(response.turns[0], tool_calls=call)
    return dataclasses.replace(
        response, prompt=record.prompt, score=score, finish_reason=finish, turns=(first, response.turns[1])
    )


def test_pick_responses_takes_an_official_and_a_trap_opener_from_one_ledger(tmp_path):
    from glassrl.commands.demo_research import pick_responses
    from glassrl.ledger.model import Ledger

    a, b = research.records("train", 0, 2)
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()

    def write(step, *responses):
        Ledger("grpo", 1.0, None, 0.0, None, responses, step).to_jsonl(ledgers / f"step_{step:06d}.jsonl")

    # step 8, the newest: officials only; step 4: the best-scored official and a forecast opener
    # (no rumour: the trap falls back to the forecast), a truncated rumour opener left out
    write(4, _opener(a, "official", 2.0), _opener(b, "forecast", 0.0), _opener(a, "official", 2.5))
    write(4 + 4, _opener(a, "official", 2.5), _opener(b, "rumour", 0.0, finish="length"))
    picked = pick_responses(tmp_path)
    assert {role: (step, r.score) for role, (step, r) in picked.items()} == {"official": (4, 2.5), "trap": (4, 0.0)}
    assert picked["trap"][1].prompt == b.prompt
    # a rumour opener is preferred to a forecast opener
    write(12, _opener(a, "official", 2.5), _opener(b, "forecast", 0.0), _opener(a, "rumour", 0.0))
    assert [r.prompt for _, r in pick_responses(tmp_path).values()] == [a.prompt, a.prompt]
    # no ledger with both: each role from the newest ledger that has it
    for path in ledgers.iterdir():
        path.unlink()
    write(4, _opener(b, "rumour", 0.0))
    write(8, _opener(a, "official", 2.0))
    assert {role: step for role, (step, _) in pick_responses(tmp_path).items()} == {"official": 8, "trap": 4}


@pytest.fixture(scope="module")
def tiny_research(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny_research")
    research_model.build_research_model(path, seed=0, spec=TINY, console=QUIET)
    return path


# ~1 min on 2 busy cores: the tiny model's build and two 5-step runs (PPO: 4 of them the critic's warm-up)
@pytest.mark.slow
def test_demo_research_trains_both_and_keeps_every_turn_in_the_ledger(tiny_research, tmp_path, capsys):
    out = tmp_path / "demo-research"
    overrides = [
        f"model.actor={tiny_research}",
        "data.eval_size=2",
        "rollout.n=2",
        "rollout.max_new_tokens=160",
        "batch.prompts_per_step=2",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=4",
        "logging.ledger_every=1",
        "logging.ledger_samples=4",
    ]
    assert main(["demo", "--task", "research", "--steps", "5", "--out", str(out), *overrides]) == 0
    text = capsys.readouterr().out
    for name in ("ppo", "grpo"):
        rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
        assert rows[0]["step"] == 0 and "eval/reward/rubric/citation/mean" in rows[-1]
        for path in sorted((out / name / "ledgers").glob("step_*.jsonl")):
            for response in read_jsonl(path).responses:
                # every turn is in the ledger: the turns tile the response, observation tokens marked
                spans = response.turns
                assert spans and spans[0].start == 0 and spans[-1].observation_end == response.length
                assert all(a.observation_end == b.start for a, b in zip(spans, spans[1:]))
                for t in spans:
                    roles = [r.role for r in response.tokens[t.start : t.observation_end]]
                    assert roles == ["generated"] * (t.end - t.start) + ["observation"] * (t.observation_end - t.end)
                assert all(r.advantages is None for r in response.tokens if r.role == "observation")
                if name == "ppo":  # V is read on every token, observations included
                    assert all(r.values is not None for r in response.tokens)
                else:  # one advantage per response, on every generated token
                    assert len({round(r.advantages, 6) for r in response.tokens if r.response_mask}) <= 1
    first = research.records("test", 0, 2)[0]
    assert "held-out reports" in text and "after PPO" in text and "after GRPO" in text
    assert f"prompt: {first.prompt}" in text and re.search(r"│\s+product\s+│", text)
    assert "where the credit went" in text and "demo finished in" in text
