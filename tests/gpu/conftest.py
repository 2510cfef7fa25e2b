"""Fixtures of the CUDA group (tests/gpu)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """The rollout engine on the tiny default model, float32, on CUDA (one per test module)."""
    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.rollout.hf import HFRolloutEngine

    model = load_causal_lm(tiny_model_dir, dtype="float32", device="cuda")
    return HFRolloutEngine(model, load_tokenizer(tiny_model_dir))
