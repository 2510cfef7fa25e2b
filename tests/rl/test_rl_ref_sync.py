"""algo.kl.ref_sync_every (TR-DPO's soft update of π_ref, TRL's sync_ref_model): by hand, in a run,
across a resume, and its misuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig
from glassrl.workers.local import LocalReference
from run_helpers import KillAt, Killed, assert_same_weights, logged_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _trainer(overrides: list[str], **kwargs):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / "grpo.yaml", overrides), progress=False, **kwargs)


def test_mix_in_by_hand():
    ref, actor = torch.nn.Linear(2, 1, bias=False), torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([[1.0, -2.0]]))
        actor.weight.copy_(torch.tensor([[3.0, 2.0]]))
    worker = LocalReference(ref, passes=None, synced=True)
    worker.mix_in(actor, 0.25)  # 0.25·θ + 0.75·θ_ref
    assert ref.weight.tolist() == [[1.5, -1.0]]
    worker.mix_in(actor, 1.0)  # α = 1 copies θ
    assert ref.weight.tolist() == [[3.0, 2.0]]
    assert worker.part_names == ("reference",) and LocalReference(ref, passes=None).part_names == ()


def test_the_reference_follows_the_actor_every_n_steps(fast, tmp_path):
    trainer = _trainer(
        [*fast, "steps=2", "algo.kl.ref_sync_every=2", "algo.kl.ref_sync_alpha=1", f"output_dir={tmp_path}"]
    )
    before = {n: p.clone() for n, p in trainer.workers.reference.model.named_parameters()}
    trainer.step()  # step 1: no sync
    assert all(torch.equal(p, before[n]) for n, p in trainer.workers.reference.model.named_parameters())
    trainer.step()  # step 2: α = 1, π_ref is π_θ after the update
    assert_same_weights(trainer.workers.reference.model, trainer.workers.actor.model, "reference")
    trainer.close()


@pytest.mark.slow
def test_a_synced_reference_resumes_bit_identically(fast, tmp_path):
    common = [
        *fast,
        "steps=4",
        "algo.kl.ref_sync_every=1",
        "algo.kl.ref_sync_alpha=0.5",
        "actor_optim.lr=0.001",
        "logging.checkpoint_every=2",
        "logging.keep_checkpoints=1",
    ]
    straight = _trainer([*common, f"output_dir={tmp_path / 'straight'}"])
    straight.train()
    run = [*common, f"output_dir={tmp_path / 'resumed'}"]
    victim = _trainer(run)
    victim.sinks.sinks.append(KillAt(3))
    with pytest.raises(Killed):
        victim.train()
    resumed = _trainer(run, resume=True)
    assert resumed.counters.step == 2
    resumed.train()
    assert_same_weights(straight.workers.reference.model, resumed.workers.reference.model, "reference")
    assert logged_metrics(tmp_path / "straight") == logged_metrics(tmp_path / "resumed")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.kl.ref_sync_every=2", "algo.kl.ref_sync_alpha=0"], r"algo.kl.ref_sync_alpha.*must lie in \(0, 1\]"),
        (["algo.kl.ref_sync_alpha=0.5"], "algo.kl.ref_sync_every = 0 keeps π_ref fixed"),
        (["algo.kl.ref_sync_every=2", "model.lora.r=4"], "name a model.reference"),
        (["algo.kl.ref_sync_every=-1"], "algo.kl.ref_sync_every"),
    ],
)
def test_misuses_are_one_line(overrides, message):
    with pytest.raises(GlassrlError, match=message) as err:
        load_config(TrainConfig, EXAMPLES / "grpo.yaml", overrides)
    assert "\n" not in str(err.value)
