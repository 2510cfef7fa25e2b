"""Per-token log-probs and entropy of the response, without full-vocabulary float32 log-softmax.

Layout (DESIGN §1): ``input_ids`` (B, P+T) = left-padded prompt ⊕ right-padded
response; the logits at absolute position ``P-1+i`` predict response token
``i``, so ``logprobs[:, i] = log π(y_i | s_i)``.

The naive route builds logits (B, T, V) in float32 and a log-softmax of the
same size: at V = 151,936 and T = 1,024 that is 0.6 GB per row for each. Here
the backbone runs once, the LM head is applied to ``chunk_size`` response
positions at a time, and each chunk is reduced at once to
``gather(target) - logsumexp`` (B, C) — the idea of Liger Kernel's fused linear
cross-entropy (Hsu et al. 2024, "Liger Kernel", §3.3), and of verl's
``logprobs_from_logits_v2`` (verl/utils/torch_functional.py).

A chunk holds as many positions as keep its float32 logits within :data:`CHUNK_LOGITS` values
(128 positions at Qwen's V = 151,936; every position of a micro-batch at once for a vocabulary of a
few hundred, as the default model's),,
unless ``chunk_size`` fixes the positions.

Backward, plain bias-free ``nn.Linear`` head (the usual case): :class:`_FusedHead`, which
holds the head's gradient once and ~3 chunk tensors (measured at T = 4,096, H = 896, log-probs and entropy:
768 MiB against the naive 9,533 MiB, 12.4×; issue 40, BENCHMARKS.md), and recomputes each chunk's logits,
unless all of them fit in :data:`KEEP_LOGITS_BYTES`: then the forward's are kept (one LM-head matmul less).
Under bfloat16 autocast (``model.compute_dtype: bfloat16``, float32 master weights) it computes what
autocast does for ``lm_head(hidden)`` — bfloat16 logits, ∂/∂z rounded to bfloat16 — with the backward taken
in slices of the vocabulary (no bfloat16 copy of the whole head; :func:`_backward_cast`): the same log-probs
and entropy as autograd under that autocast, and gradients within its rounding, nearer the exact ones
(tests/models/test_models_logprobs.py); 712 MiB against the naive 7,399 MiB under bf16 (10.4×; autograd
through checkpointed chunks 944 MiB). Otherwise (a wrapped head such as LoRA's, float16 autocast), autograd:

Autograd: without care, each chunk's backward keeps its float32 logits
(logsumexp saves its input) and, with entropy, the softmax as well — (B, T, V)
again in total. So when gradients are on and there are several chunks, each
runs under ``torch.utils.checkpoint`` and only its hidden slice (B, C, H) is kept;
backward recomputes one chunk's logits at a time (one extra LM-head matmul per chunk).
Measured (``benchmarks/bench_logprobs.py --backward``, CPU, V = 151,936,
T = 1,024, B = 1): forward+backward peak 536 MiB with the checkpoint, 976 MiB
without, 1,807 MiB naive; forward alone 155 MiB vs 1,211 MiB naive. A single chunk is not
checkpointed: its logits are within the budget anyway, and the recomputation would only cost.
Smaller chunks with gradients were tried (32 positions of Qwen's vocabulary, 19 MB of logits each): below
glibc's 32 MB mmap threshold freed chunks stay in the heap, and the resident peak of log-probs and entropy
at 4,096 tokens, H = 896, rose from 1,587 MiB (128 positions) to 9,866 MiB (issue 40, BENCHMARKS.md).

Padding-free (``packed=True``, ``model.padding_free``): the decoder runs on the batch's real
tokens packed side by side in rows (glassrl.models.packing), and the LM head only on the positions that
predict real response tokens; the numbers equal the padded path's on every real response token
(tests/models/test_models_packing.py) and are 0 on padding.

Shared prefix (``shared_prefix=True``, ``model.shared_prefix``): packed too, each distinct prompt of the
batch once per chunk, its responses attending it through a tree mask (glassrl.models.shared_prefix); same
numbers as the padded path.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from glassrl.errors import GlassrlError
from glassrl.models.packing import unpack
from glassrl.models.precision import autocast_dtype
from glassrl.models.shared_prefix import packed_rows

# Config fields by which some architectures transform logits after the LM head
# (Gemma 2 soft-capping, Cohere / Granite scaling); the chunked path applies the
# bare head, so it refuses them rather than return wrong numbers.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")

# float32 logits per LM-head chunk (B · positions · V): 128 positions of a 151,936-token vocabulary.
CHUNK_LOGITS = 128 * 151_936
# The fused head backward keeps the forward's logits when all of them take at most this (1,725 positions of
# Qwen's vocabulary; a 0.5 B GRPO micro-batch of 8 × 128 response tokens holds 0.58 GiB), and recomputes
# them chunk by chunk above it (at 4,096 positions: 2.3 GiB, where the chunked peak is what issue 40 asks).
KEEP_LOGITS_BYTES = 2**30


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``attention_mask`` (B, L) -> position ids (B, L): 0 at the first real token of each row.

    Left padding gets position 0 (its value never matters: padding is masked out).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _chunk(
    lm_head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hidden (B, C, H), targets (B, C) -> log-probs (B, C), entropy (B, C) or None."""
    # Temperature scales the logits before the softmax, as in sampling
    # (verl, workers/actor/dp_actor.py: logits.div_(temperature)).
    logits = lm_head(hidden).float() / temperature  # (B, C, V)
    lse = torch.logsumexp(logits, dim=-1)  # (B, C)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse  # (B, C)
    if not with_entropy:
        return logprobs, None
    # A metric only (entropy_grad False): from detached logits, so no graph is kept for it.
    z, z_lse = (logits, lse) if entropy_grad else (logits.detach(), lse.detach())
    # H = logsumexp(z) - Σ_v softmax(z)_v z_v (verl, utils/torch_functional.py, entropy_from_logits).
    entropy = z_lse - (torch.softmax(z, dim=-1) * z).sum(-1)  # (B, C)
    return logprobs, entropy


