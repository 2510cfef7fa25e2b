"""The decoding loop with its linear weights reordered for oneDNN (glassrl.rollout.packed_weights): the same
distribution as the plain loop to float32 rounding, F.linear where it is faster or where autograd or another
autocast runs, the weights reordered again when a newer policy version loads, the model left as it was, and
the auto rule (weights larger than the last-level cache) with its start-up words."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from glassrl.rollout import packed_weights
from glassrl.rollout.base import SamplingParams
from glassrl.rollout.hf import HFRolloutEngine, decode, left_pad, sampler_for
from glassrl.rollout.packed_weights import (
    MIN_ROWS,
    PackedWeights,
    last_level_cache_bytes,
    linear_layers,
    why_not_packed,
)
from glassrl.rollout.stops import StopSet

PROMPTS = ["请问1+1=2？", "Is 12+34=47?", "请问30+5=35？"]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from glassrl.models import load_causal_lm, load_tokenizer

    return HFRolloutEngine(load_causal_lm(tiny_model_dir, device="cpu"), load_tokenizer(tiny_model_dir))


def _prompts(engine, n):
    from glassrl.data.formatting import format_prompt

    ids, mask = left_pad([format_prompt(engine.tokenizer, p) for p in PROMPTS], engine.pad_id)
    return ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)


def _decode(engine, packed, params, seed=0, **kwargs):
    ids, mask = _prompts(engine, 4)
    logprobs = torch.zeros(len(ids), params.max_new_tokens)
    g = torch.Generator().manual_seed(seed)
    tokens = decode(
        engine.model,
        ids,
        mask,
        params,
        stops=kwargs.pop("stops", engine.stops),
        pad_id=engine.pad_id,
        generator=g,
        logprobs_out=logprobs,
        packed=packed,
        **kwargs,
    )
    return tokens, logprobs, g.get_state()


def _untouched(model):
    return all("forward" not in vars(m) and "_glassrl_packed" not in vars(m) for m in model.modules())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_decoding_samples_the_plain_loops_distribution(engine, seed):
    """Padded prompts, 12 rows ending at different steps (the batch shrinks through MIN_ROWS): the sampled
    tokens' log-probs agree to float32 rounding, and the generator advances alike."""
    params = SamplingParams(max_new_tokens=24)
    plain, lp_plain, g_plain = _decode(engine, False, params, seed)
    fast, lp_fast, g_fast = _decode(engine, True, params, seed)
    assert torch.equal(g_plain, g_fast)
    # the same tokens here (no near tie among these draws); where they agree, so do their log-probs
    assert torch.equal(plain, fast)
    torch.testing.assert_close(lp_fast, lp_plain, atol=2e-5, rtol=0)
    lengths = engine.stops.response_mask(plain, engine.tokenizer.decode)[0].sum(-1)
    assert lengths.min() < lengths.max()  # rows ended mid-way
    assert _untouched(engine.model)


