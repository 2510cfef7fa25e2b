"""reward.base_dir: a reward file named relative to the config (``rewards.py:score``) is read from
the config file's directory whatever the working directory, and a run resumed from its own
config.yaml reads the same file."""

from __future__ import annotations

import json

import yaml

from glassrl.config import load_config
from glassrl.data.records import PromptRecord
from glassrl.rewards import RewardRequest
from glassrl.rl.build import build_reward
from glassrl.rl.config import TrainConfig
from glassrl.rl.loop import Trainer

REWARDS = "def score(prompt, response, answer, metadata):\n    return 0.25\n"


def project(tmp_path, config: dict):
    """A directory with rewards.py and train.yaml side by side."""
    where = tmp_path / "project"
    where.mkdir()
    (where / "rewards.py").write_text(REWARDS, encoding="utf-8")
    (where / "train.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return where


def elsewhere(tmp_path, monkeypatch, name: str):
    path = tmp_path / name
    path.mkdir()
    monkeypatch.chdir(path)
    return path


def test_a_reward_file_next_to_the_config_loads_from_another_working_directory(tmp_path, monkeypatch):
    sources = [{"name": "user_function", "spec": "rewards.py:score"}]
    where = project(tmp_path, {"reward": {"sources": sources}})
    elsewhere(tmp_path, monkeypatch, "cwd")
    cfg = load_config(TrainConfig, where / "train.yaml")
    assert cfg.reward.base_dir == str(where.resolve())  # recorded absolute, for config.yaml
    record = PromptRecord("q", answer="a")
    assert build_reward(cfg).score([RewardRequest("q", "r", record)])[0].score == 0.25


def test_base_dir_rules(tmp_path, monkeypatch):
    where = project(tmp_path, {"reward": {"base_dir": "rules"}})
    cwd = elsewhere(tmp_path, monkeypatch, "cwd")
    assert load_config(TrainConfig, where / "train.yaml").reward.base_dir == str((where / "rules").resolve())
    assert load_config(TrainConfig, None).reward.base_dir == str(cwd.resolve())  # no file: the working directory
    assert load_config(TrainConfig, None, [f"reward.base_dir={tmp_path}"]).reward.base_dir == str(tmp_path)


def test_a_run_resumed_from_its_config_yaml_reads_the_same_file(fast, tmp_path, monkeypatch):
    where = project(tmp_path, {"reward": {"sources": [{"name": "user_function", "spec": "rewards.py:score"}]}})
    elsewhere(tmp_path, monkeypatch, "first")
    Trainer(load_config(TrainConfig, where / "train.yaml", [*fast, "steps=1"]), progress=False).train()
    run = tmp_path / "run"
    saved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert saved["reward"]["base_dir"] == str(where.resolve())
    elsewhere(tmp_path, monkeypatch, "second")
    resumed = Trainer(load_config(TrainConfig, run / "config.yaml", ["steps=2"]), resume=True, progress=False)
    resumed.train()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    assert all(r["reward/mean"] == 0.25 for r in rows if "reward/mean" in r)
