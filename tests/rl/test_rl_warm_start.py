"""A warm start: a model key naming a run or one of its checkpoints loads that checkpoint's model
(issue 31, item 1: it was a raw "Unrecognized model" traceback)."""

from __future__ import annotations

import io

import pytest
import torch
import yaml
from rich.console import Console
from transformers import AutoModelForCausalLM

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig
from helpers import EXAMPLES, preset_trainer
from run_helpers import assert_same_weights


def _trainer(overrides: list[str]):
    from glassrl.rl.loop import Trainer

    out = io.StringIO()
    cfg = load_config(TrainConfig, EXAMPLES / "ppo.yaml", overrides)
    return Trainer(cfg, progress=False, console=Console(file=out, width=400)), out


def test_a_run_or_checkpoint_names_the_policy_reference_and_critic_it_holds(fast, tiny_model_dir, tmp_path):
    source = tmp_path / "run"
    preset_trainer("ppo", [*fast, "logging.checkpoint_every=1"]).train()
    step_1 = source / "checkpoints" / "step_00000001"
    warm = [
        *fast,
        f"output_dir={tmp_path / 'warm'}",
        f"model.actor={step_1}",  # one checkpoint
        f"model.reference={source}",  # a run: its latest checkpoint, step 2
        f"model.critic={source / 'checkpoints' / 'latest'}",  # its pointer: the same
        "actor_optim.lr=1e-5",  # the point of a warm start: another learning rate
    ]
    trainer, out = _trainer(warm)
    lines = out.getvalue()
    assert f"model.actor: {step_1 / 'actor'} (the policy at step 1 of the run {source})" in lines
    latest = source / "checkpoints" / "step_00000002"
    assert f"model.reference: {latest / 'actor'} (the policy at step 2 of the run {source})" in lines
    assert f"model.critic: {latest / 'critic'} (the critic at step 2 of the run {source})" in lines
    assert trainer.cfg.model.actor == str(step_1 / "actor")
    saved = AutoModelForCausalLM.from_pretrained(step_1 / "actor")
    assert_same_weights(trainer.workers.actor.model, saved)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(w, base[k]) for k, w in saved.state_dict().items())  # step 1 trained it
    trainer.train()
    recorded = yaml.safe_load((tmp_path / "warm" / "config.yaml").read_text(encoding="utf-8"))
    assert recorded["model"]["actor"] == str(step_1 / "actor")  # what was loaded, by its directory


def test_a_lora_checkpoint_or_a_missing_critic_is_one_line(fast, tmp_path):
    source = tmp_path / "run"
    preset_trainer("grpo", [*fast, "model.lora=true", "steps=1"]).train()
    with pytest.raises(
        GlassrlError, match=r"^model\.actor = .*: checkpoint .* holds LoRA adapters, not a model; merge"
    ):
        _trainer([*fast, f"output_dir={tmp_path / 'warm'}", f"model.actor={source}"])
    with pytest.raises(GlassrlError, match=r"^model\.critic = .*: checkpoint .*step_00000001 holds no critic"):
        _trainer([*fast, f"output_dir={tmp_path / 'warm'}", f"model.critic={source}"])
