"""Shared-prefix forward passes: each distinct prompt of a micro-batch computed once, no padding
(``model.shared_prefix``).

With n samples per prompt, the padded path (glassrl.models.logprobs) runs every prompt n times and
every response to the batch's longest. Here a micro-batch becomes a few packed rows (a
:class:`~glassrl.models.packing.Packed`, as padding-free's): a *chunk* is one prompt's real tokens
followed by the real tokens of some of its responses, side by side, and chunks sit side by side in
rows. One forward pass over the rows, with a mask that lets each response token attend its own
prompt and its own earlier tokens, nothing else:

    row:       [ prompt A | resp 0 of A | resp 2 of A | prompt B | resp 1 of B | tail ]
    attends:     causal     A + itself    A + itself    causal     B + itself    itself

A response's last token is left out: it predicts nothing and nothing after it attends it, so the
padded path computes it for nothing (one token per response: ~1/8 of a GRPO micro-batch here).

Position ids are the padded path's (a response continues its prompt's count), so every real
token sees the keys and positions it sees padded, and the numbers are the padded path's to float
rounding (tests/models/test_models_shared_prefix.py). In the update a prompt's gradient is the
sum over the responses that attend it, as padded. This is the tree attention of shared-prefix
training (Liu et al. 2025, "Prefix Grouper: Efficient GRPO Training through Shared-Prefix
Forward", §3: one prefix, G suffixes, a mask keeping suffixes apart); serving engines reuse a
shared prompt's keys and values the same way (Kwon et al. 2023, "PagedAttention", §4.4).

Rows, and how wide: under sdpa and eager the mask is dense, so a row of W tokens costs W² in
attention (a key masked out still costs its product), while every chunk costs its prompt once.
Wide rows (whole groups per chunk) compute each prompt once and spend attention on the masked
pairs; narrow rows repeat the prompt in several chunks, and a row's unfilled tail is computed too.
:func:`pack_shared` tries widths from the padded row's length L up (L, 2L, 4L, … until two whole
groups fit in a row, or all of them) and keeps the layout with the fewest estimated multiply-adds
(:func:`layer_cost`: the linear layers per token, attention per query-key pair, from the model's
config; backward scales both alike). Chunks go into rows first-fit decreasing, as padding-free's
sequences do (glassrl.models.packing).

Rounding: a row's numbers depend on the rows packed with it (the matrix products and the attention
see other shapes), so two passes over the same row in different micro-batches agree to ~1e-6, not to
the bit as padded rows do. Where the exact gradient is 0 (π_θ = π_ref before the first update, every
reward of every group equal) the padded path's is exactly 0 and this one's is rounding noise, which
Adam's first step scales up to ~lr per weight; the log-prob passes and a whole-batch update share
their layouts (glassrl.rl.update), so that case is exact there too.

A masked hole inside a response (attention mask 0 between real tokens) is placed, so that its
position computes what it computes padded, and masked as a key, as padded. An attention that
ignores a custom 4D mask would mix responses silently: :func:`check_shared_prefix` runs a small
case both ways before a run relies on it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from glassrl.errors import GlassrlError
from glassrl.models.packing import Packed, pack


def distinct_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first (U,) long: the first row of each distinct prompt, in row order; inverse (B,) long:
    the distinct prompt of each row, an index into ``first``)."""
    rows = torch.cat([prompt_ids, prompt_mask.long()], dim=1)  # (B, 2P): equal ids with other padding differ
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)  # (B,) into the sorted distinct rows
    B = len(rows)
    first = torch.full((int(inverse.max()) + 1,), B, device=rows.device)
    first = first.scatter_reduce(0, inverse, torch.arange(B, device=rows.device), "amin")  # (U,)
    order = first.argsort()  # distinct prompts in row order
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=rows.device)
    return first[order], rank[inverse]


def prompt_order(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int) -> torch.Tensor:
    """A permutation (B,) long of the rows of ``input_ids`` (B, P+T) grouping the rows of each distinct
    prompt together (distinct prompts in order of first appearance, rows in order within a prompt)."""
    prompt_len = input_ids.shape[1] - response_len
    _, inverse = distinct_rows(input_ids[:, :prompt_len], attention_mask[:, :prompt_len].bool())  # (B,)
    return torch.sort(inverse, stable=True).indices  # (B,)


