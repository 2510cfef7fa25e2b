"""One rule for a training config's relative paths (issue 31, item 4; glassrl.config_paths):
the files a config travels with are read from its directory, what the command line gives from
the working directory, runs and models from the working directory."""

from __future__ import annotations

import pytest
import yaml

from glassrl.config import load_config, load_saved_config
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig


def _write(path, data: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_files_in_a_config_are_read_from_its_directory_and_the_command_lines_from_the_working_one(
    tmp_path, monkeypatch
):
    here, work = tmp_path / "configs" / "mine", tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    config = _write(
        here / "c.yaml",
        {
            "model": {"actor": "runs/sft"},
            "output_dir": "runs/grpo",
            "data": {
                "train": [{"path": "data/a.jsonl", "weight": 1}, {"path": "task:add", "weight": 1}],
                "test": "data/ds::test",
            },
            "rollout": {"agent": {"tools": ["calculator", "tools/mine.py:shout", "pkg.mod:f"]}},
        },
    )
    cfg = load_config(
        TrainConfig, config, ["data.test=held.jsonl", "reward.sources=[{name: user_function, spec: r.py:f}]"]
    )
    assert cfg.data.train == [{"path": str(here / "data" / "a.jsonl"), "weight": 1}, {"path": "task:add", "weight": 1}]
    assert cfg.data.test == "held.jsonl"  # the command line's: the working directory's, as given
    assert load_config(TrainConfig, config).data.test == f"{here / 'data' / 'ds'}::test"
    assert cfg.rollout.agent.tools == ["calculator", f"{here / 'tools' / 'mine.py'}:shout", "pkg.mod:f"]
    assert cfg.reward.sources == [{"name": "user_function", "spec": f"{work / 'r.py'}:f"}]
    assert cfg.reward.base_dir == str(here)  # the file's rewards: its directory, as before
    assert (cfg.model.actor, cfg.output_dir) == ("runs/sft", "runs/grpo")  # runs: the working directory's
    environment = load_config(TrainConfig, config, ["rollout.agent.tools=[]", "rollout.agent.environment=env.py:Make"])
    assert environment.rollout.agent.environment == "env.py:Make"


def test_a_runs_own_config_keeps_its_relative_paths_the_working_directorys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    saved = TrainConfig()
    saved.data.train = "data/train.jsonl"  # as a run before the rule recorded it
    from glassrl.config import to_dict

    _write(run / "config.yaml", to_dict(saved))
    assert load_saved_config(TrainConfig, run / "config.yaml").data.train == "data/train.jsonl"
    assert load_config(TrainConfig, run / "config.yaml").data.train == "data/train.jsonl"


def test_a_missing_data_file_names_the_path_it_resolved_to(tmp_path, monkeypatch):
    from glassrl.data.datasets import load_prompts

    monkeypatch.chdir(tmp_path)
    cfg = load_config(TrainConfig, _write(tmp_path / "configs" / "c.yaml", {"data": {"train": "gsm8k.jsonl"}}))
    with pytest.raises(GlassrlError) as info:
        load_prompts(cfg.data.train)
    assert str(info.value).startswith(f"{tmp_path / 'configs' / 'gsm8k.jsonl'}: no such file or directory")
    with pytest.raises(GlassrlError) as info:
        load_prompts(load_config(TrainConfig, None, ["data.train=gsm8k.jsonl"]).data.train)
    assert str(info.value).startswith(f"gsm8k.jsonl: no such file or directory (looked for {tmp_path / 'gsm8k.jsonl'};")


def test_an_old_checkpoints_relative_data_path_resumes_as_what_it_meant(tmp_path, monkeypatch):
    """A run from before the rule recorded its config file's data.train as written (read from the
    working directory); resumed with that file from there, today's absolute path names the same
    file, and the run goes on."""
    from glassrl.config import to_dict
    from glassrl.rl.resolve import saved_in_todays_terms, with_precision
    from glassrl.run.state import RunConfig

    monkeypatch.chdir(tmp_path)
    config = _write(tmp_path / "c.yaml", {"data": {"train": "data/x.jsonl"}, "model": {"device": "cpu"}})
    cfg = with_precision(load_config(TrainConfig, config))
    assert cfg.data.train == str(tmp_path / "data" / "x.jsonl")
    saved = to_dict(cfg)
    saved["data"]["train"] = "data/x.jsonl"
    run_config = RunConfig(to_dict(cfg), ("steps",), to_dict(TrainConfig()), upgrade=saved_in_todays_terms(cfg))
    run_config.load_state_dict({"config": saved})
    assert run_config.changes == {}
    elsewhere = saved_in_todays_terms(cfg)({"data.train": "other/x.jsonl"})
    assert elsewhere == {"data.train": "other/x.jsonl", "model.shared_prefix": False}  # another file: a change


@pytest.mark.parametrize(
    "cls_path",
    [
        "glassrl.supervised.sft:SFTConfig",
        "glassrl.supervised.rm:RMConfig",
        "glassrl.supervised.preference:PreferenceConfig",
    ],
)
def test_sft_rm_and_dpo_read_their_data_by_the_same_rule(tmp_path, monkeypatch, cls_path):
    import importlib

    module, name = cls_path.split(":")
    cls = getattr(importlib.import_module(module), name)
    here, work = tmp_path / "configs", tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    config = _write(here / "c.yaml", {"data": "pairs/train.jsonl", "eval_data": "task:arith-verify-preferences/test"})
    cfg = load_config(cls, config, [])
    assert cfg.data == str(here / "pairs" / "train.jsonl")  # the config file's directory
    assert cfg.eval_data == "task:arith-verify-preferences/test"  # a task is not a path
    cfg = load_config(cls, config, ["eval_data=held.jsonl"])
    assert cfg.eval_data == "held.jsonl"  # the command line's: the working directory's
