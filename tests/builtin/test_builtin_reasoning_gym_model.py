"""The reasoning-gym model's build (glassrl.builtin.reasoning_gym_model), at a tiny size: SFT on the
training seed's entries, held-out accuracy on the evaluation seed's, scored by reasoning-gym's
score_answer; ``model.actor: default-rg`` names it. The shipped build: test_builtin_shipped.py."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from rich.console import Console

from glassrl.builtin.registry import BUILTIN_MODELS, REBUILD


def test_a_tiny_build_trains_on_the_training_seed_and_scores_the_evaluation_seed(tmp_path):
    pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra: pip install -e '.[reasoning-gym]'")
    from glassrl.agents.hubs.reasoning_gym import records
    from glassrl.builtin.reasoning_gym_model import RG_MODEL, RG_SPEC, build_reasoning_gym_model

    spec = dataclasses.replace(RG_SPEC, hidden_size=32, intermediate_size=64, sft_examples=64, sft_steps=4, eval_size=8)
    info = build_reasoning_gym_model(tmp_path, spec=spec, console=Console(file=io.StringIO()))
    assert json.loads((tmp_path / "glassrl.json").read_text()) == info
    rows = [json.loads(line) for line in (tmp_path / "sft_data.jsonl").read_text().splitlines()]
    train = records(spec.dataset, seed=spec.train_seed, size=spec.sft_examples, config=spec.config())
    assert [(r["prompt"], r["response"]) for r in rows] == [(t.prompt, t.answer) for t in train]
    held_out = info["heldout_reasoning_gym"]
    assert held_out["n"] == 8 and 0 <= held_out["accuracy"] <= 1 and 0 < held_out["unseen"] <= 1
    assert info["spec"]["eval_seed"] - info["spec"]["train_seed"] >= spec.sft_examples  # Random(seed + i)
    assert BUILTIN_MODELS[RG_MODEL] and REBUILD[RG_MODEL] == "--force --agent reasoning-gym"
