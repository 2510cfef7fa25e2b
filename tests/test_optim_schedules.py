"""TRL's learning-rate schedule in glassrl's terms: decay "linear" and warmup_ratio."""

from __future__ import annotations

import pytest
import torch
from transformers import get_linear_schedule_with_warmup

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.optim import OptimConfig, make_optimizer
from glassrl.supervised.sft import SFTConfig


def _factors(optim: OptimConfig, total: int) -> list[float]:
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = make_optimizer(model, optim, total)
    out = []
    for _ in range(total):
        out.append(optimizer.param_groups[0]["lr"] / optim.lr)
        optimizer.step()
        scheduler.step()
    return out


def _hf(warmup: int, total: int) -> list[float]:
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
    out = []
    for _ in range(total):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_linear_decay_is_transformers_linear_schedule():
    assert _factors(OptimConfig(lr=1e-3, decay="linear"), 10) == pytest.approx(_hf(0, 10))
    # after the warm-up the same line down to 0; during it glassrl's first step already trains
    # ((s + 1)/w: transformers' step 0 has learning rate 0, a step that changes nothing)
    ours, theirs = _factors(OptimConfig(lr=1e-3, warmup_steps=3, decay="linear"), 12), _hf(3, 12)
    assert ours[3:] == pytest.approx(theirs[3:])
    assert ours[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_warmup_ratio_counts_as_transformers_does():
    from transformers import TrainingArguments

    # transformers 5 reads a warmup_steps below 1 as the ratio (TRL's warmup_ratio of transformers 4)
    for ratio, total in ((0.1, 95), (0.03, 200), (0.0, 10), (0.5, 7)):
        expected = TrainingArguments(output_dir="unused", warmup_steps=ratio).get_warmup_steps(total)
        assert OptimConfig(warmup_ratio=ratio).warmup(total) == expected
    ours = _factors(OptimConfig(lr=1e-3, warmup_ratio=0.25, decay="linear"), 8)  # 2 warm-up steps
    assert ours == pytest.approx(_factors(OptimConfig(lr=1e-3, warmup_steps=2, decay="linear"), 8))


def test_warmup_ratio_is_checked():
    with pytest.raises(GlassrlError, match=r"optim.warmup_ratio = 1.5: must be in \[0, 1\]"):
        load_config(SFTConfig, None, ["optim.warmup_ratio=1.5"])
    with pytest.raises(GlassrlError, match=r"optim.warmup_ratio .* and optim.warmup_steps both set"):
        load_config(SFTConfig, None, ["optim.warmup_ratio=0.1", "optim.warmup_steps=5"])
    cfg = load_config(SFTConfig, None, ["optim.warmup_ratio=0.1", "optim.warmup_steps=0"])
    assert cfg.optim.warmup(50) == 5
