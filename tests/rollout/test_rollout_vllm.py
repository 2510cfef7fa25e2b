"""The vLLM rollout engine (glassrl.rollout.vllm) against the Hugging Face engine on the tiny model.

GPU only, and vllm installed: these tests have never run in this repository (no GPU here).
"""

from __future__ import annotations

import pytest
import torch

from glassrl.data.formatting import format_prompt
from glassrl.models import load_causal_lm, load_tokenizer, response_logprobs
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.hf import HFRolloutEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
vllm = pytest.importorskip("vllm")

from glassrl.rollout.vllm import VLLMRolloutEngine  # noqa: E402

PROMPTS = ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？"]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, dtype="float32", device="cuda")
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = VLLMRolloutEngine.colocated(model, tokenizer, gpu_memory_utilization=0.2, sleep=True, seed=0)
    return model, tokenizer, engine, [format_prompt(tokenizer, p) for p in PROMPTS]


def test_greedy_matches_the_hf_engine_and_follows_weight_updates(setup):
    model, tokenizer, engine, prompts = setup
    greedy = SamplingParams(max_new_tokens=12, greedy=True)
    hf = HFRolloutEngine(model, tokenizer)
    gen = torch.Generator("cuda").manual_seed(0)
    assert (
        engine.generate(prompts, n=1, params=greedy, generator=gen).texts
        == hf.generate(prompts, n=1, params=greedy, generator=gen).texts
    )
    with torch.no_grad():  # an update of the actor: the next rollout must see it
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    after = engine.generate(prompts, n=1, params=greedy, generator=gen)
    assert after.texts == hf.generate(prompts, n=1, params=greedy, generator=gen).texts


def test_sampled_logprobs_are_the_trainers(setup):
    model, _, engine, prompts = setup
    params = SamplingParams(max_new_tokens=12, temperature=0.7)
    batch = engine.generate(prompts, n=4, params=params, generator=torch.Generator("cuda").manual_seed(1))
    assert batch.group_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    T = batch.response_ids.shape[1]
    with torch.no_grad():
        expected, _ = response_logprobs(model, batch.input_ids, batch.attention_mask, T, temperature=0.7)
    mask = batch.response_mask
    assert (batch.rollout_logprobs[mask] - expected[mask]).abs().max() < 1e-2  # other kernels, same π


def test_sleep_frees_gpu_memory_between_rollouts(setup):
    _, _, engine, prompts = setup
    torch.cuda.synchronize()
    free_asleep = torch.cuda.mem_get_info()[0]
    engine.llm.wake_up()
    free_awake = torch.cuda.mem_get_info()[0]
    engine.llm.sleep(level=1)
    assert free_asleep > free_awake  # the KV cache and weights left the GPU while asleep
