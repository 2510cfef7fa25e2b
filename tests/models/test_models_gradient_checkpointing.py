"""model.gradient_checkpointing: the decoder layers recompute in backward, and the gradients are the plain ones."""

from __future__ import annotations

import pytest
import torch

from glassrl.errors import GlassrlError
from glassrl.models import load_causal_lm, load_scalar_model, response_logprobs
from glassrl.models.memory import enable_gradient_checkpointing
from glassrl.models.values import response_values

PROMPTS = [[5, 17, 42], [7, 61, 2, 30, 11, 9]]
RESPONSES = [[3, 4, 5, 6], [12, 13]]


def _grads_and_layer_calls(model, loss_of):
    calls = []
    # the forward of a module within the first layer, counted (module hooks do not run in the recompute)
    mlp = next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")).mlp
    forward = mlp.forward
    mlp.forward = lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs)
    model.train()
    loss_of(model).backward()
    del mlp.forward
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, len(calls)


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_checkpointed_layers_recompute_and_give_the_same_gradients(tiny_lm_path, make_batch, role):
    ids, mask, _, T = make_batch(PROMPTS, RESPONSES)
    resp = mask[:, -T:].bool()
    if role == "actor":
        load = lambda: load_causal_lm(tiny_lm_path, device="cpu")  # noqa: E731
        loss_of = lambda m: torch.where(resp, response_logprobs(m, ids, mask, T, with_entropy=True)[0], 0.0).sum()  # noqa: E731
    else:
        # the value head is drawn fresh at each load: the same seed, the same head
        load = lambda: torch.manual_seed(0) and load_scalar_model(tiny_lm_path, head="value-head", device="cpu")  # noqa: E731
        loss_of = lambda m: torch.where(resp, response_values(m, ids, mask, T), 0.0).pow(2).sum()  # noqa: E731
    plain, plain_calls = _grads_and_layer_calls(load(), loss_of)
    model = load()
    assert enable_gradient_checkpointing(model) == 1
    checkpointed, calls = _grads_and_layer_calls(model, loss_of)
    assert (plain_calls, calls) == (1, 2)  # the layer ran again in backward: its activations were not kept
    assert plain.keys() == checkpointed.keys() and len(plain) > 0
    for name, g in plain.items():
        torch.testing.assert_close(checkpointed[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_a_model_without_support_is_refused():
    with pytest.raises(GlassrlError, match="model.gradient_checkpointing: Linear does not support it"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))
