"""Shared-prefix passes (glassrl.models.shared_prefix): each distinct prompt once per chunk, the padded
path's numbers.

Log-probs, entropy, values and gradients against the padded path (float32 1e-5 / 1e-4 relative, float64
tighter) on the tiny Llama and the tiny default model: left-padded prompts of different lengths,
right-padded responses of different lengths, groups whose rows are not adjacent, micro-batches
holding parts of groups, a response with a masked hole, groups split over several chunks, eager
attention; a hand-computed layout and mask; the check that refuses an attention dropping the mask;
and the row order that groups prompts.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from transformers import AutoModelForCausalLM

import glassrl.models.shared_prefix as shared_prefix_module
from glassrl.errors import GlassrlError
from glassrl.models import load_causal_lm, load_scalar_model, response_logprobs
from glassrl.models.shared_prefix import (
    LayerCost,
    attention_mask_for,
    check_shared_prefix,
    layer_cost,
    pack_shared,
    packed_rows,
    prompt_order,
)
from glassrl.models.values import response_values
from glassrl.workers.local import Passes, micro_batched_logprobs

A, B, C = [5, 17, 42], [7, 61, 2, 30, 11, 9], [88]
# Groups A (rows 0, 2, 5), B (1, 4), C (3): not adjacent; prompts 3, 6, 1 tokens; responses 1-4 tokens.
PROMPTS = [A, B, A, C, B, A]
RESPONSES = [[3, 4, 5, 6], [12, 13], [40, 41, 42], [9], [14, 15, 16, 17], [50, 51]]


@pytest.fixture(params=["llama", "default"])
def model_path(request, tiny_lm_path, tiny_model_dir):
    return tiny_lm_path if request.param == "llama" else tiny_model_dir


@pytest.fixture(autouse=True)
def fresh_layouts(monkeypatch):
    """Each test packs anew: no layout of an earlier test's equal batch (packed_rows keeps recent ones)."""
    monkeypatch.setattr(shared_prefix_module, "_RECENT", OrderedDict())


def _both(fn):
    return fn(False), fn(True)


def test_prompt_order_groups_rows_in_first_appearance_order(make_batch):
    ids, mask, _, T = make_batch(PROMPTS, RESPONSES)
    assert prompt_order(ids, mask, T).tolist() == [0, 2, 5, 1, 4, 3]


