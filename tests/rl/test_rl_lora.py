"""``model.lora`` end to end (in-process backend): the reference is the actor's base with its
adapters off, checkpoints hold the adapters, a killed run resumes bit-identically, and
``glassrl export`` of the run is a plain Hugging Face model equal to the merged actor."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from glassrl.cli import main
from glassrl.config import load_config
from glassrl.models.lora import merge
from glassrl.rl.config import TrainConfig
from glassrl.workers.lora import LoraReference
from run_helpers import KillAt, Killed, assert_same_weights, logged_metrics

pytest.importorskip("peft")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LORA = ["model.lora.r=4", "model.lora.alpha=8", "actor_optim.lr=0.01"]
VARIED_REWARD = "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]"


def _trainer(preset: str, overrides: list[str], **kwargs):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / f"{preset}.yaml", overrides), progress=False, **kwargs)


@pytest.mark.slow
def test_lora_run_reference_checkpoint_resume_and_export(fast, tmp_path):
    common = [*fast, *LORA, VARIED_REWARD, "steps=3", "logging.checkpoint_every=1", "logging.keep_checkpoints=1"]
    straight = _trainer("grpo", [*common, f"output_dir={tmp_path / 'straight'}"])
    actor, reference = straight.workers.actor, straight.workers.reference
    # π_ref is the actor's own model with its adapters off: one copy of the weights.
    assert isinstance(reference, LoraReference) and reference.model is actor.model
    trainable = [n for n, p in actor.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    straight.train()

    rows = logged_metrics(tmp_path / "straight")
    assert rows[1]["kl/mean"] == 0.0  # B = 0 at initialisation: π_θ = π_ref exactly at step 1
    assert any(r.get("kl/mean", 0.0) > 0 for r in rows[2:])  # the adapters moved π_θ away from π_ref
    saved = tmp_path / "straight" / "checkpoints" / "step_00000003" / "actor"
    assert (saved / "adapter_config.json").is_file() and (saved / "adapter_model.safetensors").is_file()
    assert not list(saved.glob("model*.safetensors"))  # the adapters only, not a second copy of the base

    # Killed after step 2 is logged (before its checkpoint), resumed from step 1: the same run.
    run = [*common, f"output_dir={tmp_path / 'resumed'}"]
    victim = _trainer("grpo", run)
    victim.sinks.sinks.append(KillAt(2))
    with pytest.raises(Killed):
        victim.train()
    resumed = _trainer("grpo", run, resume=True)
    assert resumed.counters.step == 1
    resumed.train()
    assert logged_metrics(tmp_path / "straight") == logged_metrics(tmp_path / "resumed")
    assert_same_weights(straight.workers.actor.model, resumed.workers.actor.model)

    # glassrl export RUN_DIR: adapters merged into a model from_pretrained loads without peft.
    out = tmp_path / "exported"
    assert main(["export", str(tmp_path / "straight"), "--out", str(out)]) == 0
    assert not (out / "adapter_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    merged = merge(copy.deepcopy(straight.workers.actor.model))
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, merged(input_ids=ids).logits, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_lora_critic_trains_adapters_and_head(fast, tmp_path):
    trainer = _trainer("ppo", [*fast, *LORA, VARIED_REWARD, "steps=1", f"output_dir={tmp_path / 'run'}"])
    critic = trainer.workers.critic.model
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable) and any(n.startswith("v_head") for n in trainable)
    trainer.train()
    saved = tmp_path / "run" / "checkpoints" / "step_00000001" / "critic"
    assert json.loads((saved / "adapter_config.json").read_text())["r"] == 4
