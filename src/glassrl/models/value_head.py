"""A causal LM with a scalar value head: the critic/reward-model form used by TRL and OpenRLHF.

On disk (one directory)::

    config.json, model.safetensors, ...   the causal LM, loadable by AutoModelForCausalLM
    value_head.safetensors                {"weight": (1, H), "bias": (1,)}
    value_head.json                       marker: {"head": "value-head", "hidden_size": H}

The marker is how :func:`glassrl.models.loading.load_scalar_model` recognises
the format; the backbone directory stays a normal Hugging Face checkpoint, so
the same weights can also seed an actor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from glassrl.errors import GlassrlError

VALUE_HEAD_MARKER = "value_head.json"
VALUE_HEAD_WEIGHTS = "value_head.safetensors"


class CausalLMWithValueHead(nn.Module):
    """``backbone`` (a causal LM) + ``v_head`` Linear(H, 1) on its last hidden state.

    ``forward`` runs only the decoder (``backbone.get_decoder()``), never the LM
    head: no ``(B, L, V)`` logits are built for a value.
    """

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        param = next(backbone.parameters())
        hidden = backbone.config.get_text_config().hidden_size
        self.v_head = nn.Linear(hidden, 1, dtype=param.dtype, device=param.device)
        # Same rule as Hugging Face's _init_weights for a fresh Linear (normal(0, initializer_range),
        # bias 0), so both scalar heads start alike; drawn from torch's global RNG.
        nn.init.normal_(self.v_head.weight, mean=0.0, std=getattr(backbone.config, "initializer_range", 0.02))
        nn.init.zeros_(self.v_head.bias)

    @property
    def config(self):
        return self.backbone.config

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``input_ids``, ``attention_mask``, ``position_ids`` (B, L) -> scalars (B, L)."""
        hidden = self.backbone.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, L, H)
        return self.v_head(hidden).squeeze(-1)  # (B, L)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype, device: torch.device) -> CausalLMWithValueHead:
        """Backbone from ``path``; head from ``value_head.safetensors`` if present, else fresh (torch's RNG)."""
        path = Path(path)
        backbone = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        model = cls(backbone)
        if (path / VALUE_HEAD_MARKER).is_file():
            weights = path / VALUE_HEAD_WEIGHTS
            if not weights.is_file():
                raise GlassrlError(f"{path}: has {VALUE_HEAD_MARKER} but no {VALUE_HEAD_WEIGHTS}")
            model.v_head.load_state_dict(load_file(weights))
        return model.to(device)

    def save_pretrained(self, path: str | Path) -> None:
        """Write the backbone in Hugging Face format (safetensors), the head, and the marker."""
        path = Path(path)
        self.backbone.save_pretrained(path)
        state = {k: v.detach().cpu().contiguous() for k, v in self.v_head.state_dict().items()}
        save_file(state, path / VALUE_HEAD_WEIGHTS)
        marker = {"head": "value-head", "weights": VALUE_HEAD_WEIGHTS, "hidden_size": self.v_head.in_features}
        (path / VALUE_HEAD_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
