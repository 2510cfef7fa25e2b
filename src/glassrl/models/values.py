"""Critic values aligned with the response tokens (DESIGN §1).

``values[:, i] = V(s_i)`` is the critic's scalar at absolute position
``P-1+i``: the position *before* response token ``y_i`` (the last prompt token
for ``i = 0``). So ``V(s_i)`` has not seen ``a_i = y_i`` and estimates
``r_i + γ r_{i+1} + …`` — it includes ``r_i`` (Schulman et al. 2016, GAE, §2:
V(s_t) is the value of the state before acting at t).

Padding-free (``packed=True``, ``model.padding_free``): the critic runs on the real tokens packed
side by side in rows (glassrl.models.packing); the values equal the padded path's on every real response
token and are 0 on padding. Shared prefix (``shared_prefix=True``, ``model.shared_prefix``): packed too,
each distinct prompt once per chunk (glassrl.models.shared_prefix); the same values.
"""

from __future__ import annotations

import torch
from torch import nn

from glassrl.models.loading import scalar_outputs
from glassrl.models.packing import unpack
from glassrl.models.shared_prefix import packed_rows


def response_values(
    critic: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    *,
    packed: bool = False,
    shared_prefix: bool = False,
) -> torch.Tensor:
    """``input_ids``, ``attention_mask`` (B, P+T) -> values (B, T), float32; T = ``response_len``.

    Values on response padding are finite and meaningless (0 when ``packed``): mask them with
    response_mask. ``packed``: padding-free, the real tokens only (glassrl.models.packing).
    ``shared_prefix``: packed, each distinct prompt once per chunk (glassrl.models.shared_prefix).
    """
    prompt_len = input_ids.shape[1] - response_len
    if response_len < 1 or prompt_len < 1:
        raise ValueError(f"need a prompt and a response; got length {input_ids.shape[1]}, response_len {response_len}")
    if packed and shared_prefix:
        raise ValueError("response_values: packed and shared_prefix exclude each other")
    if packed or shared_prefix:
        rows, mask = packed_rows(critic, input_ids, attention_mask, response_len, shared_prefix=shared_prefix)
        scalars = scalar_outputs(critic, rows.input_ids, mask, rows.position_ids).flatten()  # (R·W,)
        source, valid = rows.response_sources(response_len)  # (B, T) each
        return unpack(scalars[source[valid]], valid)  # (B, T): V(s_i) read before token i
    scalars = scalar_outputs(critic, input_ids, attention_mask)  # (B, P+T)
    return scalars[:, prompt_len - 1 : -1]  # (B, T): position P-1+i holds V(s_i)