@pytest.mark.parametrize(
    ("prompts", "responses"),
    [
        (PROMPTS, RESPONSES),
        ([B] * 4, [[3], [4, 5, 6], [7, 8], [9, 10, 11, 12]]),  # one prompt: U = 1
        ([A, B, C], [[3, 4], [5], [6, 7, 8]]),  # all distinct: U = B
        ([C, C, A], [[3, 4], [5], [6, 7, 8]]),  # the shortest prompt shared: leading columns cut
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_and_entropy_equal_padded(model_path, make_batch, prompts, responses, temperature):
    model = load_causal_lm(model_path, device="cpu")
    ids, mask, P, T = make_batch(prompts, responses)
    response = mask[:, P:].bool()
    with torch.no_grad():
        (lp, ent), (slp, sent) = _both(
            lambda shared: response_logprobs(
                model, ids, mask, T, temperature=temperature, chunk_size=2, with_entropy=True, shared_prefix=shared
            )
        )
    torch.testing.assert_close(slp[response], lp[response], rtol=0, atol=1e-5)
    torch.testing.assert_close(sent[response], ent[response], rtol=0, atol=1e-5)
    assert lp[response].std() > 0.1  # far from uniform: the comparison has something to compare


def test_response_with_a_masked_hole_equals_padded(tiny_lm_path, make_batch):
    """Positions masked out in the middle of a response: the mask, not the layout, decides what is attended."""
    model = load_causal_lm(tiny_lm_path, device="cpu")
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    mask[0, P + 1] = 0
    mask[4, P + 1 : P + 3] = 0
    response = mask[:, P:].bool()
    with torch.no_grad():
        (lp, _), (slp, _) = _both(lambda shared: response_logprobs(model, ids, mask, T, shared_prefix=shared))
    torch.testing.assert_close(slp[response], lp[response], rtol=0, atol=1e-5)


@pytest.mark.parametrize(("dtype", "rtol", "atol"), [(torch.float32, 1e-4, 1e-5), (torch.float64, 1e-6, 1e-6)])
def test_gradients_equal_padded(model_path, make_batch, dtype, rtol, atol):
    """A prompt's gradient is the sum over its samples, through the cache's index_select: summed before
    the prompt's layers rather than after, so the order of additions differs. Float64 is not exact
    either: Llama's RMSNorm computes in float32 whatever the weights (LlamaRMSNorm.forward), which
    leaves ~2e-7 of the largest gradient; float32 ~1e-6. ``atol`` is relative to each tensor's largest."""
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    response = mask[:, P:].bool()
    grads = []
    for shared in (False, True):
        model = load_causal_lm(model_path, device="cpu").to(dtype).train()
        lp, ent = response_logprobs(model, ids, mask, T, temperature=0.8, with_entropy=True, shared_prefix=shared)
        torch.where(response, lp + 0.1 * ent, 0.0).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        scale = g.abs().max().item()
        torch.testing.assert_close(grads[1][name], g, rtol=rtol, atol=atol * scale, msg=name)
    assert sum(g.abs().sum() for g in grads[0].values()) > 0


@pytest.mark.parametrize("micro_batch", [1, 2, 4, 6])
def test_micro_batches_holding_parts_of_groups(model_path, make_batch, micro_batch):
    """The log-prob pass (reference, old log-probs) over micro-batches that split groups: same numbers, row order."""
    model = load_causal_lm(model_path, device="cpu")
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    response = mask[:, P:].bool()
    batch = {"input_ids": ids, "attention_mask": mask.bool(), "response_mask": response}
    (lp, ent), (slp, sent) = _both(
        lambda shared: micro_batched_logprobs(model, batch, Passes(micro_batch, shared_prefix=shared), True)
    )
    torch.testing.assert_close(slp[response], lp[response], rtol=0, atol=1e-5)
    torch.testing.assert_close(sent[response], ent[response], rtol=0, atol=1e-5)


def test_refuses_packed_with_shared_prefix(tiny_lm_path, make_batch):
    model = load_causal_lm(tiny_lm_path, device="cpu")
    ids, mask, _, T = make_batch(PROMPTS, RESPONSES)
    with pytest.raises(ValueError, match="packed and shared_prefix"):
        response_logprobs(model, ids, mask, T, packed=True, shared_prefix=True)


def test_layout_hand_table(tiny_lm_path, make_batch):
    """Prompt A (2 tokens) with two responses of 2, prompt B (1 token) with one of 2: one row (a group
    per chunk beats repeating A), each response's last token left out (it predicts nothing), the tree
    mask and the padded positions."""
    model = load_causal_lm(tiny_lm_path, device="cpu")
    ids, mask, P, T = make_batch([[5, 6], [7], [5, 6]], [[10, 11], [20, 21], [12, 13]])
    rows = pack_shared(ids, mask, T, layer_cost(model.config))
    assert rows.input_ids.tolist() == [[5, 6, 10, 12, 7, 20]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 2, 0, 1]]
    source, valid = rows.response_sources(T)
    assert torch.where(valid, source, -1).tolist() == [[1, 2], [4, 5], [1, 3]]  # 11 from 10, 13 from 12
    allowed = rows.attention_mask[0, 0].long().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],  # response 12 13 sees prompt A and itself, not 10 11
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ]


def test_narrow_rows_repeat_a_prompt_and_equal_padded(tiny_lm_path, make_batch, monkeypatch):
    """Chunks no wider than 8: groups split into several chunks, the prompt in each; the numbers are
    still the padded path's."""
    model = load_causal_lm(tiny_lm_path, device="cpu")
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    narrow = pack_shared(ids, mask, T, layer_cost(model.config), width=8)
    assert (narrow.input_ids == B[0]).sum() == 2  # prompt B (6 tokens), responses placing 1 and 3: two chunks
    assert (narrow.input_ids == A[1]).sum() == 2  # prompt A (3), placing 3, 2, 1: 8, then a second chunk
    monkeypatch.setattr(shared_prefix_module, "pack_shared", lambda *a: pack_shared(*a, width=8))
    response = mask[:, P:].bool()
    with torch.no_grad():
        (lp, ent), (slp, sent) = _both(
            lambda shared: response_logprobs(model, ids, mask, T, with_entropy=True, shared_prefix=shared)
        )
    torch.testing.assert_close(slp[response], lp[response], rtol=0, atol=1e-5)
    torch.testing.assert_close(sent[response], ent[response], rtol=0, atol=1e-5)


