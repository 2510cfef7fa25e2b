"""A run killed and resumed ends bit-identical (CPU) to one that ran straight through."""

from __future__ import annotations

from pathlib import Path

import pytest

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig
from run_helpers import KillAt, Killed, assert_same_weights, logged_metrics, remove_checkpoint_part

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _trainer(preset: str, overrides: list[str], **kwargs):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / f"{preset}.yaml", overrides), progress=False, **kwargs)


# (preset, extra overrides, steps, checkpoint_every, killed after step, resumed from step,
#  data position (epoch, index) at the resumed checkpoint). 8 prompts, 4 per step.
CASES = {
    "ppo-epoch-boundary": ("ppo", ["algo.reward_norm=true", "batch.epochs=2"], 4, 2, 3, 2, (0, 8)),
    "grpo-mid-epoch": ("grpo", ["actor_optim.lr=0.001"], 3, 1, 2, 1, (0, 4)),
    "grpo-fused-adamw": ("grpo", ["actor_optim.lr=0.001", "actor_optim.kernel=fused"], 3, 1, 2, 1, (0, 4)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow
def test_resume_is_bit_identical(case, fast, tmp_path):
    preset, extra, steps, every, killed, resumed, position = CASES[case]
    common = [*fast, *extra, f"steps={steps}", f"logging.checkpoint_every={every}", "logging.keep_checkpoints=1"]
    straight = _trainer(preset, [*common, f"output_dir={tmp_path / 'straight'}"])
    straight.train()

    run = [*common, f"output_dir={tmp_path / 'resumed'}"]
    victim = _trainer(preset, run)
    victim.sinks.sinks.append(KillAt(killed))
    with pytest.raises(Killed):
        victim.train()
    resumed_trainer = _trainer(preset, run, resume=True)
    assert resumed_trainer.counters.step == resumed
    assert (resumed_trainer.prompts.epoch, resumed_trainer.prompts.index) == position
    resumed_trainer.train()

    for role in ("actor", "critic"):
        a, b = getattr(straight.workers, role), getattr(resumed_trainer.workers, role)
        if a is None:
            continue
        assert_same_weights(a.model, b.model, role)
    one, two = logged_metrics(tmp_path / "straight"), logged_metrics(tmp_path / "resumed")
    assert [r["step"] for r in two] == list(range(steps + 1))  # the killed step's row was dropped and redone
    assert one == two  # every logged number, bit for bit
    assert straight.kl.value == resumed_trainer.kl.value


def test_a_missing_part_is_an_error(fast, tmp_path):
    run = [*fast, "steps=1", f"output_dir={tmp_path / 'run'}"]
    _trainer("grpo", run).train()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000001"
    remove_checkpoint_part(checkpoint, "rng")
    with pytest.raises(GlassrlError, match=r"checkpoint step_00000001 has no part 'rng'"):
        _trainer("grpo", run, resume=True)


def test_resume_without_a_checkpoint_is_an_error(fast, tmp_path):
    with pytest.raises(GlassrlError, match=r"--resume: no checkpoint in"):
        _trainer("grpo", [*fast, f"output_dir={tmp_path / 'empty'}"], resume=True)