@dataclass(frozen=True)
class LayerCost:
    """Multiply-adds of one decoder layer: ``per_token`` in its linear layers, ``per_pair`` per
    attended query-key pair (scores and weighted values, all heads)."""

    per_token: float
    per_pair: float


def layer_cost(config) -> LayerCost:
    """A decoder layer's :class:`LayerCost` from a transformers config (Llama-style names; the
    defaults of a plain transformer where a field is missing)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    q, kv = heads * head_dim, kv_heads * head_dim
    # q, k, v and o projections; a gated MLP (gate, up, down) as Llama's.
    return LayerCost(per_token=hidden * (q + 2 * kv) + q * hidden + 3 * hidden * intermediate, per_pair=2 * q)


@dataclass(frozen=True)
class _Layout:
    """Which chunk each row joins and where chunks sit. ``chunk_of`` (B,): a chunk per row;
    ``offset`` (B,): where a row's response starts after its chunk's prompt; ``row_of``,
    ``start_of`` (C,): a chunk's packed row and first column; ``fill`` (R,): tokens per packed row."""

    chunk_of: list[int]
    offset: list[int]
    row_of: list[int]
    start_of: list[int]
    fill: list[int]

    def cost(self, layer: LayerCost) -> float:
        R, W = len(self.fill), max(self.fill)
        return R * W * (layer.per_token + W * layer.per_pair)


def _layout(group: list[int], prompt: list[int], response: list[int], width: int) -> _Layout:
    """Rows joined to chunks in row order (a chunk of a prompt takes its rows while they fit in
    ``width``; always one), then chunks into packed rows first-fit decreasing."""
    chunk_of, offset, chunk_len = [], [], []
    open_chunk: dict[int, int] = {}  # group -> its chunk being filled
    for g, p, r in zip(group, prompt, response):
        c = open_chunk.get(g)
        if c is None or chunk_len[c] + r > width:
            c = open_chunk[g] = len(chunk_len)
            chunk_len.append(p)
        chunk_of.append(c)
        offset.append(chunk_len[c] - p)
        chunk_len[c] += r
    capacity = max(width, *chunk_len)
    fill: list[int] = []
    row_of, start_of = [0] * len(chunk_len), [0] * len(chunk_len)
    for c in sorted(range(len(chunk_len)), key=lambda c: -chunk_len[c]):
        row = next((i for i, used in enumerate(fill) if used + chunk_len[c] <= capacity), len(fill))
        if row == len(fill):
            fill.append(0)
        row_of[c], start_of[c] = row, fill[row]
        fill[row] += chunk_len[c]
    return _Layout(chunk_of, offset, row_of, start_of, fill)