class _FusedHead(torch.autograd.Function):
    """Log-probs and entropy of ``softmax(hidden @ weightᵀ / τ)`` chunk by chunk, with a backward that
    recomputes one chunk's logits at a time, forms their gradient in place
    (``∂lp/∂z = onehot − p``, ``∂H/∂z = −p (z − E_p[z])``) and accumulates the head's gradient of every
    chunk into one buffer (``addmm_``): one (V, H) gradient and about three chunk-sized tensors at once,
    where autograd through checkpointed chunks held a full-size head gradient per chunk and ~13 chunk
    tensors (Liger Kernel's fused linear cross-entropy, Hsu et al. 2024, §3.3, computes the same
    gradient). A plain bias-free ``nn.Linear`` head only (:func:`logprobs_from_hidden` checks), float32
    matmuls where the weights are float32, the weights' dtype otherwise, as ``lm_head(hidden)`` would.
    ``cast``: the dtype of the caller's autocast on hidden's device (bfloat16) or None: the forward's products
    take their operands in it, as autocast's ``F.linear`` does, and the backward is :func:`_backward_cast`.
    Autocast is switched off inside both, so that the forward's ``cast`` alone decides every dtype, whatever
    autocast the caller holds when it calls ``backward`` (``torch.amp.custom_fwd``/``custom_bwd`` would
    record the state too, but for one device type fixed where the class is defined).
    ``keep``: the forward's chunks of logits are kept for the backward instead of recomputed (one LM-head
    matmul of every position saved: 2.5 of a 0.5 B GRPO update's 43 s), when they all fit in
    :data:`KEEP_LOGITS_BYTES` (:func:`logprobs_from_hidden` decides)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, with_entropy, entropy_grad, keep, cast):
        lps, ents, kept, lses, expected = [], [], [], [], []
        with torch.autocast(hidden.device.type, enabled=False):  # ``cast`` says the dtype, as autocast would
            w = weight if cast is None else weight.to(cast)  # (V, H), cast once (autocast: once per region)
            for start in range(0, hidden.shape[1], chunk):
                h = hidden[:, start : start + chunk]  # (B, C, H)
                logits = ((h if cast is None else h.to(cast)) @ w.T).float() / temperature  # (B, C, V)
                lse = torch.logsumexp(logits, dim=-1)  # (B, C)
                lps.append(logits.gather(-1, targets[:, start : start + chunk].unsqueeze(-1)).squeeze(-1) - lse)
                if with_entropy:
                    expected.append((torch.softmax(logits, dim=-1) * logits).sum(-1))  # E_p[z] (B, C)
                    ents.append(lse - expected[-1])
                if keep:
                    kept.append(logits)
                lses.append(lse)
                del logits
            del w
        ctx.kept = kept  # intermediates, not inputs or outputs: held on ctx, released chunk by chunk in backward
        ctx.temperature, ctx.chunk, ctx.entropy_grad = temperature, chunk, with_entropy and entropy_grad
        ctx.cast = cast
        if cast is None:
            ctx.save_for_backward(hidden, weight, targets)
        else:  # the vocabulary-sliced backward takes each position's softmax from its logsumexp and E_p[z]
            moments = (torch.cat(lses, dim=1), torch.cat(expected, dim=1) if ctx.entropy_grad else None)
            ctx.save_for_backward(hidden, weight, targets, *moments)
        entropy = torch.cat(ents, dim=1) if with_entropy else hidden.new_zeros(0)
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return torch.cat(lps, dim=1), entropy

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        if ctx.cast is not None:
            return (*_backward_cast(ctx, g_lp, g_ent), None, None, None, None, None, None, None)
        hidden, weight, targets = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        with torch.autocast(hidden.device.type, enabled=False):  # not under the caller's autocast, if any
            for i, start in enumerate(range(0, hidden.shape[1], chunk)):
                h = hidden[:, start : start + chunk]  # (B, C, H)
                gl = g_lp[:, start : start + chunk].unsqueeze(-1).float()  # (B, C, 1)
                if ctx.kept:  # the forward's logits, written over in place below: released as used
                    z, ctx.kept[i] = ctx.kept[i], None  # (B, C, V)
                else:
                    z = (h @ weight.T).float().div_(tau)  # (B, C, V)
                p = torch.softmax(z, dim=-1)  # (B, C, V)
                if ctx.entropy_grad and g_ent is not None:
                    ge = g_ent[:, start : start + chunk].unsqueeze(-1).float()
                    expected = (p * z).sum(-1, keepdim=True)  # E_p[z] (B, C, 1)
                    dz = z.sub_(expected).mul_(p).mul_(-ge)  # ge · ∂H/∂z, in z's memory
                    dz.sub_(p.mul_(gl))  # − gl · p
                else:
                    dz = p.mul_(-gl)
                del z
                dz.scatter_add_(-1, targets[:, start : start + chunk].unsqueeze(-1), gl)  # + gl · onehot
                dz = dz.div_(tau).to(weight.dtype)  # ∂/∂(h Wᵀ)
                if grad_h is not None:
                    grad_h[:, start : start + chunk] = dz @ weight
                if grad_w is not None:
                    grad_w.addmm_(dz.flatten(0, 1).T, h.flatten(0, 1))
                del dz, p
        return grad_h, grad_w, None, None, None, None, None, None, None


def _backward_cast(ctx, g_lp: torch.Tensor, g_ent: torch.Tensor | None):
    """:class:`_FusedHead`'s backward under autocast (``ctx.cast``, bfloat16): the gradients autocast's own
    backward of ``lm_head(hidden).float() / τ`` forms, without a (V, H) copy of the weights in that dtype.

    Autocast rounds ∂/∂z to bfloat16 and multiplies bfloat16 operands, rounding each product to bfloat16
    (hidden's gradient, and each chunk's head gradient, which autograd then adds up in bfloat16). Here the
    vocabulary is taken in slices of rows, each slice of the weights cast once: the logits of every
    position for those rows are recomputed in bfloat16 as in the forward, their softmax taken from the
    forward's logsumexp (and E_p[z]), ∂/∂z formed in place and rounded to bfloat16; the two products then
    run in float32 on those bfloat16 values, which float32 multiplies exactly (8 + 8 significant bits), so
    the head's gradient is summed in float32, unrounded, and hidden's is rounded to bfloat16 once at the
    end, as autocast's single product is (bfloat16 GEMMs with float32 accumulation, as on a GPU's tensor
    cores). Alive at once: the head's float32 gradient and ~3 (positions × rows) tiles of at most half
    :data:`CHUNK_LOGITS` values (the kept logits too, when the forward kept them); the slice of the weights,
    in bfloat16 and float32, within as many."""
    hidden, weight, targets, lse, expected = ctx.saved_tensors
    tau, cast, kept = ctx.temperature, ctx.cast, ctx.kept
    entropy = ctx.entropy_grad and g_ent is not None
    flat = hidden.flatten(0, 1)  # (N, H)
    h_cast = flat.to(cast)  # (N, H)
    h_exact = h_cast.float()  # its values, in float32
    gl = g_lp.reshape(-1, 1).float()  # (N, 1)
    ge = g_ent.reshape(-1, 1).float() if entropy else None
    lse, t = lse.reshape(-1, 1), targets.reshape(-1, 1)  # (N, 1) each
    grad_h = torch.zeros_like(h_exact) if ctx.needs_input_grad[0] else None  # float32 accumulator (N, H)
    grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
    # (N, R) tiles and (R, H) slices of half CHUNK_LOGITS values: 39 MB in float32 at Qwen's vocabulary, above
    # glibc's 32 MiB mmap threshold (smaller ones stay in the heap when freed: the module docstring)
    rows = max(1, CHUNK_LOGITS // (2 * max(flat.shape[0], flat.shape[1])))
    with torch.autocast(hidden.device.type, enabled=False):
        for v in range(0, weight.shape[0], rows):
            w = weight[v : v + rows].to(cast)  # (R, H)
            if kept:
                z = torch.cat([k[..., v : v + rows] for k in kept], dim=1).flatten(0, 1)  # (N, R)
            else:
                z = (h_cast @ w.T).float().div_(tau)  # (N, R)
            p = (z - lse).exp_()  # (N, R)
            if entropy:
                dz = z.sub_(expected.reshape(-1, 1)).mul_(p).mul_(-ge)  # ge · ∂H/∂z, in z's memory
                dz.sub_(p.mul_(gl))  # − gl · p
            else:
                dz = p.mul_(-gl)
            del z, p
            inside = (t >= v) & (t < v + rows)
            dz.scatter_add_(1, (t - v).clamp_(0, w.shape[0] - 1), torch.where(inside, gl, 0.0))  # + gl · onehot
            dz.div_(tau)
            dz.copy_(dz.to(cast))  # ∂/∂(h Wᵀ) rounded as autocast rounds it, held in float32
            if grad_h is not None:
                grad_h.addmm_(dz, w.float())
            if grad_w is not None:
                grad_w[v : v + rows].addmm_(dz.T, h_exact)
            del dz, w
    ctx.kept = None
    if grad_h is not None:
        grad_h = grad_h.to(cast).to(hidden.dtype).view_as(hidden)
    return grad_h, grad_w


def _fused_head(lm_head: nn.Module, device: torch.device) -> bool:
    """Whether :class:`_FusedHead` computes this head's backward: a plain bias-free nn.Linear, outside autocast
    on ``device`` (hidden's) or under its bfloat16 autocast (``model.compute_dtype``; float16 autocast, which
    glassrl does not offer, and wrapped heads such as LoRA's take autograd through checkpointed chunks)."""
    plain = type(lm_head) is nn.Linear and lm_head.bias is None
    return plain and autocast_dtype(device.type) in (None, torch.bfloat16)


def logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head: nn.Module,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked core: ``hidden`` (B, T, H) at the positions that predict ``targets`` (B, T).

    Returns log-probs (B, T) and entropy (B, T) (or None), both float32, of
    ``softmax(lm_head(hidden) / temperature)``, from the same logits of each chunk. Peak extra
    memory is a few chunks' float32 logits, in forward and in backward: ``chunk_size`` positions
    each, or (None) as many as :data:`CHUNK_LOGITS` allows.
    ``entropy_grad=False``: the entropy is a detached metric (no gradient flows through it).
    """
    B, T = targets.shape
    vocab = getattr(lm_head, "out_features", None) or lm_head.weight.shape[0]
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    chunk = chunk_size or max(1, CHUNK_LOGITS // (max(B, 1) * vocab))
    if grad and T > chunk and _fused_head(lm_head, hidden.device):
        keep = B * T * vocab * 4 <= KEEP_LOGITS_BYTES  # float32 logits, under autocast too
        cast = autocast_dtype(hidden.device.type)
        args = (hidden, lm_head.weight, targets, temperature, chunk, with_entropy, entropy_grad, keep, cast)
        lp, ent = _FusedHead.apply(*args)
        return lp, (ent if with_entropy else None)
    logprobs, entropies = [], []
    for start in range(0, max(T, 1), chunk):  # T = 0 (packed, no real token): empty outputs
        h = hidden[:, start : start + chunk]  # (B, C, H)
        t = targets[:, start : start + chunk]  # (B, C)
        if grad and T > chunk:
            lp, ent = checkpoint(_chunk, lm_head, h, t, temperature, with_entropy, entropy_grad, use_reentrant=False)
        else:
            lp, ent = _chunk(lm_head, h, t, temperature, with_entropy, entropy_grad)
        logprobs.append(lp)
        entropies.append(ent)
    entropy = torch.cat(entropies, dim=1) if with_entropy else None  # (B, T)
    return torch.cat(logprobs, dim=1), entropy  # (B, T)


def response_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    packed: bool = False,
    shared_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(y_i | s_i) for the last ``response_len`` = T tokens of ``input_ids`` (B, P+T).

    Runs the causal LM's decoder once (position ids from the mask, so left
    padding is transparent), keeps hidden states at positions P-1 … P+T-2, and
    applies the LM head chunk by chunk (:func:`logprobs_from_hidden`), log-probs and
    entropy from the same logits. Returns log-probs (B, T) and entropy (B, T) or None,
    float32; values on response padding are finite and meaningless (0 when ``packed``) —
    mask them with response_mask. Gradients flow to the model when grad mode is on.

    ``packed``: padding-free (glassrl.models.packing): the decoder sees the real tokens only,
    the LM head the positions that predict real response tokens only. ``shared_prefix``: packed, and
    each distinct prompt once per chunk (glassrl.models.shared_prefix); not with ``packed``.
    """
    for field in _LOGIT_TRANSFORMS:
        if getattr(model.config, field, None) not in (None, 1.0):
            raise GlassrlError(
                f"model: {model.config.model_type} sets {field}={getattr(model.config, field)}, "
                "which the chunked log-prob path does not apply"
            )
    prompt_len = input_ids.shape[1] - response_len
    if response_len < 1 or prompt_len < 1:
        raise ValueError(f"need a prompt and a response; got length {input_ids.shape[1]}, response_len {response_len}")
    if packed and shared_prefix:
        raise ValueError("response_logprobs: packed and shared_prefix exclude each other")
    head = dict(temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy, entropy_grad=entropy_grad)
    if packed or shared_prefix:
        rows, mask = packed_rows(model, input_ids, attention_mask, response_len, shared_prefix=shared_prefix)
        hidden = model.get_decoder()(
            input_ids=rows.input_ids, position_ids=rows.position_ids, attention_mask=mask, use_cache=False
        ).last_hidden_state.flatten(0, 1)  # (R·W, H): the real tokens, and the rows' tails
        source, valid = rows.response_sources(response_len)  # (B, T) each
        targets = input_ids[:, prompt_len:][valid]  # (K,) the real response tokens
        logprobs, entropy = logprobs_from_hidden(
            hidden[source[valid]].unsqueeze(0), model.get_output_embeddings(), targets.unsqueeze(0), **head
        )  # (1, K) each
        return unpack(logprobs[0], valid), (unpack(entropy[0], valid) if entropy is not None else None)
    targets = input_ids[:, prompt_len:]  # (B, T)
    hidden = model.get_decoder()(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).last_hidden_state  # (B, P+T, H)
    hidden = hidden[:, prompt_len - 1 : -1]  # (B, T, H): position P-1+i predicts token i
    return logprobs_from_hidden(hidden, model.get_output_embeddings(), targets, **head)


def naive_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Reference: ``log_softmax(logits (B, T, V)).gather(targets (B, T))`` -> (B, T), float32."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def naive_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Reference: ``-Σ_v p_v log p_v`` of ``softmax(logits (B, T, V))`` -> (B, T), float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    return -(logp.exp() * logp).sum(-1)