def test_cheapest_width_by_the_estimate(tiny_lm_path, make_batch):
    """The layout of least estimated cost among the candidate widths; whole groups place each prompt once."""
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    real = int(mask.sum())
    placed = real - 2 * len(A) - len(B) - len(RESPONSES)  # A is in 3 rows, B in 2; no response's last token
    wide = pack_shared(ids, mask, T, LayerCost(per_token=1.0, per_pair=0.0))
    assert len(wide.index[wide.index >= 0].unique()) == placed
    # One prompt token, four responses of 4, each placing 3 (P+T = 5): widths 5, 10, 20 give (4, 4),
    # (2, 10), (1, 13): 16, 20, 13 tokens; R·W² 64, 200, 169.
    ids, mask, P, T = make_batch([[9]] * 4, [[1, 2, 3, 4]] * 4)
    shapes = [pack_shared(ids, mask, T, LayerCost(1.0, 0.0), width=w).input_ids.shape for w in (5, 10, 20)]
    assert shapes == [(4, 4), (2, 10), (1, 13)]
    assert pack_shared(ids, mask, T, LayerCost(per_token=1.0, per_pair=0.0)).input_ids.shape == (1, 13)
    assert pack_shared(ids, mask, T, LayerCost(per_token=0.0, per_pair=1.0)).input_ids.shape == (4, 4)


@pytest.mark.parametrize("head", ["value-head", "token-classification"])
def test_values_equal_padded(tiny_lm_path, make_batch, head):
    critic = load_scalar_model(tiny_lm_path, head=head, device="cpu")
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    response = mask[:, P:].bool()
    with torch.no_grad():
        values, shared = _both(lambda s: response_values(critic, ids, mask, T, shared_prefix=s))
    torch.testing.assert_close(shared[response], values[response], rtol=0, atol=1e-5)
    assert values[response].std() > 0


def test_eager_attention_takes_an_additive_mask(tiny_lm_path, make_batch):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, attn_implementation="eager").eval()
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    response = mask[:, P:].bool()
    check_shared_prefix(model)
    with torch.no_grad():
        (lp, _), (slp, _) = _both(lambda shared: response_logprobs(model, ids, mask, T, shared_prefix=shared))
    torch.testing.assert_close(slp[response], lp[response], rtol=0, atol=1e-5)


def test_check_refuses_an_attention_that_drops_the_mask(tiny_lm_path, monkeypatch):
    model = load_causal_lm(tiny_lm_path, device="cpu")
    check_shared_prefix(model)  # sdpa honours it
    monkeypatch.setattr(shared_prefix_module, "attention_mask_for", lambda model, allowed: None)
    with pytest.raises(GlassrlError, match="model.shared_prefix.*does not keep the responses"):
        check_shared_prefix(model)


def test_attention_without_custom_masks_is_refused(tiny_lm_path):
    model = load_causal_lm(tiny_lm_path, device="cpu")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(GlassrlError, match="model.shared_prefix: llama with attention 'flash_attention_2'"):
        attention_mask_for(model, torch.ones(1, 1, 2, 2, dtype=torch.bool))


def test_a_batch_packed_again_takes_its_layout(tiny_lm_path, make_batch, monkeypatch):
    """The reference pass and the update pack equal micro-batches: the second packing returns the first
    layout (equal contents, other tensors); a batch differing in one token, or packed for another
    layout, is packed anew; the kept layouts are bounded in bytes, the newest always kept."""
    model = load_causal_lm(tiny_lm_path, device="cpu")
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    first, _ = packed_rows(model, ids, mask, T, shared_prefix=True)
    again, again_mask = packed_rows(model, ids.clone(), mask.clone(), T, shared_prefix=True)
    assert again is first and again_mask is first.attention_mask
    changed = ids.clone()
    changed[0, P] += 1
    other, _ = packed_rows(model, changed, mask, T, shared_prefix=True)
    fresh = pack_shared(changed, mask, T, layer_cost(model.config))
    assert other is not first and torch.equal(other.input_ids, fresh.input_ids)
    assert torch.equal(other.attention_mask, fresh.attention_mask) and torch.equal(other.index, fresh.index)
    padding_free, none = packed_rows(model, ids, mask, T, shared_prefix=False)
    assert none is None and padding_free.attention_mask is None
    assert len(shared_prefix_module._RECENT) == 3
    monkeypatch.setattr(shared_prefix_module, "_RECENT_BYTES", 1)
    packed_rows(model, ids, mask, T, shared_prefix=True)
    assert list(shared_prefix_module._RECENT.values()) == [first]
