"""Chunked log-probs and entropy against the naive log_softmax(...).gather(...) reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import checkpoint

import glassrl.models.logprobs as logprobs_module
from glassrl.errors import GlassrlError
from glassrl.models import (
    load_causal_lm,
    logprobs_from_hidden,
    naive_entropy,
    naive_logprobs,
    position_ids_from_mask,
    response_logprobs,
)

# --- hand-computed -----------------------------------------------------------


def test_position_ids_table():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]])
    expected = torch.tensor([[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 3, 3], [0, 0, 1, 2, 3, 4]])
    assert torch.equal(position_ids_from_mask(mask), expected)
    assert torch.equal(position_ids_from_mask(mask.bool()), expected)


def _identity_head(v: int) -> torch.nn.Linear:
    head = torch.nn.Linear(v, v, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(v))
    return head


def test_hand_computed_logprob_and_entropy():
    """Logits log([1, 2, 1]) -> p = [1/4, 1/2, 1/4]; with T = 2, p ∝ [1, √2, 1]."""
    hidden = torch.log(torch.tensor([[[1.0, 2.0, 1.0], [1.0, 2.0, 1.0]]]))  # (1, 2, 3), identity head
    targets = torch.tensor([[1, 0]])
    lp, ent = logprobs_from_hidden(hidden, _identity_head(3), targets, with_entropy=True, chunk_size=1)
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.5), math.log(0.25)]]))
    # H = -(2·¼·ln ¼ + ½·ln ½) = 1.5 ln 2
    torch.testing.assert_close(ent, torch.full((1, 2), 1.5 * math.log(2)))

    lp2, _ = logprobs_from_hidden(hidden, _identity_head(3), targets, temperature=2.0)
    r2 = math.sqrt(2)
    torch.testing.assert_close(lp2, torch.tensor([[math.log(r2 / (2 + r2)), math.log(1 / (2 + r2))]]))


# --- chunked core vs naive (invariant over shapes, chunks, temperatures) --------


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 20),
    chunk=st.integers(1, 8),
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
    seed=st.integers(0, 2**16),
)
def test_chunked_core_matches_naive(b, t, chunk, temperature, seed):
    gen = torch.Generator().manual_seed(seed)
    v, h = 37, 8
    hidden = torch.randn(b, t, h, generator=gen)
    head = torch.nn.Linear(h, v, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(v, h, generator=gen))
    targets = torch.randint(0, v, (b, t), generator=gen)
    with torch.no_grad():
        lp, ent = logprobs_from_hidden(
            hidden, head, targets, temperature=temperature, chunk_size=chunk, with_entropy=True
        )
        logits = head(hidden) / temperature  # (B, T, V)
    torch.testing.assert_close(lp, naive_logprobs(logits, targets), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, naive_entropy(logits), rtol=1e-5, atol=1e-5)
    # Log-probs of every token of the vocabulary sum to one.
    all_lp = torch.stack(
        [logprobs_from_hidden(hidden, head, torch.full_like(targets, k), temperature=temperature)[0] for k in range(v)]
    )
    torch.testing.assert_close(all_lp.exp().sum(0), torch.ones(b, t))


def test_positions_per_chunk_from_the_logits_budget():
    """chunk_size None: CHUNK_LOGITS // (B · V) positions per chunk (at least one), so at Qwen's
    vocabulary 128 positions of one row, and a small vocabulary's rows in one chunk."""
    seen = []

    class Head(torch.nn.Linear):
        def forward(self, x):
            seen.append(x.shape[:2])
            return super().forward(x)

    for b, t, v, per_chunk in [(1, 300, 151_936, 128), (2, 300, 151_936, 64), (4, 300, 292, 300)]:
        seen.clear()
        with torch.no_grad():
            logprobs_from_hidden(torch.randn(b, t, 2), Head(2, v, bias=False), torch.zeros(b, t, dtype=torch.long))
        assert seen[0] == (b, per_chunk) and sum(c for _, c in seen) == t


def test_without_entropy_returns_none():
    hidden, head = torch.randn(2, 3, 4), torch.nn.Linear(4, 5)
    _, ent = logprobs_from_hidden(hidden, head, torch.zeros(2, 3, dtype=torch.long))
    assert ent is None


# --- on a real (tiny) causal LM, left-padded prompts of different lengths -------