def pack_shared(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    layer: LayerCost,
    width: int | None = None,
) -> Packed:
    """``input_ids``, ``attention_mask`` (B, P+T) (left-padded prompt ⊕ right-padded response) ->
    :class:`Packed` rows holding each distinct prompt once per chunk, with the tree mask
    (``attention_mask`` (R, 1, W, W) bool) and the padded path's position ids.

    The layout (module docstring) is the cheapest of the candidate widths by ``layer``'s estimate,
    or the one of chunks no wider than ``width`` when given.
    """
    mask = attention_mask.bool()
    B, L = mask.shape
    P = L - response_len
    device = mask.device
    _, group = distinct_rows(input_ids[:, :P], mask[:, :P])  # (B,)
    real_cols = torch.where(mask, torch.arange(L, device=device), -1)  # (B, L)
    first_real = torch.where(mask[:, :P], torch.arange(P, device=device), P).amin(-1)  # (B,) P when none
    # A row's span: its prompt from the first real column, its response to the column before its last
    # real one: the last response token predicts nothing and no later token attends it, so it is only
    # a target (its log-prob comes from the position before it), never an input.
    prompt_span = (P - first_real).tolist()
    response_span = (real_cols[:, P:].amax(-1) - P).clamp(min=0).tolist()
    group = group.tolist()
    group_len: dict[int, int] = {}  # a distinct prompt's tokens and all its responses'
    for g, p, r in zip(group, prompt_span, response_span):
        group_len[g] = group_len.get(g, p) + r
    # Candidates: from the padded row's width, doubling until whole groups fit two to a row (a row's tail
    # then shrinks) or everything fits in one.
    reach = min(2 * max(group_len.values()), sum(group_len.values()))
    widths = [width] if width is not None else [L]
    while width is None and widths[-1] < reach:
        widths.append(2 * widths[-1])
    layouts = [_layout(group, prompt_span, response_span, w) for w in widths]
    layout = min(layouts, key=lambda candidate: candidate.cost(layer))

    R, W = len(layout.fill), max(1, *layout.fill)  # at least one column: a batch with nothing to place
    place = lambda v: torch.tensor(v, device=device).unsqueeze(-1)  # noqa: E731 (B,) -> (B, 1)
    chunk = place(layout.chunk_of)  # (B, 1)
    base = place([layout.row_of[c] * W + layout.start_of[c] for c in layout.chunk_of])  # (B, 1)
    cols = torch.arange(L, device=device)  # (L,)
    in_prompt = cols < P  # (L,)
    placed = torch.where(in_prompt, cols >= first_real.unsqueeze(-1), cols < P + place(response_span))  # (B, L)
    within = torch.where(
        in_prompt, cols - first_real.unsqueeze(-1), place(prompt_span) + place(layout.offset) + cols - P
    )
    index = torch.where(placed, base + within, -1)  # (B, L)

    tail = torch.arange(W, device=device) - torch.tensor(layout.fill, device=device).unsqueeze(-1)  # (R, W)
    ids = torch.zeros(R * W, dtype=input_ids.dtype, device=device)
    positions = tail.flatten().clamp(min=0)  # a row's tail: one dummy sequence from position 0, never read
    # Per packed position: its chunk (a tail its own), its response (−1: a prompt), whether a key may be attended.
    chunk_id = (len(layout.row_of) + torch.arange(R, device=device)).repeat_interleave(W)  # (R·W,)
    response_id = torch.full((R * W,), -1, device=device)
    key = torch.ones(R * W, dtype=torch.bool, device=device)
    at = index[placed]
    ids[at] = input_ids[placed]
    positions[at] = (mask.long().cumsum(-1) - 1).clamp(min=0)[placed]  # the padded path's position ids
    chunk_id[at] = chunk.expand(B, L)[placed]
    response_id[at] = torch.where(in_prompt, -1, torch.arange(B, device=device).unsqueeze(-1))[placed]
    key[at] = mask[placed]  # a hole is placed, not attended

    chunk_id, response_id, key = chunk_id.view(R, W), response_id.view(R, W), key.view(R, W)
    same_chunk = chunk_id.unsqueeze(-1) == chunk_id.unsqueeze(-2)  # (R, W, W): [query, key]
    own = (response_id.unsqueeze(-2) < 0) | (response_id.unsqueeze(-1) == response_id.unsqueeze(-2))
    causal = torch.ones(W, W, dtype=torch.bool, device=device).tril()
    allowed = same_chunk & own & causal & key.unsqueeze(-2)  # (R, W, W)
    return Packed(ids.view(R, W), positions.view(R, W), index, allowed.unsqueeze(1), real=mask)


def packed_rows(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, *, shared_prefix: bool
) -> tuple[Packed, torch.Tensor | None]:
    """A padded batch (B, P+T) as packed rows, and the attention mask to run ``model`` on them: the
    shared-prefix layout with its tree mask in ``model``'s form, or padding-free's rows
    (glassrl.models.packing) and None (the restarting position ids mark the sequences).

    The reference pass and the update pack the same micro-batches (glassrl.rl.update orders
    them so): a layout is built once and taken from :data:`_RECENT` the second time, by the
    batch's contents (its numbers are a function of them; nothing writes into a Packed)."""
    cost = layer_cost(model.config) if shared_prefix else None
    key = (
        cost,
        response_len,
        str(input_ids.device),
        tuple(input_ids.shape),
        input_ids.cpu().numpy().tobytes(),
        attention_mask.bool().cpu().numpy().tobytes(),
    )
    with _RECENT_LOCK:  # the overlapping rollout (glassrl.workers.overlap) packs from its own thread
        rows = _RECENT.pop(key, None)
    if rows is None:
        rows = (
            pack(input_ids, attention_mask)
            if cost is None
            else pack_shared(input_ids, attention_mask, response_len, cost)
        )
    with _RECENT_LOCK:
        _RECENT[key] = rows
        while len(_RECENT) > 1 and sum(_bytes(k, r) for k, r in _RECENT.items()) > _RECENT_BYTES:
            _RECENT.popitem(last=False)
    return rows, None if cost is None else attention_mask_for(model, rows.attention_mask)  # (R, 1, W, W)


