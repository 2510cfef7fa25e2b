"""Padding-free forward passes: the real tokens of a padded batch, packed into rows side by side.

A batch ``input_ids`` (B, P+T) is a left-padded prompt ⊕ a right-padded response (DESIGN §1);
padded, every forward and backward pass spends its matrix products on the padding too. Packed,
the real tokens of the sequences sit side by side in R ≤ B rows, each sequence's position ids
restarting at 0. Given ``attention_mask=None``, transformers reads the restarts as sequence
boundaries (``transformers.masking_utils.find_packed_sequence_indices``) and lets each token
attend within its own sequence only: a block-diagonal causal mask under sdpa and eager
attention, the variable-length kernel under flash-attention-2. TRL's ``padding_free`` and verl's
``use_remove_padding`` do the same with all tokens in one row. A sequence's last token is left
out: it predicts nothing and nothing attends it (its log-prob comes from the position before).

Rows, not one row: under sdpa and eager the block-diagonal mask is dense, so a row of n tokens
costs n² in attention whatever its blocks. One row of a micro-batch's N tokens would cost N²
(measured: 32 responses of ~45 tokens, the GRPO example's micro-batch, made the step slower
than padded); rows no wider than the padded batch (P+T) cost at most what the padded batch
does. Sequences go into rows first-fit decreasing (Johnson 1973: longest first, each into the
first row with room), which leaves few rows and little tail; a row's tail is filled with one
dummy sequence whose outputs are never read.

    packed = pack(input_ids, attention_mask)
    hidden = decoder(input_ids=packed.input_ids, position_ids=packed.position_ids,
                     attention_mask=None, use_cache=False).last_hidden_state.flatten(0, 1)  # (R·W, H)
    source, valid = packed.response_sources(T)                          # (B, T) each
    per_token = head(hidden[source[valid]])                             # (K,) real response tokens only
    out = unpack(per_token, valid)                                      # (B, T), 0 on padding

An architecture whose mask code ignores the restarts would attend across sequences and return
wrong numbers silently, so :func:`check_packing` runs two short sequences both ways before a run
relies on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from glassrl.errors import GlassrlError


@dataclass(frozen=True)
class Packed:
    """A padded batch (B, L) packed into R rows of width W ≤ L.

    input_ids (R, W), position_ids (R, W): restarting at 0 at each sequence's first token.
    index (B, L) long: the position of each padded position in the packed rows, flattened
    (row · W + column); −1 on padding and on a sequence's last token (never an input).
    attention_mask (R, 1, W, W) bool or None: True where a query (row, i) attends a key (row, j);
    None: the restarting position ids mark the sequences (:func:`pack`). The shared-prefix layout
    (glassrl.models.shared_prefix) sets it: there a prompt is attended by several responses.
    real (B, L) bool or None: which placed positions are real tokens (a layout may place a masked
    hole, to compute its position as the padded path does); None: every placed one.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    index: torch.Tensor
    attention_mask: torch.Tensor | None = None
    real: torch.Tensor | None = None

    def response_sources(self, response_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(source (B, T), valid (B, T) bool) for the last T = ``response_len`` padded positions.

        ``source[b, i]``: where in the flattened rows the position before response token i sits
        (its hidden state predicts token i; the critic reads V(s_i) there). ``valid``: token i
        and that position are both real tokens: the response tokens the padded path computes too.
        """
        source = self.index[:, -response_len - 1 : -1]  # (B, T): padded position P−1+i
        target = self.real[:, -response_len:] if self.real is not None else self.index[:, -response_len:] >= 0
        return source, (source >= 0) & target  # (B, T) each


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Packed:
    """``input_ids``, ``attention_mask`` (B, L) -> :class:`Packed`: each row's real tokens, in order,
    as one sequence of a packed row no wider than L (first-fit decreasing), but its last: that one
    predicts nothing and nothing attends it (it is a target only, read through ``real``).

    Position ids count each sequence's real tokens from 0, as the padded path's
    (glassrl.models.logprobs.position_ids_from_mask), so both see the same positions.
    """
    real = attention_mask.bool()
    B, L = real.shape
    mask = real & (real.long().flip(-1).cumsum(-1).flip(-1) > 1)  # (B, L): placed, every real token but the last
    lengths = mask.sum(-1).tolist()
    fill: list[int] = []  # tokens placed in each packed row
    row_of, start_of = [0] * B, [0] * B
    for b in sorted(range(B), key=lambda b: -lengths[b]):
        row = next((r for r, used in enumerate(fill) if used + lengths[b] <= L), len(fill))
        if row == len(fill):
            fill.append(0)
        row_of[b], start_of[b] = row, fill[row]
        fill[row] += lengths[b]
    R, W = len(fill), max(1, *fill)
    positions = real.long().cumsum(-1) - 1  # (B, L): position within the sequence
    place = lambda v: torch.tensor(v, device=mask.device).unsqueeze(-1)  # noqa: E731 (B,) -> (B, 1)
    index = torch.where(mask, place(row_of) * W + place(start_of) + positions, -1)  # (B, L)
    # A row's tail: one dummy sequence of token 0 (positions from 0 again), never read.
    tail = torch.arange(W, device=mask.device) - torch.tensor(fill, device=mask.device).unsqueeze(-1)  # (R, W)
    ids = torch.zeros(R * W, dtype=input_ids.dtype, device=input_ids.device)
    pos = tail.flatten().clamp(min=0)
    ids[index[mask]] = input_ids[mask]
    pos[index[mask]] = positions[mask]
    return Packed(ids.view(R, W), pos.view(R, W), index, real=real)


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
        alone = [
            decoder(input_ids=part.unsqueeze(0), use_cache=False).last_hidden_state[0] for part in (ids[:3], ids[3:])
        ]
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
