"""Every config glassrl saves loads back as it was saved (issue 44: the resume command a stopped
tool-using run printed was refused: its config.yaml held rollout.agent's defaults, which the
ignored-setting check read as written).

A run's config.yaml (TrainConfig) and a supervised run's ``<name>_config.yaml`` are
``yaml.safe_dump(to_dict(cfg))`` (glassrl.rl.loop, glassrl.supervised.loop); each bundled config
(every preset, the examples/ symlinks to them) and the agentic variants that turn optional
sections on are saved so and loaded back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from glassrl import presets
from glassrl.config import load_config, to_dict
from glassrl.rl.config import TrainConfig
from glassrl.supervised.preference_config import PreferenceConfig
from glassrl.supervised.rm import RMConfig
from glassrl.supervised.sft import SFTConfig

ROOT = Path(__file__).resolve().parents[1]
# Every bundled config, and examples/ (symlinks to them in a checkout; a plain file there is tested too).
# examples/cluster/rayjob.yaml is a KubeRay manifest, not a glassrl config (tests/examples/test_examples_cluster.py).
NOT_GLASSRL = {ROOT / "examples" / "cluster" / "rayjob.yaml"}
CONFIGS = sorted(presets.DIR.rglob("*.yaml")) + sorted(set((ROOT / "examples").rglob("*.yaml")) - NOT_GLASSRL)
# The command that reads each supervised config (by file stem); every other config is glassrl train's.
SUPERVISED = {"sft": SFTConfig, "rm": RMConfig} | dict.fromkeys(["dpo", "kto", "cpo", "orpo", "bco"], PreferenceConfig)
# Optional sections turned on with their defaults, on top of an agentic preset.
VARIANTS = {
    "tools": ("tool_add.yaml", ["rollout.agent.tools=[calculator]"]),
    "tools_valid_call": ("tool_add.yaml", ["rollout.agent.tools=[calculator]", "rollout.agent.valid_call_reward=0.1"]),
    "environment": ("tool_add.yaml", ["rollout.agent.environment=tool-add"]),
    "agent_defaults_on_task": ("grpo.yaml", ["data.train=task:tool-add", "rollout.agent=true"]),
    "ray": ("tool_add.yaml", ["trainer.backend=ray", "ray=true"]),
    "lora": ("grpo.yaml", ["model.lora=true"]),
}


def config_class(path: Path) -> type:
    return SUPERVISED.get(path.stem, TrainConfig)


def save_and_load(cls: type, cfg, out: Path, name: str):
    """Save ``cfg`` as its trainer does (a TrainConfig in a run directory), then load the file back."""
    out.mkdir()
    if cls is TrainConfig:
        (out / "metrics.jsonl").write_text("")  # a run directory: its config.yaml is judged by value
    saved = out / name
    saved.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True), encoding="utf-8")
    return load_config(cls, saved)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bundled_config_loads_back_as_saved(path, tmp_path):
    cls = config_class(path)
    cfg = load_config(cls, path)
    name = "config.yaml" if cls is TrainConfig else f"{path.stem}_config.yaml"
    assert save_and_load(cls, cfg, tmp_path / "run", name) == cfg


@pytest.mark.parametrize("variant", VARIANTS)
def test_optional_sections_on_load_back_as_saved(variant, tmp_path):
    file, overrides = VARIANTS[variant]
    cfg = load_config(TrainConfig, presets.DIR / file, overrides)
    assert save_and_load(TrainConfig, cfg, tmp_path / "run", "config.yaml") == cfg


def test_a_saved_key_off_its_default_still_counts_as_written(tmp_path):
    """Judged by value, the check still refuses what a hand edit set: valid_call_reward without tools."""
    from glassrl.errors import GlassrlError

    cfg = load_config(TrainConfig, presets.DIR / "tool_add.yaml")
    saved = to_dict(cfg)
    saved["rollout"]["agent"]["valid_call_reward"] = 0.5
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    with pytest.raises(GlassrlError, match=r"rollout.agent.valid_call_reward = 0.5: ignored"):
        load_config(TrainConfig, run / "config.yaml")
