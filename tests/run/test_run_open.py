"""open_checkpoint: a run directory, its latest pointer or one checkpoint; its parts verified when read."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from glassrl.errors import GlassrlError
from glassrl.run.checkpoint import CheckpointManager, Part
from glassrl.run.open import model_in_run, open_checkpoint


class _Model:
    """What an hf part saves: a directory of files."""

    def save_pretrained(self, path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text('{"model_type": "tiny"}')


@dataclass
class _Config:
    steps: int = 1


def _run(tmp_path, steps=(1, 2), critic=False):
    run = tmp_path / "run"
    manager = CheckpointManager(run / "checkpoints", keep=2)
    for step in steps:
        parts = {"actor": Part("hf", _Model()), "counters": Part("json", {"step": step})}
        if critic:
            parts["critic"] = Part("hf", _Model())
        manager.save(step, parts)
    (run / "config.yaml").write_text("steps: 7\n")
    return run


def test_a_run_its_latest_pointer_and_a_checkpoint_open_the_same_way(tmp_path):
    run = _run(tmp_path)
    latest = open_checkpoint(run)
    assert latest.path == run / "checkpoints" / "step_00000002" and latest.run == run
    assert open_checkpoint(run / "checkpoints" / "latest") == latest
    first = open_checkpoint(run / "checkpoints" / "step_00000001")
    assert first.run == run and first.part("counters") == {"step": 1}
    assert latest.actor == latest.path / "actor" and latest.critic is None
    assert latest.config(_Config).steps == 7
    assert latest.part("reward_normalizer", required=False) is None


def test_what_is_not_a_run_is_none_and_a_run_without_checkpoint_an_error(tmp_path):
    assert open_checkpoint(tmp_path) is None  # e.g. a Hugging Face model directory: the caller's to read
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.yaml").write_text("steps: 1\n")
    with pytest.raises(GlassrlError, match=r"^run directory .*empty has no checkpoint yet \(no .*latest\)$"):
        open_checkpoint(tmp_path / "empty")


def test_parts_are_verified_when_read_and_missing_ones_named(tmp_path):
    run = _run(tmp_path, critic=True)
    checkpoint = open_checkpoint(run)
    (checkpoint.path / "actor" / "config.json").write_text('{"model_type": "edited"}')
    with pytest.raises(GlassrlError, match=r"file actor/config\.json .*(corrupt|bytes)"):
        _ = checkpoint.actor
    assert checkpoint.critic == checkpoint.path / "critic"  # another part still reads
    with pytest.raises(GlassrlError, match=r"has no part 'kl_controller'$"):
        checkpoint.part("kl_controller")


def test_a_checkpoint_outside_a_run_has_no_config(tmp_path):
    root = tmp_path / "elsewhere"
    CheckpointManager(root, keep=1).save(3, {"actor": Part("hf", _Model())})
    checkpoint = open_checkpoint(root / "step_00000003")
    assert checkpoint.actor.is_dir()
    with pytest.raises(GlassrlError, match=r"is not inside a run directory \(no .*config\.yaml\)"):
        checkpoint.config(_Config)


def test_model_in_run_is_the_checkpoints_model_and_none_for_a_model_directory(tmp_path):
    run = _run(tmp_path, critic=True)
    step_1 = run / "checkpoints" / "step_00000001"
    path, line = model_in_run(step_1, "model.actor")
    assert path == (step_1 / "actor").resolve()
    assert line == f"model.actor: {step_1 / 'actor'} (the policy at step 1 of the run {run})"
    assert model_in_run(run, "model.critic", "critic")[0] == (run / "checkpoints" / "step_00000002" / "critic")
    assert model_in_run(step_1 / "actor", "model.actor") is None  # a model directory (config.json)
    assert model_in_run("Qwen/Qwen2.5-0.5B-Instruct", "model.actor") is None  # a hub id
    (run / "config.json").write_text("{}")  # an SFT/RM/DPO output: the model, beside its checkpoints
    assert model_in_run(run, "model") is None
