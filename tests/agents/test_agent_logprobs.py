"""Observations stay in the context: the log-probs of generated tokens after an observation, as
sampled by the real model turn after turn, equal one forward pass over the batch's full sequence
(``response_logprobs`` on ``input_ids`` / ``attention_mask``), and differ when the observation is
hidden from attention (the defect the issue names)."""

from __future__ import annotations

import pytest
import torch

from glassrl.agents import AgentRolloutEngine, HFTurnSampler, StepResult
from glassrl.data.records import PromptRecord
from glassrl.models import load_causal_lm, load_tokenizer, response_logprobs
from glassrl.rollout.base import SamplingParams

RECORDS = [PromptRecord("请问1+1=2？", source="t#0"), PromptRecord("Is 3+4=8?", source="t#1")]


class Interrupting:
    """Answers every turn with an observation for two turns, then ends the episode: the tiny
    model never calls a tool, but its later turns must be sampled with the observations in view."""

    tools = ()

    def reset(self, record):
        self.turns = 0

    def step(self, text, calls):
        self.turns += 1
        return StepResult(observations=(f"{self.turns}+1",), done=self.turns >= 3)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    return load_causal_lm(tiny_model_dir, device="cpu"), load_tokenizer(tiny_model_dir)


def sample(model, tokenizer, seed=0, temperature=1.0):
    engine = AgentRolloutEngine(HFTurnSampler(model, tokenizer), tokenizer, Interrupting, sampling_logprobs=True)
    params = SamplingParams(max_new_tokens=48, temperature=temperature)
    prompts = engine.format_prompts(RECORDS)
    generator = torch.Generator().manual_seed(seed)
    return engine.generate(prompts, n=3, params=params, generator=generator, records=RECORDS), generator


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_one_forward_pass_over_the_full_sequence(model_and_tokenizer, temperature):
    model, tokenizer = model_and_tokenizer
    batch, _ = sample(model, tokenizer, temperature=temperature)
    after_observation = torch.zeros_like(batch.response_mask)
    for b, turns in enumerate(batch.turns):
        for turn in turns[1:]:
            after_observation[b, turn.start : turn.end] = True
    assert after_observation.sum() > 10  # generated tokens that follow an observation

    T = batch.response_ids.shape[1]
    with torch.no_grad():
        recomputed, _ = response_logprobs(model, batch.input_ids, batch.attention_mask, T, temperature=temperature)
        hidden_obs = torch.cat([batch.prompt_mask, batch.response_mask], dim=1)
        wrong, _ = response_logprobs(model, batch.input_ids, hidden_obs, T, temperature=temperature)
    sampled = batch.rollout_logprobs
    assert torch.allclose(recomputed[batch.response_mask], sampled[batch.response_mask], atol=1e-4)
    # Hiding the observations changes the log-probs of every token sampled after one.
    assert (wrong - sampled)[after_observation].abs().max() > 0.1


def test_recomputed_logprobs_equal_an_unpadded_forward_pass_per_row(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    batch, _ = sample(model, tokenizer, seed=1)
    with torch.no_grad():
        T = batch.response_ids.shape[1]
        recomputed, _ = response_logprobs(model, batch.input_ids, batch.attention_mask, T)
        for b in range(len(batch)):
            prompt = batch.prompt_ids[b][batch.prompt_mask[b]]
            n = int(batch.context_lengths[b])
            sequence = torch.cat([prompt, batch.response_ids[b, :n]]).unsqueeze(0)  # (1, P_b + n)
            logits = model(input_ids=sequence).logits[0, len(prompt) - 1 : -1]  # (n, V): position P_b-1+i predicts i
            manual = torch.log_softmax(logits.float(), -1).gather(-1, sequence[0, len(prompt) :, None]).squeeze(-1)
            mask = batch.response_mask[b, :n]
            assert torch.allclose(manual[mask], recomputed[b, :n][mask], atol=1e-4)


def test_same_generator_state_same_batch(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    a, ga = sample(model, tokenizer, seed=5)
    b, gb = sample(model, tokenizer, seed=5)
    assert torch.equal(a.response_ids, b.response_ids) and a.turns == b.turns
    assert torch.equal(ga.get_state(), gb.get_state())
    assert not torch.equal(ga.get_state(), torch.Generator().manual_seed(5).get_state())


def test_hf_sampler_ends_a_turn_at_a_stop_string(model_and_tokenizer):
    """``generate``'s stop strings and trim_turn with a real model: it answers "是的，等于2！", so
    with the stop string "等于" every turn that gets that far ends right after it."""
    from glassrl.data.formatting import format_prompt

    model, tokenizer = model_and_tokenizer
    sampler = HFTurnSampler(model, tokenizer)
    contexts = [format_prompt(tokenizer, "请问1+1=2？")] * 6
    params = SamplingParams(max_new_tokens=20)
    turns = sampler.sample(contexts, [20] * 6, params, torch.Generator().manual_seed(0), ("等于",), False)
    assert any(t.ended == "stop" for t in turns)
    for turn in turns:
        text = tokenizer.decode(turn.tokens)
        assert text.endswith("等于") == (turn.ended == "stop")
        assert "等于" not in tokenizer.decode(turn.tokens[:-1])  # nothing kept past the first stop
