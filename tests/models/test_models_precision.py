"""fp32 master weights + bf16 autocast keep small updates; bf16 weights lose them (issue 11).

One AdamW step at lr 1e-6 (first step: Δ ≈ −lr·sign(g), Kingma & Ba 2015, Algorithm 1)
on the tiny Llama of tests/models/conftest.py, on CPU. Measured: fp32 changes 91.0 % of
the weights (the rest have a zero gradient: embedding rows of absent tokens), mixed
precision the same 91.0 % with cosine 0.986 to the fp32 update, bf16 weights 0.1 %.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from glassrl.errors import GlassrlError
from glassrl.models.logprobs import response_logprobs
from glassrl.models.precision import Autocast, check_master_weights, compute_dtype, compute_precision


@pytest.fixture(scope="module")
def base(tiny_lm_path):
    return AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, 100, (4, 10), generator=g), torch.ones(4, 10, dtype=torch.bool)


def _one_step(model, batch, dtype: torch.dtype) -> torch.Tensor:
    """Every weight's change (flattened, float32) after one AdamW step at lr 1e-6 on −mean log π."""
    ids, mask = batch
    before = [p.detach().float().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.95), weight_decay=0.0)
    with compute_precision("cpu", dtype):
        logprobs, _ = response_logprobs(model, ids, mask, 6)
    (-logprobs.mean()).backward()
    optimizer.step()
    return torch.cat([(p.detach().float() - b).flatten() for p, b in zip(model.parameters(), before)])


def test_bf16_compute_with_fp32_masters_updates_like_fp32(base, batch):
    fp32 = _one_step(copy.deepcopy(base), batch, torch.float32)
    mixed = _one_step(copy.deepcopy(base), batch, torch.bfloat16)
    naive = _one_step(copy.deepcopy(base).to(torch.bfloat16), batch, torch.float32)
    changed = fp32 != 0
    assert changed.float().mean() > 0.85  # what can change at all (zero-gradient rows cannot)
    # Mixed precision moves the same weights as fp32, in nearly the same direction.
    assert ((mixed != 0) == changed).float().mean() > 0.999
    assert torch.nn.functional.cosine_similarity(mixed, fp32, dim=0) > 0.95
    assert (mixed - fp32).abs().max() < 5e-6  # each |Δ| ≤ lr·(1 + ε): a sign flip at most
    # bf16 weights: w + Δ rounds back to w almost everywhere.
    assert (naive != 0).float().mean() < 0.05 * changed.float().mean()


def test_autocast_forward_runs_in_bf16_and_returns_float32(base, batch):
    ids, mask = batch
    seen = []
    model = copy.deepcopy(base)
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))

    def forward(model, micro):
        return response_logprobs(model, micro[0], micro[1], 6)[0]

    out = Autocast(forward, "bfloat16")(model, batch)
    hook.remove()
    assert seen == [torch.bfloat16]
    assert out.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    exact = forward(model, batch)
    assert torch.allclose(out, exact, atol=0.1) and not torch.equal(out, exact)


def test_half_precision_weights_are_refused_with_bf16_compute(base):
    check_master_weights(base, torch.bfloat16)  # float32: fine
    with pytest.raises(GlassrlError, match="model.dtype: trainable weights are stored in bfloat16"):
        check_master_weights(copy.deepcopy(base).to(torch.bfloat16), torch.bfloat16)
    with pytest.raises(GlassrlError, match="model.compute_dtype: unknown 'fp8'"):
        compute_dtype("fp8")