def test_products_below_min_rows_or_under_autograd_run_f_linear(monkeypatch):
    calls = []
    real = packed_weights._onednn_linear
    monkeypatch.setattr(packed_weights, "_onednn_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    layer = torch.nn.Linear(64, 48)
    torch.manual_seed(0)
    small, large = torch.randn(MIN_ROWS - 1, 64), torch.randn(2, MIN_ROWS, 64)
    with torch.no_grad():
        expected_small, expected_large = F.linear(small, layer.weight, layer.bias), layer(large)
        with PackedWeights(layer, rows=8):
            assert torch.equal(layer(small), expected_small)  # F.linear itself
            assert calls == []
            torch.testing.assert_close(layer(large), expected_large, atol=1e-5, rtol=1e-5)
            assert calls == [torch.Size([2, MIN_ROWS, 64])]
    with PackedWeights(layer, rows=8):
        layer(large).sum().backward()  # under autograd: F.linear, gradients as ever
    assert len(calls) == 1 and layer.weight.grad is not None
    assert _untouched(layer)


def test_bfloat16_autocast_reorders_in_bfloat16_as_autocast_computes():
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no AVX-512 BF16 for oneDNN")
    layer = torch.nn.Linear(64, 48)
    x = torch.randn(8, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(x)
        with PackedWeights(layer, rows=8):
            assert layer._glassrl_packed.dtype == torch.bfloat16
            out = layer(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
    with torch.no_grad(), PackedWeights(layer, rows=8), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16  # reordered in float32, called under autocast: F.linear's way


class _Versions:
    """Loads "newer weights" (the LM head scaled) before forward pass ``at``, as asynchronous training may."""

    def __init__(self, model, at):
        self.model, self.at, self.calls = model, at, 0

    def refresh(self):
        self.calls += 1
        if self.calls == self.at:
            with torch.no_grad():
                self.model.lm_head.weight.mul_(1.5)
        return int(self.calls >= self.at)


def test_newer_weights_loaded_mid_rollout_are_reordered_again(engine):
    params = SamplingParams(max_new_tokens=8)
    original = engine.model.lm_head.weight.detach().clone()
    runs = []
    try:
        for packed in (False, True):
            with torch.no_grad():
                engine.model.lm_head.weight.copy_(original)
            versions = torch.zeros(12, 8, dtype=torch.long)
            tokens, logprobs, _ = _decode(
                engine, packed, params, versions=_Versions(engine.model, at=4), versions_out=versions
            )
            runs.append((tokens, logprobs, versions))
    finally:
        with torch.no_grad():
            engine.model.lm_head.weight.copy_(original)
    (t0, l0, v0), (t1, l1, v1) = runs
    assert torch.equal(v0, v1) and int((v0 == 1).sum()) > 12  # tokens from the 4th on came from the newer weights
    assert torch.equal(t0, t1)
    torch.testing.assert_close(l1, l0, atol=2e-5, rtol=0)
    stale, stale_logprobs, _ = _decode(engine, True, params)  # never scaled: what a stale reordering gives
    assert not torch.allclose(stale_logprobs[:, 3:], l1[:, 3:], atol=1e-3)


def test_the_model_is_restored_when_decoding_fails(engine):
    def broken(_texts):
        raise RuntimeError("decode_text failed")

    params = SamplingParams(max_new_tokens=4)
    with pytest.raises(RuntimeError, match="decode_text failed"):
        _decode(engine, True, params, stops=StopSet(engine.stops.ids, ("never",)), decode_text=broken)
    assert _untouched(engine.model)


def test_auto_rule_and_start_up_words(engine, monkeypatch):
    model = engine.model
    weights = sum(m.weight.numel() * 4 for m in linear_layers(model))
    assert "fit in the last-level cache" in why_not_packed(model, cache_bytes=weights)
    assert why_not_packed(model, cache_bytes=weights - 1) is None
    sample, line = sampler_for(model)
    assert sample is decode and "MKL's matrix products as they are: its linear weights" in line
    monkeypatch.setattr(packed_weights, "last_level_cache_bytes", lambda: 1024)
    sample, line = sampler_for(model)
    assert isinstance(sample, functools.partial) and sample.func is decode and sample.keywords == {"packed": True}
    assert line.startswith("glassrl's decoding loop") and "reordered for oneDNN at each rollout" in line
    monkeypatch.setattr(packed_weights, "last_level_cache_bytes", lambda: None)
    assert "(the CPU's cache size unknown)" in why_not_packed(model)


def test_why_not_names_each_condition():
    half = torch.nn.Sequential(torch.nn.Linear(4, 4)).half()
    assert "float16" in why_not_packed(half, cache_bytes=0)
    assert (
        why_not_packed(torch.nn.Sequential(torch.nn.ReLU()), cache_bytes=0) == "the model has no torch.nn.Linear layer"
    )
    hooked = torch.nn.Sequential(torch.nn.Linear(4, 4))
    hooked[0].forward = lambda x: x  # as accelerate's offloading hooks replace it
    assert "accelerate" in why_not_packed(hooked, cache_bytes=0)
    assert why_not_packed(torch.nn.Sequential(torch.nn.Linear(4, 4)), cache_bytes=0) is None


def test_last_level_cache_is_the_largest_sysfs_reports(tmp_path):
    for index, size in enumerate(["48K", "2048K", "266240K", "1M"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 266240 * 1024
    assert last_level_cache_bytes(tmp_path / "absent") is None
