"""model.shared_prefix: two GRPO (and PPO: the critic too) steps with and without give the same metrics
(losses included), ledgers (log-probs, values, advantages) and weights, to float32 summation order; and
its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

import glassrl.models.shared_prefix as shared_prefix_module
from glassrl.errors import GlassrlError
from helpers import adam_weights_close, preset_trainer
from run_helpers import LAYOUT_DEPENDENT, assert_ledgers_close, logged_metrics

TOL = 1e-5
ENV = Path(__file__).resolve().parent / "agentic_env.py"


def _close(a, b) -> bool:
    """Equal to TOL relative (absolute below 1), NaN equal to NaN; other values exactly."""
    if isinstance(a, float) or isinstance(b, float):
        return b == pytest.approx(a, rel=TOL, abs=TOL, nan_ok=True)
    return a == b


@pytest.mark.parametrize(
    "extra",
    [
        ["algo.entropy_coef=0.01"],
        # PPO: the critic's value pass and its update share too; one micro-batch per mini-batch, so the
        # per-micro-batch diagnostics (vf_clip_frac) see the same rows
        [
            "preset=ppo",
            "batch.micro_batch_responses=8",
        ],  # reference and old log-probs shared; two optimiser steps of 8 rows, micro 4
        ["batch.mini_batch_prompts=4", "batch.micro_batch_responses=2"],  # on-policy; micro-batches of half groups
        # LoRA: adapters through the shared layout, π_ref = the model with adapters off, shared too; one
        # micro-batch per mini-batch, so the per-micro-batch diagnostics (approx_kl) see the same rows.
        # The entropy bonus gives the first step a gradient: without it, at π_θ = π_ref and equal rewards the
        # padded gradient is exactly 0 and the shared one rounding noise (1e-8; its reference and update
        # passes pack rows differently), which Adam's first step turns into ±lr: a different run.
        [
            "model.lora={r: 4, alpha: 8}",
            "actor_optim.lr=0.01",
            "batch.micro_batch_responses=8",
            "algo.entropy_coef=0.01",
        ],
        # multi-turn: observations in the responses (in the context, out of the loss)
        [
            "data.train=task:tool-add",
            "data.test=null",
            "reward.sources=[{name: numeric}]",
            "rollout.max_new_tokens=40",
            f"rollout.agent.environment={ENV}:Retry",
            "algo.entropy_coef=0.01",  # a gradient to compare: the tiny model earns no reward here (see LoRA)
        ],
    ],
)
@pytest.mark.slow
def test_shared_prefix_run_equals_padded_run(extra, fast, tmp_path, monkeypatch):
    calls = []  # the shared path's calls: it must be the one that ran
    layout = shared_prefix_module.pack_shared
    monkeypatch.setattr(shared_prefix_module, "pack_shared", lambda *a: calls.append(1) or layout(*a))
    trainers = {}
    preset = next((e.removeprefix("preset=") for e in extra if e.startswith("preset=")), "grpo")
    extra = [e for e in extra if not e.startswith("preset=")]
    for name, shared in (("padded", "false"), ("shared", "true")):
        trainer = preset_trainer(
            preset, [*fast, *extra, f"model.shared_prefix={shared}", f"output_dir={tmp_path / name}"]
        )
        trainer.train()
        trainers[name] = trainer
        assert bool(calls) == (shared == "true")
    padded, shared = logged_metrics(tmp_path / "padded"), logged_metrics(tmp_path / "shared")
    assert [r.keys() for r in padded] == [r.keys() for r in shared]
    for a, b in zip(padded, shared):
        assert not {k: (a[k], b[k]) for k in set(a) - LAYOUT_DEPENDENT if not _close(a[k], b[k])}
        assert all(b[k] <= a[k] for k in LAYOUT_DEPENDENT & set(a))  # the shared prompt pads no more
    trained = {k for row in padded for k in row}
    assert "actor/policy_loss" in trained and ("actor/kl_loss" in trained or "critic/value_loss" in trained)
    assert_ledgers_close(tmp_path / "padded", tmp_path / "shared", _close)
    for role in ("actor", "critic"):
        if getattr(trainers["padded"].workers, role) is None:
            continue
        padded_w, shared_w = (getattr(trainers[n].workers, role).model.state_dict() for n in ("padded", "shared"))
        lr = getattr(trainers["padded"].cfg, f"{role}_optim").lr
        assert adam_weights_close(padded_w, shared_w, tight=TOL, lr=lr) is None, role


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["model.padding_free=true"], "model.shared_prefix = True: with model.padding_free"),
    ],
)
def test_shared_prefix_refusals(fast, extra, match):
    with pytest.raises(GlassrlError, match=match):
        preset_trainer("grpo", [*fast, "model.shared_prefix=true", *extra])
