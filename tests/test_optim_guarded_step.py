"""guarded_step (glassrl.optim) frees the gradients once the optimiser has stepped: the rollout that follows
holds none (the decoding loop's reordered weights take that room on a CPU, glassrl.rollout.packed_weights)."""

from __future__ import annotations

import pytest
import torch

from glassrl.optim import OptimConfig, guarded_step, make_optimizer


def _step(model, optimizer, scheduler, policy="stop"):
    return guarded_step(
        model,
        optimizer,
        scheduler,
        {"loss": torch.tensor(1.0)},
        max_norm=1.0,
        norm_key="grad_norm",
        policy=policy,
        where=lambda on: f"step 1{on}",
    )


def test_a_taken_step_frees_the_gradients_and_changes_the_weights():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer, scheduler = make_optimizer(model, OptimConfig(lr=0.1), total_steps=2)
    before = model.weight.detach().clone()
    model(torch.randn(5, 4)).square().sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    step = _step(model, optimizer, scheduler)
    assert step.taken and float(step.values["grad_norm"]) > 0
    assert all(p.grad is None for p in model.parameters())
    assert not torch.equal(model.weight, before)


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before")
def test_a_skipped_step_frees_them_too():
    model = torch.nn.Linear(4, 3)
    optimizer, scheduler = make_optimizer(model, OptimConfig(lr=0.1), total_steps=2)
    before = model.weight.detach().clone()
    (model(torch.randn(5, 4)).sum() * float("nan")).backward()
    step = _step(model, optimizer, scheduler, policy="skip")
    assert not step.taken and all(p.grad is None for p in model.parameters())
    assert torch.equal(model.weight, before)
