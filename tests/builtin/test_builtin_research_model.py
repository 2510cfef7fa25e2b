"""The research-agent model's recipe (glassrl.builtin.research_model): the scripted transcripts and
their shares, the tokens SFT and the rollout agree on, and the decision probability π(a_4 | s_4)
on a hand-computed case."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from glassrl.agents import TaggedFormat
from glassrl.builtin import research_model, shipped
from glassrl.builtin.agent_model import TAGS, agent_tokenizer, sft_rows
from glassrl.data.collate import encode_responses
from glassrl.data.formatting import format_prompts
from glassrl.data.tasks import research
from glassrl.models.default_model import RESEARCH_SPEC

SPEC = dataclasses.replace(RESEARCH_SPEC, sft_examples=400)


@pytest.fixture(scope="module")
def episodes():
    return research_model.sft_episodes(SPEC, seed=0)


@pytest.fixture(scope="module")
def tokenizer(episodes):
    return agent_tokenizer(episodes, SPEC, isolate=False)


def test_transcripts_behave_in_the_specs_shares_and_score_as_scripted(episodes):
    shares = Counter(e.behaviour for e in episodes)
    for behaviour in research.BEHAVIOURS:
        assert abs(shares[behaviour] / len(episodes) - getattr(SPEC, behaviour)) < 0.06, behaviour
    # the share that opens the official page: the dialogue's π(a_4 | s_4) = 0.6
    assert SPEC.official + SPEC.no_cite == pytest.approx(0.6)
    expected = {"official": 2.5, "no_cite": 2.0, "rumour": 0.0, "forecast": 0.0}
    for e in episodes:
        episode = research.episode_of(e.record)
        assert len(e.turns) == 3 and len(e.observations) == 2
        assert e.turns[1] == research_model.official_call(episode, research.OPENS[e.behaviour])
        assert not any(text.startswith("error") for obs in e.observations for text in obs)
        assert research.score(e.turns[2], episode) == expected[e.behaviour]
    assert research_model.sft_episodes(SPEC, seed=1) != episodes


def test_draw_behaviour_cuts_the_unit_interval_by_the_shares():
    cuts = [0.0, 0.49, 0.5, 0.59, 0.6, 0.84, 0.85, 0.999]
    assert [research_model.draw_behaviour(SPEC, u) for u in cuts] == [
        "official",
        "official",
        "no_cite",
        "no_cite",
        "rumour",
        "rumour",
        "forecast",
        "forecast",
    ]


def test_sft_tokens_are_the_rollouts_tokens_and_s4_is_their_prefix(episodes, tokenizer):
    """SFT encodes a transcript in one piece; a rollout appends each observation's own encoding to
    the sampled turns: the same tokens. The decision state s_4 and the official call are a prefix
    of an official transcript's tokens."""
    call_format = TaggedFormat(tokenizer, describe_tools=False)
    rows = sft_rows(episodes, tokenizer)
    prompts = format_prompts(tokenizer, [r["prompt"] for r in rows])
    responses = encode_responses(tokenizer, [r["response"] for r in rows])
    for e, prompt, response in zip(episodes, prompts, responses):
        rollout = []
        for i, turn in enumerate(e.turns):
            rollout += tokenizer.encode(turn, add_special_tokens=False)
            if i < len(e.observations):
                rollout += call_format.observation(e.observations[i])[1]
        assert response == [*rollout, tokenizer.eos_token_id]
        if e.behaviour == "official":
            state = research_model.decision_context(e.record, tokenizer)
            call = tokenizer.encode(e.turns[1], add_special_tokens=False)
            assert prompt + response[: len(state) - len(prompt) + len(call)] == state + call
    for tag in TAGS:
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    longest = max(len(p) + len(r) for p, r in zip(prompts, responses))
    assert longest <= RESEARCH_SPEC.max_position_embeddings - 64  # room for a longer sampled answer


class Bigram(torch.nn.Module):
    """A stub causal LM whose next-token logits depend on the current token only: ``table[token]``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.table[input_ids])  # (B, L, V)


def test_action_probability_hand_computed():
    # vocabulary {0, 1, 2}; after 0 the model puts 0.6 on 1 (the dialogue's π(a_4 | s_4)), after 1 0.8 on 2
    table = torch.log(torch.tensor([[0.2, 0.6, 0.2], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]))
    probs = research_model.action_probabilities(Bigram(table), [2, 0], [1, 2])
    torch.testing.assert_close(probs, torch.tensor([0.6, 0.8]))
    assert math.prod(probs.tolist()) == pytest.approx(0.48)
    # one token of context: position 0 predicts the first action token
    torch.testing.assert_close(research_model.action_probabilities(Bigram(table), [1], [2]), torch.tensor([0.8]))


def test_opened_kind_reads_the_first_open_page_call():
    episode = research.DIALOGUE
    turn = SimpleNamespace
    calls = [
        turn(tool_calls=({"name": "search", "arguments": "Google Cloud"},)),
        turn(tool_calls=({"name": "open_page", "arguments": episode.url("rumour")},)),
        turn(tool_calls=({"name": "open_page", "arguments": {"url": episode.official_url}},)),
    ]
    assert research_model.opened_kind(calls, episode) == "rumour"
    assert research_model.opened_kind(calls[2:], episode) == "official"
    assert research_model.opened_kind(calls[:1], episode) == "none"
    assert research_model.opened_kind([turn(tool_calls=({"name": "open_page", "arguments": "x"},))], episode) == "other"


def test_init_model_agent_research_builds_once_and_prints_its_figures(monkeypatch, tmp_path, capsys):
    import json

    from glassrl.cli import main
    from glassrl.models.default_model import MARKER, spec_json

    monkeypatch.setenv("GLASSRL_HOME", str(tmp_path))
    monkeypatch.setattr(shipped, "SHIPPED", {})  # the build path (the shipped one: test_builtin_shipped.py)
    calls = []

    def stub(out_dir, *, seed, console):  # the real build is the demo's; this tests the command and the cache
        calls.append(seed)
        out_dir.mkdir()
        info = {
            "seed": seed,
            "spec": spec_json(RESEARCH_SPEC),
            "parameters": 1234,
            "sft_steps": 5,
            "train_loss": 0.5,
            "build_time_s": 1.0,
            "sft_behaviours": {"official": 0.5, "no_cite": 0.1, "rumour": 0.25, "forecast": 0.15},
            "heldout_research_sampled": {
                "n": 100,
                "score": 1.25,
                "accuracy": 0.5,
                "temporal": 0.5,
                "citation": 0.5,
                "opened": {"official": 0.6, "rumour": 0.4, "news": 0.0},
            },
            "heldout_decision": {"n": 100, "official": 0.6, "rumour": 0.25, "forecast": 0.15, "news": 0.0},
        }
        (out_dir / MARKER).write_text(json.dumps(info))

    monkeypatch.setattr(research_model, "build_research_model", stub)
    assert main(["init-model", "--agent", "research"]) == 0
    assert main(["init-model", "--agent", "research"]) == 0 and calls == [0]  # cached
    out = capsys.readouterr().out
    assert str(tmp_path / "models" / "default-research-v1") in out and "1,234 parameters" in out
    assert "SFT transcripts: official 50%, no_cite 10%, rumour 25%, forecast 15%" in out
    assert "rubric score 1.25 of 2.5" in out and "opened official 60%, rumour 40%" in out
    assert "π(open the official page | s_4), mean over 100 episodes: 0.600" in out
    assert not (tmp_path / "models" / "default-agent-v1").exists()
