"""The trainer tests' overrides; the tiny model and prompt files come from tests/conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def fast(tiny_model_dir, prompt_files, tmp_path):
    """Overrides that make any TrainConfig a seconds-long run of the tiny model on 8 prompts."""
    train, test = prompt_files
    return [
        f"model.actor={tiny_model_dir}",
        f"data.train={train}",
        f"data.test={test}",
        "data.eval_size=8",
        f"output_dir={tmp_path / 'run'}",
        "steps=2",
        "rollout.n=4",
        "rollout.max_new_tokens=16",
        "batch.prompts_per_step=4",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=4",
        "logging.ledger_every=1",
        "logging.checkpoint_every=0",
    ]
