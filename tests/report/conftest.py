"""The runs both report test files read: short real runs of the tiny model (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import preset_trainer, tiny_run_overrides

PRESETS = ("ppo", "grpo")


@pytest.fixture(scope="session")
def runs(tiny_model_dir, prompt_files, tmp_path_factory) -> dict[str, Path]:
    """{"ppo": dir, "grpo": dir}: 2-step runs of examples/{ppo,grpo}.yaml, a 4-response ledger every step."""
    root = tmp_path_factory.mktemp("report-runs")
    for preset in PRESETS:
        overrides = [*tiny_run_overrides(tiny_model_dir, prompt_files, root / preset), "logging.ledger_samples=4"]
        preset_trainer(preset, overrides).train()
    return {preset: root / preset for preset in PRESETS}
