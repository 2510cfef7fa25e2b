"""model.padding_free: two training steps padded and packed give the same metrics (losses included),
ledgers (log-probs, values, advantages) and weights, to float32 summation order."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from glassrl.errors import GlassrlError
from helpers import preset_trainer
from run_helpers import assert_ledgers_close, largest_weight_difference

TOL = 1e-5
# 1 − Var[R − V] / Var[R] with Var[R] ≈ 1e-15 here (every return nearly equal): float noise over noise
ILL_CONDITIONED = {"critic/explained_variance"}


def _close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (
            a is not None and b is not None and (math.isnan(a) and math.isnan(b) or abs(a - b) <= TOL * max(1, abs(a)))
        )
    return a == b


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


@pytest.mark.parametrize(
    "extra",
    [
        ["algo.advantage=gae", "algo.entropy_coef=0.01"],  # actor, critic and reference packed; two optimiser steps
        ["batch.mini_batch_prompts=4"],  # one optimiser step: the on-policy update packed too
    ],
)
@pytest.mark.slow
def test_packed_run_equals_padded_run(extra, fast, tmp_path):
    trainers = {}
    for name, free in (("padded", "false"), ("packed", "true")):
        trainer = preset_trainer("grpo", [*fast, *extra, f"model.padding_free={free}", f"output_dir={tmp_path / name}"])
        trainer.train()
        trainers[name] = trainer
    padded, packed = _metrics(tmp_path / "padded"), _metrics(tmp_path / "packed")
    assert [r.keys() for r in padded] == [r.keys() for r in packed]
    for a, b in zip(padded, packed):
        assert not {k: (a[k], b[k]) for k in a.keys() - ILL_CONDITIONED if not _close(a[k], b[k])}
    assert "actor/policy_loss" in padded[1] and "actor/kl_loss" in padded[1]
    assert_ledgers_close(tmp_path / "padded", tmp_path / "packed", _close)
    for role in ("actor", "critic"):
        worker = getattr(trainers["padded"].workers, role)
        if worker is None:
            continue
        assert largest_weight_difference(worker.model, getattr(trainers["packed"].workers, role).model) <= TOL, role


def test_padding_free_is_local_only(fast):
    with pytest.raises(GlassrlError, match="model.padding_free = True: not wired into trainer.backend = ray"):
        preset_trainer("grpo", [*fast, "model.padding_free=true", "trainer.backend=ray"])
