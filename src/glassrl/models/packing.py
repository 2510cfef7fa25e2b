"""Padding-free forward passes: the real tokens of a padded batch side by side in one row.

A batch ``input_ids`` (B, P+T) is a left-padded prompt ⊕ a right-padded response (DESIGN §1);
padded, every forward and backward pass spends its matrix products on the padding too. Packed,
the N real tokens of the batch sit in one row (1, N) and each sequence's position ids restart at
0. Given ``attention_mask=None``, transformers reads the restarts as sequence boundaries
(``transformers.masking_utils.find_packed_sequence_indices``) and lets each token attend within
its own sequence only: a block-diagonal causal mask under sdpa and eager attention, the
variable-length kernel under flash-attention-2. TRL's ``padding_free`` and verl's
``use_remove_padding`` do the same.

    packed = pack(input_ids, attention_mask)
    hidden = decoder(input_ids=packed.input_ids, position_ids=packed.position_ids,
                     attention_mask=None, use_cache=False).last_hidden_state[0]    # (N, H)
    source, valid = packed.response_sources(T)                                   # (B, T) each
    per_token = head(hidden[source[valid]])                                      # (K,) real response tokens only
    out = unpack(per_token, valid)                                               # (B, T), 0 on padding

Under sdpa the block-diagonal mask is dense, (N, N) per micro-batch: attention costs N² instead
of B·(P+T)², which pays while the matrix products dominate (short sequences, a small micro-batch);
``batch.micro_batch_responses`` bounds N. An architecture whose mask code ignores the restarts
would attend across sequences and return wrong numbers silently, so :func:`check_packing` runs
two short sequences both ways before a run relies on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from glassrl.errors import GlassrlError


@dataclass(frozen=True)
class Packed:
    """A padded batch (B, L) packed into one row of its N real tokens.

    input_ids (1, N), position_ids (1, N): restarting at 0 at each sequence's first token.
    index (B, L) long: the position in the row of each padded position; −1 on padding.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    index: torch.Tensor

    def response_sources(self, response_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(source (B, T), valid (B, T) bool) for the last T = ``response_len`` padded positions.

        ``source[b, i]``: where in the row the position before response token i sits (its hidden
        state predicts token i; the critic reads V(s_i) there). ``valid``: token i and that
        position are both real tokens: the response tokens the padded path computes too.
        """
        source = self.index[:, -response_len - 1 : -1]  # (B, T): padded position P−1+i
        valid = (source >= 0) & (self.index[:, -response_len:] >= 0)  # (B, T)
        return source, valid


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Packed:
    """``input_ids``, ``attention_mask`` (B, L) -> :class:`Packed`: the real tokens row by row, in order.

    Position ids count each row's real tokens from 0, as the padded path's
    (glassrl.models.logprobs.position_ids_from_mask), so both see the same positions.
    """
    mask = attention_mask.bool()
    index = torch.where(mask, mask.flatten().long().cumsum(0).view_as(mask) - 1, -1)  # (B, L)
    positions = mask.long().cumsum(-1) - 1  # (B, L)
    return Packed(input_ids[mask].unsqueeze(0), positions[mask].unsqueeze(0), index)


def unpack(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``values`` (K,) of the K valid positions of ``valid`` (B, T), row-major -> (B, T), 0 elsewhere.

    Differentiable in ``values`` (masked_scatter)."""
    return torch.zeros(valid.shape, dtype=values.dtype, device=values.device).masked_scatter(valid, values)


@torch.no_grad()
def check_packing(model: nn.Module, key: str = "model.padding_free") -> None:
    """GlassrlError naming ``key`` unless ``model``'s decoder keeps packed sequences apart.

    Runs two short sequences separately and packed (eval mode, no gradient) and compares the
    hidden states; a decoder that ignores the restarting position ids mixes them."""
    decoder = getattr(model, "backbone", model).get_decoder()  # a causal LM, or a critic's body (value head)
    param = next(model.parameters())
    vocab = model.config.get_text_config().vocab_size
    ids = torch.arange(7, device=param.device).remainder(vocab - 1) + 1  # (7,) two sequences: 3 and 4 tokens
    training = model.training
    model.eval()
    try:
        alone = [decoder(input_ids=part.unsqueeze(0), use_cache=False).last_hidden_state[0] for part in (ids[:3], ids[3:])]
        positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]], device=param.device)
        packed = decoder(
            input_ids=ids.unsqueeze(0), position_ids=positions, attention_mask=None, use_cache=False
        ).last_hidden_state[0]  # (7, H)
    finally:
        model.train(training)
    expected = torch.cat(alone).float()
    if not torch.allclose(packed.float(), expected, rtol=1e-3, atol=1e-3 * expected.abs().max().item()):
        raise GlassrlError(
            f"{key}: {model.config.model_type} with attention {model.config._attn_implementation!r} attends "
            "across packed sequences (its mask ignores restarting position ids); set it to false"
        )
