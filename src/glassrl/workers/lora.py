"""The reference policy of a LoRA run: the actor's own model with its adapters disabled.

π_ref is the base model (Hu et al. 2021: W₀ frozen), which the actor holds anyway;
``with model.disable_adapter():`` (peft) runs it without the BA term, so the run
keeps one copy of the weights instead of two. Nothing to checkpoint: the base is
frozen and reloaded from its path. It must live in the process that holds the
actor's model (in-process, or the actor's own Ray workers: glassrl.workers.ray).
See glassrl.workers.base for the protocol.
"""

from __future__ import annotations

import torch
from torch import nn

from glassrl.workers.base import Batch
from glassrl.workers.local import Passes, micro_batched_logprobs


class LoraReference:
    """π_ref(a_i|s_i) = the actor's peft model with adapters off, at the sampling temperature."""

    part_names: tuple[str, ...] = ()  # the frozen base, loaded again from its path

    def __init__(self, model: nn.Module, passes: Passes) -> None:
        if not hasattr(model, "disable_adapter"):
            raise TypeError(f"LoraReference needs a peft model, got {type(model).__name__}")
        self.model, self.passes = model, passes

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        training = self.model.training  # micro_batched_logprobs sets eval (no adapter dropout); restored for the actor
        try:
            with self.model.disable_adapter():
                return micro_batched_logprobs(self.model, batch, self.passes, with_entropy=False)[0]
        finally:
            self.model.train(training)

    def state_dict(self) -> dict[str, tuple[str, object]]:
        return {}

    def load_state_dict(self, parts: dict[str, object]) -> None:
        pass
