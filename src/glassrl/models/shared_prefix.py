"""Shared-prefix forward passes: each distinct prompt of a micro-batch computed once (``model.shared_prefix``).

With n samples per prompt, the padded path (glassrl.models.logprobs) runs every prompt n times.
Here the decoder runs once over the micro-batch's U distinct prompts (left-padded, with a KV
cache), the cache's rows are expanded to the B rows (``index_select``: differentiable, so in
the update a prompt's gradient is the sum over its samples, as in the padded path), and the
response tokens run on that cache, their attention mask over prompt ⊕ response and their
position ids continuing the prompt's. The hidden state at the prompt's last position predicts
response token 0; response position i predicts token i+1 (DESIGN §1). The decoding loop does the
same for its prefill (glassrl.rollout.hf.decode); the reuse of a shared prompt's KV cache is
vLLM's prefix caching (Kwon et al. 2023, "PagedAttention", §4.4, shared prefix).

Same numbers as the padded path to float rounding: a row's keys and values depend on its own
tokens and positions only (tests/models/test_models_shared_prefix.py).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache


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


def shared_prefix_hidden(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int
) -> torch.Tensor:
    """Hidden states (B, T, H) at the positions that predict the T response tokens of ``input_ids`` (B, P+T)
    (left-padded prompt ⊕ right-padded response), the prompts computed once each.

    What the padded path's ``decoder(input_ids, ...).last_hidden_state[:, P-1:-1]`` gives, to rounding.
    """
    prompt_len = input_ids.shape[1] - response_len
    mask = attention_mask.bool()
    first, inverse = distinct_rows(input_ids[:, :prompt_len], mask[:, :prompt_len])  # (U,), (B,)
    prompt_mask = mask[first, :prompt_len]  # (U, P)
    # Columns that are padding in every distinct prompt carry nothing: cut them (positions come from the mask).
    start = int(prompt_mask.any(0).long().argmax())
    prompt_mask = prompt_mask[:, start:]  # (U, P') with P' = P - start
    prompt_ids = input_ids[first, start:prompt_len]  # (U, P')
    cache = DynamicCache(config=model.config)
    prefill = model.get_decoder()(
        input_ids=prompt_ids,
        attention_mask=prompt_mask.long(),
        position_ids=(prompt_mask.long().cumsum(-1) - 1).clamp(min=0),
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state  # (U, P', H)
    if len(first) < len(inverse):
        cache.batch_select_indices(inverse)  # each layer's keys and values (U, …) -> (B, …), by indexing
    full_mask = torch.cat([prompt_mask[inverse], mask[:, prompt_len:]], dim=1)  # (B, P'+T)
    positions = (full_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -response_len:]  # (B, T)
    response = model.get_decoder()(
        input_ids=input_ids[:, prompt_len:],
        attention_mask=full_mask.long(),
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state  # (B, T, H)
    # Left padding: column P'-1 is each prompt's last real token, which predicts response token 0.
    return torch.cat([prefill[inverse, -1:], response[:, :-1]], dim=1)  # (B, T, H)
