"""The seeded prompt stream: a run's prompts in an order known from its position alone."""

from __future__ import annotations

from typing import Any

import torch

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError


class PromptStream:
    """Prompts (or any records) in a seeded order, epoch after epoch; the position is (epoch, index).

    Epoch e visits every record once in the order ``torch.randperm(N)`` drawn from a
    generator seeded with (seed, e), so the order of any epoch is known from the
    position alone and nothing else needs saving. A batch may straddle two epochs.
    Checkpointed as part ``part``; ``key`` is the config key of the records (for errors).
    """

    def __init__(self, records: list[PromptRecord], seed: int, part: str = "data", key: str = "data.train") -> None:
        self.records, self.seed = records, seed
        self.part, self.key = part, key
        self.part_names = (part,)
        self.epoch, self.index = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.records), generator=generator).tolist()

    def take(self, k: int) -> list[PromptRecord]:
        """The next ``k`` records."""
        out = []
        while len(out) < k:
            if self.index == len(self.records):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self.records[self._order[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return {self.part: ("json", {"epoch": self.epoch, "index": self.index, "records": len(self.records)})}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        state = parts[self.part]
        if state["records"] != len(self.records):
            raise GlassrlError(
                f"checkpoint {self.part} position is for {state['records']} records, but {self.key} now has "
                f"{len(self.records)}: resume with the same data"
            )
        if not (0 <= state["index"] <= len(self.records) and 0 <= state["epoch"] < 2**32):
            raise GlassrlError(
                f"checkpoint {self.part} position: epoch {state['epoch']}, index {state['index']}: not a position "
                f"in {len(self.records)} records (an index in [0, {len(self.records)}], an epoch in [0, 2^32))"
            )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._permutation(self.epoch)
