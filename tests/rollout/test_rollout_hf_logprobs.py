"""HFRolloutEngine(sampling_logprobs=True): the log-probs kept while sampling equal one forward
pass over the finished batch (what the trainer computes), on both sampling paths, and keeping
them changes no sampled token."""

from __future__ import annotations

import pytest
import torch

from glassrl.data.formatting import format_prompt
from glassrl.models import load_causal_lm, load_tokenizer, response_logprobs
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.hf import HFRolloutEngine, decode, generate_with_hf

PROMPTS = ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？"]


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    return load_causal_lm(tiny_model_dir, dtype="float32", device="cpu"), load_tokenizer(tiny_model_dir)


@pytest.mark.parametrize("sample", [decode, generate_with_hf], ids=["decode", "generate"])
@pytest.mark.parametrize(
    "params",
    [SamplingParams(16, temperature=0.7, top_k=5), SamplingParams(16), SamplingParams(16, greedy=True)],
    ids=["t0.7-top5", "t1", "greedy"],
)
def test_kept_logprobs_equal_one_forward_pass(model_and_tokenizer, sample, params):
    model, tokenizer = model_and_tokenizer
    prompts = [format_prompt(tokenizer, p) for p in PROMPTS]
    engine = HFRolloutEngine(model, tokenizer, sampling_logprobs=True)
    engine.sample = sample
    batch = engine.generate(prompts, n=2, params=params, generator=torch.Generator().manual_seed(0))
    plain = HFRolloutEngine(model, tokenizer)
    plain.sample = sample
    same = plain.generate(prompts, n=2, params=params, generator=torch.Generator().manual_seed(0))
    assert torch.equal(batch.response_ids, same.response_ids) and same.rollout_logprobs is None

    T = batch.response_ids.shape[1]
    temperature = 1.0 if params.greedy else params.temperature
    with torch.no_grad():
        expected, _ = response_logprobs(model, batch.input_ids, batch.attention_mask, T, temperature=temperature)
    mask = batch.response_mask
    assert batch.rollout_logprobs.shape == mask.shape and bool((batch.rollout_logprobs[~mask] == 0).all())
    # π at the temperature, not truncated by top-k: the trainer's π_old (atol: float32 KV cache vs one pass)
    torch.testing.assert_close(batch.rollout_logprobs[mask], expected[mask], rtol=0, atol=1e-4)
