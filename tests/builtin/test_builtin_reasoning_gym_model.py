"""The reasoning-gym model's build (glassrl.builtin.reasoning_gym_model), at a tiny size: SFT on the
training seed's entries, held-out accuracy on the evaluation seed's, scored by reasoning-gym's
score_answer; ``model.actor: default-rg`` names it. The shipped build: test_builtin_shipped.py."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import pytest
import torch
from rich.console import Console

from glassrl.builtin.registry import BUILTIN_MODELS, REBUILD


def test_a_tiny_build_trains_on_the_training_seed_and_scores_the_evaluation_seed(tmp_path):
    pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra: pip install -e '.[reasoning-gym]'")
    from glassrl.agents.hubs.reasoning_gym import records
    from glassrl.builtin.reasoning_gym_model import RG_MODEL, RG_SPEC, accuracy, build_reasoning_gym_model, headroom
    from glassrl.models.loading import load_causal_lm, load_tokenizer

    spec = dataclasses.replace(RG_SPEC, hidden_size=32, intermediate_size=64, sft_examples=64, sft_steps=4, eval_size=8)
    info = build_reasoning_gym_model(tmp_path, spec=spec, console=Console(file=io.StringIO()))
    assert json.loads((tmp_path / "glassrl.json").read_text()) == info
    rows = [json.loads(line) for line in (tmp_path / "sft_data.jsonl").read_text().splitlines()]
    train = records(spec.dataset, seed=spec.train_seed, size=spec.sft_examples, config=spec.config())
    assert [(r["prompt"], r["response"]) for r in rows] == [(t.prompt, t.answer) for t in train]
    held_out = info["heldout_reasoning_gym"]
    assert info["heldout_headroom"]["n"] == 8 and 0 <= info["heldout_headroom"]["pass@16"] <= 1
    assert held_out["n"] == 8 and 0 <= held_out["accuracy"] <= 1 and 0 < held_out["unseen"] <= 1
    assert info["spec"]["eval_seed"] - info["spec"]["train_seed"] >= spec.sft_examples  # Random(seed + i)
    assert BUILTIN_MODELS[RG_MODEL] and REBUILD[RG_MODEL] == "--force --agent reasoning-gym"

    # the headroom diagnostic on that model: greedy, sampled pass@k, p(right answer | greedy wrong)
    model, tokenizer = load_causal_lm(tmp_path, device="cpu"), load_tokenizer(tmp_path)
    entries = records(spec.dataset, seed=spec.eval_seed, size=6, config=spec.config())
    torch.manual_seed(0)
    report = headroom(model, tokenizer, entries, n=4, ks=(1, 2, 4), temperature=1.0)
    assert report["greedy"] <= accuracy(model, tokenizer, entries)  # exact answers; score_answer pays part for some
    assert report["greedy_wrong"] == round(6 * (1 - report["greedy"]))
    assert report["pass@1"] == report["sampled_mean@4"] <= report["pass@2"] <= report["pass@4"] <= 1
    assert report["greedy_wrong"] == 0 or 0 < report["p_right_if_greedy_wrong"] < 1


def test_pass_at_k_is_the_unbiased_estimator():
    from glassrl.builtin.reasoning_gym_model import pass_at_k

    assert pass_at_k(16, 0, 8) == 0 and pass_at_k(16, 9, 8) == 1  # 7 wrong cannot fill 8 draws
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 1, 2) == 0.5  # 1 - C(3,2)/C(4,2)
    assert math.isclose(pass_at_k(16, 2, 8), 1 - math.comb(14, 8) / math.comb(16, 8))
