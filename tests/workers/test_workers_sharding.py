"""Splitting a batch over ranks by tokens (glassrl.workers.sharding): hand-computed partitions,
invariants (hypothesis), and the plan split of an actor batch."""

from __future__ import annotations

import pytest
import torch
from dp_cases import actor_batch, plan_for
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.workers.sharding import balanced_partitions, gather_rows, shard_plan, shard_rows


def test_balanced_partitions_by_hand():
    # 5→p0, 4→p1, 3→p1, 3→p0, 2→p1 (p1 full), 1→p0: sums 9 and 9, 3 rows each.
    assert balanced_partitions([5, 4, 3, 3, 2, 1], 2) == [[0, 3, 5], [1, 2, 4]]
    # Row counts stay equal even when one long row outweighs the rest.
    assert balanced_partitions([10, 1, 1, 1], 2) == [[0, 3], [1, 2]]
    assert balanced_partitions([3, 3, 3], 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="cannot cut 1 rows into 2"):
        balanced_partitions([4], 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=2, max_size=40), st.integers(1, 4))
def test_balanced_partitions_invariants(lengths, parts):
    parts = min(parts, len(lengths))
    groups = balanced_partitions(lengths, parts)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    sizes = [len(g) for g in groups]
    assert max(sizes) - min(sizes) <= 1
    sums = [sum(lengths[i] for i in g) for g in groups]
    assert max(sums) - min(sums) <= max(lengths)


def test_shard_plan_covers_each_mini_batch_once(tiny_model_dir):
    batch = actor_batch(tiny_model_dir)
    plan = plan_for(8)
    shards = shard_plan(batch, plan, 2)
    for k, index in enumerate(plan):
        rows = []
        for local_batch, local_plan in shards:
            # the rank's local rows are the global rows of its part: match them by content
            picked = local_batch["input_ids"][local_plan[k]]
            rows += [int((batch["input_ids"] == r).all(-1).nonzero()) for r in picked]
        assert sorted(rows) == sorted(index.tolist())
    parts = shard_rows(batch, 2)
    assert torch.equal(gather_rows([batch["input_ids"][p] for p in parts], parts), batch["input_ids"])
