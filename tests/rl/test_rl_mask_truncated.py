"""algo.mask_truncated (TRL's mask_truncated_completions): a response cut at the length limit
leaves the loss, its score still in its group's statistics."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from glassrl.rl.phases import mask_truncated
from helpers import preset_trainer, tiny_run_overrides


def test_a_cut_response_is_a_row_that_does_not_train():
    exp = SimpleNamespace(
        rollout=SimpleNamespace(finish_reasons=["stop", "length", "stop"]),
        response_mask=torch.tensor([[True, True, False], [True, True, True], [True, False, False]]),
        advantages=torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0], [0.5, 0.0, 0.0]]),
        returns=torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0], [0.5, 0.0, 0.0]]),
        deltas=None,
        whitened_advantages=None,
    )
    mask_truncated(exp)
    assert exp.response_mask.tolist() == [[True, True, False], [False, False, False], [True, False, False]]
    assert exp.advantages.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]]
    assert exp.returns[1].tolist() == [0.0, 0.0, 0.0] and exp.deltas is None


def _weights_after_one_step(tiny_model_dir, prompt_files, out, *extra):
    overrides = [*tiny_run_overrides(tiny_model_dir, prompt_files, out), "steps=1", "rollout.max_new_tokens=2"]
    trainer = preset_trainer("grpo", [*overrides, "actor_optim.lr=1e-2", *extra])
    before = {k: v.clone() for k, v in trainer.workers.actor.model.state_dict().items()}
    trainer.train()
    after = trainer.workers.actor.model.state_dict()
    return max((after[k] - before[k]).abs().max().item() for k in before)


def test_every_response_cut_leaves_the_weights_as_they_were(tiny_model_dir, prompt_files, tmp_path):
    """Two tokens cut every response of the tiny model: masked, nothing trains; unmasked, it trains."""
    masked = _weights_after_one_step(tiny_model_dir, prompt_files, tmp_path / "m", "algo.mask_truncated=true")
    assert masked == 0.0
    assert _weights_after_one_step(tiny_model_dir, prompt_files, tmp_path / "u") > 0.0
