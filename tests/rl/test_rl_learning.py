"""Seeded learning test: GRPO and PPO raise the reward within a short run on the tiny model.

The reward is one the tiny model can learn in a dozen steps: 1 when the answer's verdict
is "no" (不… / No…), whatever the truth. The SFT'd tiny model says no about a third of the
time, so groups have mixed outcomes from the start (GRPO has signal), the critic has
something to fit (PPO), and the reward has room to rise. Measured: the mean reward of the last 3
steps against the first 3, with fixed seeds (deterministic on CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glassrl.config import load_config
from glassrl.rewards import REWARD_SOURCES, RewardResult
from glassrl.rl.config import TrainConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class SaysNo:
    """1.0 for a "no" verdict, else 0.0."""

    name = "says_no"

    def score(self, requests):
        return [RewardResult.ok(float(r.response.startswith(("不", "No")))) for r in requests]


PRESETS = {
    "grpo": ["actor_optim.lr=0.003"],
    "ppo": ["actor_optim.lr=0.003", "critic_optim.lr=0.01", "batch.epochs=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_reward_rises(preset, fast, tmp_path, monkeypatch):
    from glassrl.rl.loop import Trainer

    monkeypatch.setitem(REWARD_SOURCES, "says_no", SaysNo)
    overrides = [
        *fast,
        *PRESETS[preset],
        "steps=12",
        "data.eval_size=0",
        "reward.sources=[{name: says_no}]",
        "batch.prompts_per_step=4",
        "rollout.n=4",
        "batch.mini_batch_prompts=4",
        "batch.micro_batch_responses=16",
        "actor_optim.warmup_steps=0",
        "logging.ledger_every=0",
    ]
    Trainer(load_config(TrainConfig, EXAMPLES / f"{preset}.yaml", overrides), progress=False).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward/mean"] for row in rows]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last >= first + 0.3 and last >= 0.8, f"{preset}: rewards per step {rewards}"
