"""Padding-free passes (glassrl.models.packing): the same numbers as the padded batch, no padding.

A hand-computed packing table; log-probs, entropy, values and gradients of the packed path
against the padded one on a tiny Llama (tolerance 1e-5, float32); the same on random batches
(hypothesis); and check_packing failing on a decoder whose mask ignores the packing.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassrl.errors import GlassrlError
from glassrl.models import load_causal_lm, load_scalar_model, response_logprobs, response_values
from glassrl.models.packing import check_packing, pack, unpack

PROMPTS = [[5, 17, 42], [7, 61, 2, 30, 11, 9], [88]]
RESPONSES = [[3, 4, 5, 6], [12, 13], [40, 41, 42]]


def test_pack_table():
    """Three rows of width L = 5: [pad 5 6 | 7 pad], [8 9 | 10 11], [pad pad 12 | pad pad].

    Each row's last real token (7, 11, 12) is a target only, never placed. First-fit decreasing:
    row 1 (3 tokens placed) opens packed row 0; row 0 (2) fits beside it (3 + 2 <= 5); row 2
    (none) too. One packed row, 5 wide.
    """
    ids = torch.tensor([[0, 5, 6, 7, 0], [0, 8, 9, 10, 11], [0, 0, 12, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 1, 1], [0, 0, 1, 0, 0]])
    packed = pack(ids, mask)
    assert packed.input_ids.tolist() == [[8, 9, 10, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert packed.index.tolist() == [[-1, 3, 4, -1, -1], [-1, 0, 1, 2, -1], [-1, -1, -1, -1, -1]]
    source, valid = packed.response_sources(2)  # response positions 3, 4: predicted from 2, 3
    assert source.tolist() == [[4, -1], [1, 2], [-1, -1]]
    assert valid.tolist() == [[True, False], [True, True], [False, False]]  # row 2 has no response token
    assert unpack(torch.tensor([1.0, 2.0, 3.0]), valid).tolist() == [[1.0, 0.0], [2.0, 3.0], [0.0, 0.0]]


def test_rows_no_wider_than_the_batch():
    """Rows never exceed the padded width, so attention never costs more than padded; short
    sequences share rows."""
    mask = torch.zeros(6, 10, dtype=torch.bool)
    for b, n in enumerate([10, 9, 5, 5, 1, 2]):
        mask[b, 10 - n :] = True
    packed = pack(torch.ones(6, 10, dtype=torch.long), mask)
    assert packed.input_ids.shape == (3, 10)  # placed (the last token of each left out): 9 + 1 | 8 | 4 + 4
    placed = packed.index[packed.index >= 0].tolist()
    assert len(placed) == len(set(placed)) == 9 + 8 + 4 + 4 + 0 + 1  # one place each


def _both(fn):
    """fn(packed) for packed False and True."""
    return fn(False), fn(True)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_and_entropy_equal_padded(tiny_lm_path, make_batch, temperature):
    model = load_causal_lm(tiny_lm_path, device="cpu")
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    response = mask[:, P:].bool()
    with torch.no_grad():
        (lp, ent), (plp, pent) = _both(
            lambda packed: response_logprobs(
                model, ids, mask, T, temperature=temperature, chunk_size=2, with_entropy=True, packed=packed
            )
        )
    torch.testing.assert_close(plp[response], lp[response], rtol=0, atol=1e-5)
    torch.testing.assert_close(pent[response], ent[response], rtol=0, atol=1e-5)
    assert (plp[~response] == 0).all() and (pent[~response] == 0).all()
    assert lp[response].std() > 0.5  # far from uniform: the comparison has something to compare


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 5e-5), (torch.float64, 1e-10)])
def test_gradients_equal_padded(tiny_lm_path, make_batch, dtype, atol):
    """Float32 differs by summation order only (~1e-6 of gradients of size ~10): float64 agrees to 1e-10."""
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    response = mask[:, P:].bool()
    grads = []
    for packed in (False, True):
        model = load_causal_lm(tiny_lm_path, device="cpu").to(dtype).train()
        lp, ent = response_logprobs(model, ids, mask, T, temperature=0.8, with_entropy=True, packed=packed)
        torch.where(response, lp + 0.1 * ent, 0.0).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=atol, msg=name)


def test_detached_entropy_has_no_gradient(tiny_lm_path, make_batch):
    """entropy_grad=False (the on-policy update's metric): same values, outside the graph."""
    model = load_causal_lm(tiny_lm_path, device="cpu")
    ids, mask, _, T = make_batch(PROMPTS, RESPONSES)
    lp, ent = response_logprobs(model, ids, mask, T, with_entropy=True, entropy_grad=False)
    _, ent_grad = response_logprobs(model, ids, mask, T, with_entropy=True)
    assert lp.requires_grad and not ent.requires_grad and ent_grad.requires_grad
    torch.testing.assert_close(ent, ent_grad.detach())


@pytest.mark.parametrize("head", ["token-classification", "value-head"])
def test_values_equal_padded(tiny_lm_path, make_batch, head):
    torch.manual_seed(11)
    critic = load_scalar_model(tiny_lm_path, head=head, device="cpu")
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    response = mask[:, P:].bool()
    with torch.no_grad():
        values, packed = _both(lambda packed: response_values(critic, ids, mask, T, packed=packed))
    torch.testing.assert_close(packed[response], values[response], rtol=0, atol=1e-5)
    assert (packed[~response] == 0).all()


# make_batch is a pure function and the model is only read: nothing to reset between examples
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 7)), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_random_batches_equal_padded(tiny_lm_path, make_batch, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 100, (p,), generator=gen).tolist() for p, _ in lengths]
    responses = [torch.randint(3, 100, (r,), generator=gen).tolist() for _, r in lengths]
    ids, mask, P, T = make_batch(prompts, responses)
    response = mask[:, P:].bool()
    model = _model(str(tiny_lm_path))
    with torch.no_grad():
        (lp, ent), (plp, pent) = _both(
            lambda packed: response_logprobs(model, ids, mask, T, with_entropy=True, packed=packed)
        )
    torch.testing.assert_close(plp[response], lp[response], rtol=0, atol=1e-5)
    torch.testing.assert_close(pent[response], ent[response], rtol=0, atol=1e-5)


@functools.cache
def _model(path: str):
    return load_causal_lm(path, device="cpu")


def test_check_packing_passes_on_llama(tiny_lm_path):
    check_packing(load_causal_lm(tiny_lm_path, device="cpu"))
    torch.manual_seed(11)
    check_packing(load_scalar_model(tiny_lm_path, head="value-head", device="cpu"))


def test_check_packing_refuses_a_mask_that_ignores_packing(tiny_lm_path, monkeypatch):
    """Without transformers' detection of packed sequences the decoder attends across them."""
    import transformers.masking_utils as masking

    model = load_causal_lm(tiny_lm_path, device="cpu")
    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)
    with pytest.raises(GlassrlError, match="model.padding_free: llama .* attends across packed sequences"):
        check_packing(model)
