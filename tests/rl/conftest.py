"""The trainer tests' overrides; the tiny model and prompt files come from tests/conftest.py."""

from __future__ import annotations

import pytest

from helpers import tiny_run_overrides


@pytest.fixture
def fast(tiny_model_dir, prompt_files, tmp_path):
    """Overrides that make any TrainConfig a seconds-long run of the tiny model on 8 prompts."""
    return tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
