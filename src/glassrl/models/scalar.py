"""One score per sequence from a scalar (reward) model: the scalar at the last real token.

The reward model reads the whole prompt ⊕ response and is trained so that its
output at the final token scores it (Ouyang et al. 2022, InstructGPT, §3.5;
Stiennon et al. 2020, §3.4). "Last real token" is the last position with
``attention_mask`` = 1, which is right for right padding, left padding and both.
"""

from __future__ import annotations

import torch
from torch import nn

from glassrl.models.loading import scalar_outputs


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """``attention_mask`` (B, L) -> (B,) index of the last position where the mask is 1 (-1 if none)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device).expand_as(attention_mask)
    return torch.where(attention_mask.bool(), positions, -1).amax(-1)  # (B,)


def sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``input_ids``, ``attention_mask`` (B, L) -> scores (B,), float32: the scalar at each row's last real token.

    Every row must have at least one real token.
    """
    scalars = scalar_outputs(model, input_ids, attention_mask)  # (B, L)
    last = last_token_index(attention_mask)  # (B,)
    return scalars.gather(-1, last.unsqueeze(-1)).squeeze(-1)  # (B,)