PROMPTS = [[5, 17, 42], [7, 61, 2, 30, 11, 9], [88]]
RESPONSES = [[3, 4, 5, 6], [12, 13], [40, 41, 42]]


def _naive_from_model(model, ids, mask, prompt_len, temperature):
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logits = logits[:, prompt_len - 1 : -1] / temperature  # (B, T, V)
    targets = ids[:, prompt_len:]  # (B, T)
    return naive_logprobs(logits, targets), naive_entropy(logits)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("chunk_size", [1, 3, 128])
def test_response_logprobs_match_naive_on_padded_batch(tiny_lm_path, make_batch, temperature, chunk_size):
    model = load_causal_lm(tiny_lm_path, device="cpu")
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    with torch.no_grad():
        lp, ent = response_logprobs(
            model, ids, mask, T, temperature=temperature, chunk_size=chunk_size, with_entropy=True
        )
        ref_lp, ref_ent = _naive_from_model(model, ids, mask, P, temperature)
    assert lp.shape == ent.shape == (3, T)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    # The tiny model is far from uniform: a check against log(1/V) would not pass by accident.
    assert lp.std() > 0.5


def test_padded_rows_equal_unpadded_rows(tiny_lm_path, make_batch):
    """Left padding and position ids from the mask make batching invisible."""
    model = load_causal_lm(tiny_lm_path, device="cpu")
    ids, mask, _, T = make_batch(PROMPTS, RESPONSES)
    with torch.no_grad():
        batched, _ = response_logprobs(model, ids, mask, T)
        for row, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
            one = torch.tensor([p + r])
            alone, _ = response_logprobs(model, one, torch.ones_like(one), len(r))
            torch.testing.assert_close(batched[row, : len(r)], alone[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size, path", [(2, "fused"), (2, "checkpoint"), (None, "one chunk")])
def test_gradients_match_naive(tiny_lm_path, make_batch, chunk_size, path, monkeypatch):
    """The chunks give the same parameter gradients as the naive route: the fused head backward
    (_FusedHead: a plain nn.Linear head), checkpointed chunks (any other head: here the fused path is
    switched off), and one chunk, not checkpointed (None: the tiny vocabulary's logits are within CHUNK_LOGITS)."""
    checkpointed, fused = [], []
    monkeypatch.setattr(logprobs_module, "checkpoint", lambda *a, **k: checkpointed.append(1) or checkpoint(*a, **k))
    apply = logprobs_module._FusedHead.apply
    if path == "checkpoint":
        monkeypatch.setattr(logprobs_module._FusedHead, "apply", None)
        monkeypatch.setattr(logprobs_module, "_fused_head", lambda *a: False)
    else:
        monkeypatch.setattr(logprobs_module._FusedHead, "apply", lambda *a: fused.append(1) or apply(*a))
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    resp_mask = mask[:, P:].bool()  # (B, T)
    grads = []
    for chunked in (True, False):
        model = load_causal_lm(tiny_lm_path, device="cpu").train()
        if chunked:
            lp, ent = response_logprobs(model, ids, mask, T, temperature=0.8, chunk_size=chunk_size, with_entropy=True)
            assert len(checkpointed) == (-(-T // chunk_size) if path == "checkpoint" else 0)
            assert len(fused) == (1 if path == "fused" else 0)
        else:
            lp, ent = _naive_from_model(model, ids, mask, P, 0.8)
        loss = torch.where(resp_mask, lp + 0.1 * ent, 0.0).sum()
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[1].items():
        assert g is not None and g.abs().sum() > 0, name
        torch.testing.assert_close(grads[0][name], g, rtol=1e-4, atol=5e-5, msg=name)


def test_logit_transform_refused(tiny_lm_path, make_batch):
    model = load_causal_lm(tiny_lm_path, device="cpu")
    model.config.final_logit_softcapping = 30.0
    ids, mask, _, T = make_batch(PROMPTS, RESPONSES)
    with pytest.raises(GlassrlError, match="final_logit_softcapping"):
        response_logprobs(model, ids, mask, T)


# --- at Qwen2.5-0.5B's width and full vocabulary (2 layers: 165,960,320 parameters) ------------


@pytest.fixture(scope="module")
def qwen_two_layers():
    """Qwen2.5-0.5B's configuration cut to 2 layers, float32, random weights (the tied 151,936-row embedding)."""
    from transformers import AutoModelForCausalLM

    from glassrl.builtin.qwen import ARCHITECTURES

    config = ARCHITECTURES["qwen2.5-0.5b"]()
    config.num_hidden_layers = 2
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def test_chunked_equals_naive_at_the_0_5b_width_with_the_full_vocabulary(qwen_two_layers, make_batch):
    """Values and every parameter's gradient (the tied embedding/LM head included) of log-probs + entropy:
    the chunked path (16 positions per chunk, each checkpointed) equals the naive full
    (B, T, V) log-softmax on a model of the 0.5 B width and vocabulary (issue 40)."""
    model = qwen_two_layers.train()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 151_643, (n,), generator=gen).tolist() for n in (3, 5)]
    responses = [torch.randint(0, 151_643, (n,), generator=gen).tolist() for n in (40, 27)]
    ids, mask, P, T = make_batch(prompts, responses)
    resp_mask = mask[:, P:].bool()  # (B, T)
    results = []
    for chunked in (True, False):
        model.zero_grad(set_to_none=True)
        if chunked:
            lp, ent = response_logprobs(model, ids, mask, T, temperature=0.9, chunk_size=16, with_entropy=True)
        else:
            lp, ent = _naive_from_model(model, ids, mask, P, 0.9)
        torch.where(resp_mask, lp - 0.01 * ent, 0.0).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((lp.detach()[resp_mask], ent.detach()[resp_mask], grads))
    (lp_c, ent_c, g_c), (lp_n, ent_n, g_n) = results
    torch.testing.assert_close(lp_c, lp_n, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ent_c, ent_n, rtol=1e-5, atol=1e-4)
    assert lp_n.min() < -5  # a random model over 151,936 ids: log-probs near -log V, not all zero
    for name, g in g_n.items():
        assert g.abs().sum() > 0, name
        # Rounding parts them by ≤ 1e-6 of the tensor's largest gradient (measured: 1e-7 … 6e-7); a chunk's
        # gradient lost or counted twice would part them by the order of the gradient itself.
        torch.testing.assert_close(g_c[name], g, rtol=1e-4, atol=1e-5 * g.abs().max().item(), msg=name)


def test_fused_head_keeps_the_forwards_logits_with_the_same_gradients_to_the_bit(tiny_lm_path, make_batch, monkeypatch):
    """Under KEEP_LOGITS_BYTES the backward reuses the forward's logits instead of recomputing them: the same
    matmul on the same inputs, so every gradient equals the recomputing path's bit for bit; each kept chunk is
    released as the backward passes it."""
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    resp_mask = mask[:, P:].bool()  # (B, T)
    kept_seen, grads = [], []
    forward = logprobs_module._FusedHead.forward

    def spy(ctx, *args):
        out = forward(ctx, *args)
        kept_seen.append((len(ctx.kept), ctx))
        return out

    monkeypatch.setattr(logprobs_module._FusedHead, "forward", staticmethod(spy))
    for budget in (logprobs_module.KEEP_LOGITS_BYTES, 0):
        monkeypatch.setattr(logprobs_module, "KEEP_LOGITS_BYTES", budget)
        model = load_causal_lm(tiny_lm_path, device="cpu").train()
        lp, ent = response_logprobs(model, ids, mask, T, temperature=0.8, chunk_size=2, with_entropy=True)
        torch.where(resp_mask, lp + 0.1 * ent, 0.0).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    (kept, ctx_kept), (recomputed, _) = kept_seen
    assert kept == -(-T // 2) and recomputed == 0
    assert all(z is None for z in ctx_kept.kept)  # released by the backward
    for name, g in grads[1].items():
        assert torch.equal(grads[0][name], g), name


# --- under bfloat16 autocast (model.compute_dtype: bfloat16, float32 master weights) --------------------


def _under_bf16_autocast(model, ids, mask, P, T, monkeypatch, fused, **head):
    """log-probs, entropy (response positions) and every parameter's gradient of lp·g + ent·g' computed under
    the CPU's bfloat16 autocast, by _FusedHead (``fused``) or by autograd through checkpointed chunks."""
    calls = []
    apply = logprobs_module._FusedHead.apply
    monkeypatch.setattr(logprobs_module._FusedHead, "apply", lambda *a: calls.append(a[-1]) or apply(*a))
    monkeypatch.setattr(logprobs_module, "_fused_head", lambda *a: fused)
    model.zero_grad(set_to_none=True)  # the gradients returned before stay with the caller
    resp_mask = mask[:, P:].bool()  # (B, T)
    gen = torch.Generator().manual_seed(2)
    g_lp, g_ent = torch.randn(resp_mask.shape, generator=gen), torch.randn(resp_mask.shape, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = response_logprobs(model, ids, mask, T, with_entropy=True, **head)
    assert calls == ([torch.bfloat16] if fused else [])  # the fused path, told autocast's dtype
    torch.where(resp_mask, lp * g_lp + (ent * g_ent if ent.requires_grad else 0), 0.0).sum().backward()
    return lp.detach()[resp_mask], ent.detach()[resp_mask], {n: p.grad for n, p in model.named_parameters()}


# Tolerance of the gradients under bfloat16: 2⁻⁶ of each tensor's largest. bfloat16 keeps 8 significant bits
# (one ulp near a tensor's largest value is 2⁻⁸ of it), and the two paths round differently: autograd adds the
# head's bfloat16 gradient of every chunk in bfloat16 (one ToCopy node feeds all chunks), the fused backward in
# float32, and the decoder's gradients inherit the head's bfloat16 products. Measured: at most 3.7e-3 of the
# largest on the tiny model, 7.0e-3 at the 0.5 B width; a chunk lost or counted twice moves the gradient by its
# share of the positions (here ≥ 1/5), a vocabulary slice lost its rows' whole gradient.
_BF16_GRADIENT = 2**-6


@pytest.mark.parametrize(
    "temperature, chunk_size, entropy_grad, keep_budget",
    [(0.8, 2, True, None), (0.8, 2, True, 0), (1.0, 1, False, None), (1.0, 1, False, 0)],
)
def test_fused_head_under_bf16_autocast_matches_autograd(
    tiny_lm_path, make_batch, monkeypatch, temperature, chunk_size, entropy_grad, keep_budget
):
    """Under ``model.compute_dtype: bfloat16`` (the CPU's bfloat16 autocast, float32 master weights) the fused
    head backward computes what autocast computes for ``lm_head(hidden).float() / τ``: the same log-probs and
    entropy as autograd through checkpointed chunks under the same autocast (the same bfloat16 logits, float32
    reductions), and every parameter's gradient within bfloat16's rounding; the forward's logits kept (the
    default budget) or recomputed (``keep_budget`` 0), the entropy's gradient on or off (a metric)."""
    if keep_budget is not None:
        monkeypatch.setattr(logprobs_module, "KEEP_LOGITS_BYTES", keep_budget)
    ids, mask, P, T = make_batch(PROMPTS, RESPONSES)
    monkeypatch.setattr(logprobs_module, "CHUNK_LOGITS", 2 * 32 * 15)  # hidden 32: vocabulary slices of 15 rows of 100
    model = load_causal_lm(tiny_lm_path, device="cpu").train()
    head = dict(temperature=temperature, chunk_size=chunk_size, entropy_grad=entropy_grad)
    lp_f, ent_f, g_f = _under_bf16_autocast(model, ids, mask, P, T, monkeypatch, True, **head)
    lp_a, ent_a, g_a = _under_bf16_autocast(model, ids, mask, P, T, monkeypatch, False, **head)
    torch.testing.assert_close(lp_f, lp_a)
    torch.testing.assert_close(ent_f, ent_a)
    for name, g in g_a.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(g_f[name], g, rtol=0, atol=_BF16_GRADIENT * g.abs().max().item(), msg=name)


def test_fused_head_under_bf16_autocast_at_the_0_5b_width(qwen_two_layers, make_batch, monkeypatch):
    """The same at Qwen2.5-0.5B's width and vocabulary (tied embedding and LM head), 33 positions in chunks of
    8 recomputed in backward (outside KEEP_LOGITS_BYTES): values equal, every gradient within bfloat16's rounding."""
    monkeypatch.setattr(logprobs_module, "KEEP_LOGITS_BYTES", 0)
    model = qwen_two_layers.train()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 151_643, (n,), generator=gen).tolist() for n in (3, 5)]
    responses = [torch.randint(0, 151_643, (n,), generator=gen).tolist() for n in (20, 13)]
    ids, mask, P, T = make_batch(prompts, responses)
    monkeypatch.setattr(logprobs_module, "CHUNK_LOGITS", 2 * 896 * 40_000)  # hidden 896: 4 vocabulary slices
    lp_f, ent_f, g_f = _under_bf16_autocast(model, ids, mask, P, T, monkeypatch, True, temperature=0.9, chunk_size=8)
    lp_a, ent_a, g_a = _under_bf16_autocast(model, ids, mask, P, T, monkeypatch, False, temperature=0.9, chunk_size=8)
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(lp_f, lp_a)
    torch.testing.assert_close(ent_f, ent_a)
    assert lp_a.min() < -5  # over 151,936 ids
    for name, g in g_a.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(g_f[name], g, rtol=0, atol=_BF16_GRADIENT * g.abs().max().item(), msg=name)


@pytest.mark.parametrize("temperature, entropy_grad, keep_budget", [(0.8, True, None), (0.8, True, 0), (1.0, False, 0)])
def test_fused_head_under_bf16_autocast_is_nearer_the_exact_gradient(
    monkeypatch, temperature, entropy_grad, keep_budget
):
    """Against the exact (float64) derivative of what autocast computes (the logits rounded to bfloat16), the
    fused backward's head and hidden gradients are no further off than autograd's (which adds the chunks'
    bfloat16 head gradients in bfloat16; the fused path in float32), and within 2⁻⁷ of the largest: two
    bfloat16 roundings, of ∂/∂z and of the product. The forward's logits kept or (``keep_budget`` 0) recomputed."""
    if keep_budget is not None:
        monkeypatch.setattr(logprobs_module, "KEEP_LOGITS_BYTES", keep_budget)
    gen = torch.Generator().manual_seed(0)
    B, T, H, V = 2, 300, 64, 5_000
    monkeypatch.setattr(logprobs_module, "CHUNK_LOGITS", 2 * B * T * 1_300)  # the backward's vocabulary slices: 4
    hidden0, weight0 = torch.randn(B, T, H, generator=gen), torch.randn(V, H, generator=gen) / 2
    targets = torch.randint(0, V, (B, T), generator=gen)
    g_lp, g_ent = torch.randn(B, T, generator=gen), torch.randn(B, T, generator=gen)

    def loss(lp, ent):
        return (lp * g_lp).sum() + ((ent * g_ent).sum() if entropy_grad else 0)

    grads = {}
    for fused in (True, False):
        monkeypatch.setattr(logprobs_module, "_fused_head", lambda *a, fused=fused: fused)
        hidden, head = hidden0.clone().requires_grad_(), torch.nn.Linear(H, V, bias=False)
        head.weight.data.copy_(weight0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp, ent = logprobs_from_hidden(
                hidden,
                head,
                targets,
                temperature=temperature,
                chunk_size=32,
                with_entropy=True,
                entropy_grad=entropy_grad,
            )
        loss(lp, ent).backward()
        grads[fused] = (hidden.grad.double(), head.weight.grad.double())
    hidden, weight = hidden0.bfloat16().double().requires_grad_(), weight0.bfloat16().double().requires_grad_()
    exact = hidden @ weight.T  # (B, T, V), float64 of the bfloat16 inputs
    z = (exact + (exact.bfloat16().double() - exact).detach()) / temperature  # the value rounded, its derivative 1
    logp = torch.log_softmax(z, dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    loss(logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), ent if entropy_grad else ent.detach()).backward()
    for ref, fused, autograd in zip((hidden.grad, weight.grad), grads[True], grads[False]):
        assert (fused - ref).abs().max() <= (autograd - ref).abs().max()
        assert (fused - ref).abs().max() <= 2**-7 * ref.abs().max()


def test_float16_autocast_keeps_the_autograd_path():
    """glassrl offers no float16 compute: under its autocast the head stays on checkpointed autograd."""
    head = torch.nn.Linear(4, 8, bias=False)
    cpu = torch.device("cpu")
    assert logprobs_module._fused_head(head, cpu)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert logprobs_module._fused_head(head, cpu)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not logprobs_module._fused_head(head, cpu)
    assert not logprobs_module._fused_head(torch.nn.Linear(4, 8), cpu)  # a bias
