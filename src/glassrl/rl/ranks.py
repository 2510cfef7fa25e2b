"""The ranks an update runs on (glassrl.rl.update.run_updates, PPO-ptx's term: glassrl.rl.ptx):
one process, where every collective is the identity, or a rank of a data-parallel group
(glassrl.workers.data_parallel.DataParallelModel, DDP replicas or FSDP2 shards)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

Batch = dict[str, torch.Tensor]


class Ranks(Protocol):
    """The ranks an update runs on, as the loop sees them: what differs between one process
    (:class:`OneProcess`, every collective the identity) and a rank of a data-parallel group
    (glassrl.workers.data_parallel.DataParallelModel, DDP replicas or FSDP2 shards)."""

    world_size: int

    def forward(self, fn: Callable[[torch.nn.Module, Batch], Any], micro: Batch) -> Any:
        """``fn(model, micro)``, a forward pass with gradient (through the DDP / FSDP2 wrapper)."""

    def gradient_sync(self, on: bool) -> AbstractContextManager[None]:
        """Around a forward and its backward: the gradients are reduced over the ranks only when ``on``."""

    def passes(self, n: int) -> int:
        """Passes to run when this rank has ``n``: n, or the most any rank has (FSDP2 gathers in each)."""

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks."""

    def combine(self, values: dict[str, torch.Tensor], alike: str) -> tuple[dict[str, torch.Tensor], str]:
        """An optimiser step's values over all ranks: each this rank's share, summed, except
        ``alike``, equal on every rank (rank 0's); and " on ranks r, … of W" naming the ranks
        whose own shares are not finite ("" in one process)."""


class OneProcess:
    """The update in one process: every collective is the identity."""

    world_size = 1

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def forward(self, fn: Callable[[torch.nn.Module, Batch], Any], micro: Batch) -> Any:
        return fn(self.model, micro)

    def gradient_sync(self, on: bool) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def passes(self, n: int) -> int:
        return n

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def combine(self, values: dict[str, torch.Tensor], alike: str) -> tuple[dict[str, torch.Tensor], str]:
        return values, ""