# The layouts last built, most recent last, up to 64 MiB with their keys: a step's micro-batches of
# the actor, the reference and the critic at the presets' sizes; the newest one always.
_RECENT_BYTES = 64 * 2**20
_RECENT: OrderedDict[tuple, Packed] = OrderedDict()
_RECENT_LOCK = threading.Lock()


def _bytes(key: tuple, rows: Packed) -> int:
    """What a kept layout holds: its key's batch contents and its tensors."""
    tensors = (rows.input_ids, rows.position_ids, rows.index, rows.attention_mask, rows.real)
    contents = sum(len(part) for part in key if isinstance(part, bytes))
    return contents + sum(t.numel() * t.element_size() for t in tensors if t is not None)


def full_attention(config) -> bool:
    """Whether every attention layer of ``config``'s model attends all earlier positions (transformers'
    ``DynamicLayer`` in each layer of its cache): no sliding window, no linear attention, which a
    custom 4D mask cannot express."""
    layers = DynamicCache(config=config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def attention_mask_for(model: nn.Module, allowed: torch.Tensor) -> torch.Tensor:
    """The 4D mask ``allowed`` (R, 1, W, W) bool in the form ``model``'s attention takes it: as is
    for sdpa (True = attend), additive for eager (0 or the dtype's lowest); others refuse it."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    attention = config._attn_implementation
    if attention == "sdpa":
        return allowed
    if attention == "eager":
        dtype = next(model.parameters()).dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
    raise GlassrlError(
        f"model.shared_prefix: {config.model_type} with attention {attention!r} takes no custom attention "
        "mask; load it with sdpa or eager attention, or set model.shared_prefix to false"
    )


@torch.no_grad()
def check_shared_prefix(model: nn.Module) -> None:
    """GlassrlError naming ``model.shared_prefix`` unless ``model``'s decoder honours the tree mask.

    Runs two samples of one prompt padded and in the shared layout (eval mode, no gradient) and
    compares the hidden states before each response token; a decoder that drops the custom mask
    lets one response attend the other. A model with layers that are not full attention (a sliding
    window) is refused outright: the layout's own mask cannot keep the window."""
    if not full_attention(model.config):
        raise GlassrlError(
            f"model.shared_prefix: {model.config.model_type} has layers without full attention (a sliding "
            "window), which the layout's own mask cannot keep; set model.shared_prefix to false"
        )
    decoder = getattr(model, "backbone", model).get_decoder()  # a causal LM, or a critic's body (value head)
    param = next(model.parameters())
    vocab = model.config.get_text_config().vocab_size
    ids = (torch.arange(7, device=param.device).remainder(vocab - 1) + 1).view(1, 7).expand(2, 7).clone()
    ids[1, 4:] = ids[1, 4:].flip(0)  # (2, 7): one prompt of 4 tokens, two responses of 3
    mask = torch.ones_like(ids)
    rows = pack_shared(ids, mask, 3, layer_cost(model.config))
    training = model.training
    model.eval()
    try:
        padded = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # (2, 7, H)
        packed = decoder(
            input_ids=rows.input_ids,
            position_ids=rows.position_ids,
            attention_mask=attention_mask_for(model, rows.attention_mask),
            use_cache=False,
        ).last_hidden_state.flatten(0, 1)
    finally:
        model.train(training)
    source, valid = rows.response_sources(3)
    expected = padded[:, 3:6][valid].float()  # position 3+i predicts response token i
    got = packed[source[valid]].float()
    if not torch.allclose(got, expected, rtol=1e-3, atol=1e-3 * expected.abs().max().item()):
        raise GlassrlError(
            f"model.shared_prefix: {model.config.model_type} with attention {model.config._attn_implementation!r} "
            "does not keep the responses of a shared prompt apart (it ignores a custom attention mask); set it to false"
        )
