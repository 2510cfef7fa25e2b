"""Shared-prefix passes (glassrl.models.shared_prefix): each distinct prompt once, the padded path's numbers.

Log-probs, entropy and gradients against the padded path (float32 1e-5 / 1e-4 relative, float64
tighter) on the tiny Llama and the tiny default model: left-padded prompts of different lengths,
right-padded responses of different lengths, groups whose rows are not adjacent, micro-batches
holding parts of groups, a response with a masked hole; and the
row order that groups prompts.
"""

from __future__ import annotations

import pytest
import torch

from glassrl.models import load_causal_lm, response_logprobs
from glassrl.models.shared_prefix import prompt_order
from glassrl.workers.local import Passes, micro_batched_logprobs

A, B, C = [5, 17, 42], [7, 61, 2, 30, 11, 9], [88]
# Groups A (rows 0, 2, 5), B (1, 4), C (3): not adjacent; prompts 3, 6, 1 tokens; responses 1-4 tokens.
PROMPTS = [A, B, A, C, B, A]
RESPONSES = [[3, 4, 5, 6], [12, 13], [40, 41, 42], [9], [14, 15, 16, 17], [50, 51]]


@pytest.fixture(params=["llama", "default"])
def model_path(request, tiny_lm_path, tiny_model_dir):
    return tiny_lm_path if request.param == "llama" else tiny_model_dir


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
