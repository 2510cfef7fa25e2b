"""How the driver splits a batch over the W ranks of a role, balancing tokens rather than rows.

Shapes: B responses; batches are the dicts of glassrl.workers.base. A row's work
is its token count (prompt + response): with responses of unequal lengths, equal
row counts leave some ranks idle while the longest finishes. So rows are cut by
:func:`balanced_partitions` (sequence balancing: verl ``verl/utils/seqlen_balancing.py``,
get_seqlen_balanced_partitions), for forward passes (:func:`shard_rows`) and for each
mini-batch of an update plan (:func:`shard_plan`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from glassrl.workers.base import Batch


def balanced_partitions(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Indices of ``lengths`` cut into ``parts`` groups of near-equal sum and near-equal size.

    Greedy longest-first (LPT, Graham 1969, "Bounds on multiprocessing timing
    anomalies": each item to the currently lightest part), with each part's row
    count fixed to ⌈n/parts⌉ or ⌊n/parts⌋ so that every rank runs the same number
    of rows (verl's get_seqlen_balanced_partitions uses Karmarkar–Karp under the
    same equal-size constraint). Each group is returned in increasing index order.
    """
    n = len(lengths)
    if parts < 1 or n < parts:
        raise ValueError(f"cannot cut {n} rows into {parts} non-empty parts")
    sizes = [n // parts + (1 if p < n % parts else 0) for p in range(parts)]
    heap = [(0, p) for p in range(parts)]  # (sum, part) of the parts with room left
    groups: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(n), key=lambda i: (-lengths[i], i)):
        total, p = heapq.heappop(heap)
        groups[p].append(i)
        if len(groups[p]) < sizes[p]:
            heapq.heappush(heap, (total + lengths[i], p))
    return [sorted(g) for g in groups]


def row_tokens(batch: Batch) -> torch.Tensor:
    """(B,) tokens per row (prompt + response): the work of a row's forward pass."""
    return batch["attention_mask"].sum(-1)


def shard_rows(batch: Batch, world_size: int) -> list[torch.Tensor]:
    """Per rank, the rows (index tensor) it computes in a forward pass without gradient."""
    return [torch.tensor(g) for g in balanced_partitions(row_tokens(batch).tolist(), world_size)]


def shard_plan(batch: Batch, plan: list[torch.Tensor], world_size: int) -> list[tuple[Batch, list[torch.Tensor]]]:
    """Per rank, (its rows of ``batch``, its plan indexing them): each mini-batch of ``plan``
    is split by :func:`balanced_partitions` over the rows' token counts."""
    tokens = row_tokens(batch)
    split = [
        [index[torch.tensor(g)] for g in balanced_partitions(tokens[index].tolist(), world_size)] for index in plan
    ]
    out = []
    for r in range(world_size):
        mine = [parts[r] for parts in split]
        rows = torch.cat(mine).unique()  # sorted; a row of several epochs is sent once
        local = torch.full((tokens.shape[0],), -1, dtype=torch.long)
        local[rows] = torch.arange(len(rows))
        out.append(({k: v[rows.to(v.device)] for k, v in batch.items()}, [local[i] for i in mine]))
    return out


def gather_rows(parts: list[torch.Tensor], shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of :func:`shard_rows`: rank outputs ``parts`` (rows of ``shards``) back in batch order."""
    rows = sum(len(s) for s in shards)
    out = parts[0].new_empty((rows, *parts[0].shape[1:]))
    for index, part in zip(shards, parts):
        out[index.to(out.device)] = part.to(out.device)
    return out
