"""One optimiser step per batch: the update's own forward stands in for phase 3's actor pass.

π_old = π_θ then (same weights, same inputs), so the trainer skips the pass and takes log π_old,
H and the KL from the update (glassrl.rl.update.run_updates, ``forward_outputs``). These
tests run the same steps both ways and compare everything a run shows: metrics, ledgers and the
weights after the steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from helpers import preset_trainer
from run_helpers import assert_ledgers_close, largest_weight_difference

ONE_STEP = ["batch.mini_batch_prompts=4"]  # = prompts_per_step: one optimiser step per training step


def _run(preset: str, overrides: list[str], out: Path, *, skip: bool):
    trainer = preset_trainer(preset, [*overrides, f"output_dir={out}"])
    assert trainer.old_logprobs_from_update  # the config allows the skip
    trainer.old_logprobs_from_update = skip
    passes = []
    compute = trainer.workers.actor.compute_logprobs
    trainer.workers.actor.compute_logprobs = lambda batch: passes.append(1) or compute(batch)
    trainer.train()
    return trainer, len(passes)


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def _close(a, b, tol: float = 1e-6) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and (math.isnan(a) and math.isnan(b) or abs(a - b) <= tol)
    return a == b


@pytest.mark.parametrize(
    ("preset", "extra"),
    [
        ("grpo", []),  # KL in the loss
        ("grpo", ["algo.advantage=gae", "algo.entropy_coef=0.01"]),  # a critic, the entropy in the loss
        ("dr_grpo", []),  # no KL, no reference
    ],
)
@pytest.mark.slow
def test_update_forward_gives_phase_3s_numbers(preset, extra, fast, tmp_path):
    # Padded passes: phase 3's and the update's then compute each row alike, to the bit. Shared-prefix
    # layouts pack a row with different others in the two (1e-6 apart: test_trainer_shared_prefix).
    overrides = [*fast, *ONE_STEP, *extra, "logging.eval_every=0", "model.shared_prefix=false"]
    skipped, skipped_passes = _run(preset, overrides, tmp_path / "skip", skip=True)
    full, full_passes = _run(preset, overrides, tmp_path / "full", skip=False)
    assert (skipped_passes, full_passes) == (0, 2)  # phase 3's actor pass: never / once per step

    # metrics: the same keys, the same values (approx_kl is 0 exactly, not ~1e-9)
    rows_skip, rows_full = _metrics(tmp_path / "skip"), _metrics(tmp_path / "full")
    assert [r.keys() for r in rows_skip] == [r.keys() for r in rows_full]
    for a, b in zip(rows_skip, rows_full):
        bad = {k: (a[k], b[k]) for k in a if not _close(a[k], b[k])}
        assert not bad
    assert "actor/entropy" in rows_skip[1]

    # ledgers: every token's log π_old, kl, rewards, advantages, ...
    for a, b in assert_ledgers_close(tmp_path / "skip", tmp_path / "full", _close):
        assert a.beta == b.beta
        assert any(t.logprobs is not None for r in a.responses for t in r.tokens)

    # weights after the two steps
    wa = skipped.workers.actor.model.state_dict()
    assert largest_weight_difference(skipped.workers.actor.model, full.workers.actor.model) <= 1e-6
    assert any(not torch.equal(wa[k], v) for k, v in _initial(skipped).items())  # the weights did move


def _initial(trainer) -> dict[str, torch.Tensor]:
    from glassrl.models import load_causal_lm

    return load_causal_lm(trainer.cfg.model.actor, dtype="float32", device="cpu").state_dict()


@pytest.mark.parametrize(
    "extra",
    [
        ["batch.mini_batch_prompts=2"],  # two optimiser steps: the second one's π_θ is not π_old
        ["batch.epochs=2"],
        ["algo.kl.placement=reward"],  # the rewards read log π_old before the update
    ],
)
def test_no_skip_when_pi_old_is_needed(extra, fast):
    trainer = preset_trainer("grpo", [*fast, *ONE_STEP, *extra])
    try:
        assert not trainer.old_logprobs_from_update
    finally:
        trainer.close()
