"""Asynchronous training on a local Ray cluster (2 CPUs): ``rollout.max_staleness: k`` with the rollout
ranks apart sampling up to k batches ahead while the actor trains (glassrl.rl.sampling.AsyncRounds,
glassrl.workers.async_rollout).

The guarantees, each checked on every token the runs trained on (the ledgers hold every response:
``logging.ledger_samples`` = the step's responses):

- the bound: no token lags the update that trains on it by more than k versions; with the
  deterministic schedule (``rollout.partial_rollouts: false``) every token of step s lags exactly
  min(k, s − 1) (the round was requested k steps before, with the version then), as the ledger
  records on every token with its log μ (equal to log π_old where the lag is 0);
- nothing lost or used twice: a run killed after step 3 is logged (before its checkpoint) and resumed
  from step 2's trains on the same prompts, step by step, as a run that never stopped, each prompt of
  the stream once; with the deterministic schedule it logs every number bit for bit as that run;
  so does a run whose rollout rank is killed (no clean-up) while it samples ahead: the run ends
  naming the rank, and its resume from the last checkpoint is the run that never stopped;
- multi-turn agent episodes (the tool-add task with a simulated user) sample on the rollout ranks:
  their observation tokens stay out of every loss and carry no version, each generated token has one;
- PPO with partial rollouts (a critic too): versions within a response never go back, the bound holds.

Slow: one Ray cluster for the module; each Trainer starts its worker processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.ledger import read_jsonl
from glassrl.rl.config import TrainConfig
from run_helpers import KillAt, Killed, logged_metrics, metric_rows

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VARIED_REWARD = "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]"


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


def _ledgers(run: Path) -> list:
    return [read_jsonl(path) for path in sorted((run / "ledgers").glob("step_*.jsonl"))]


def _prompts(run: Path) -> list[list[str]]:
    """Per step, the prompts its responses answer (the ledger's every response, in order)."""
    steps = sorted((run / "ledgers").glob("step_*.jsonl"))
    return [[r.prompt for r in read_jsonl(path).responses] for path in steps]


def test_deterministic_schedule_lags_exactly_k_and_resumes_bit_for_bit(local_ray, fast, tmp_path):
    common = _async(fast, 2, "steps=4", "logging.checkpoint_every=1")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _trainer([*common, f"output_dir={straight}"]).train()

    rows = logged_metrics(straight)
    # the sync truth check (glassrl.workers.sync_truth): each version the rank loads is proven when it loads
    # it, counted in the step that takes the batch (or the evaluation) it loaded for; none is a breach
    synced = metric_rows(straight)
    assert sum(r.get("sync/checks", 0) for r in synced) >= 2 and all(r.get("sync/breaches", 0) == 0 for r in synced)
    for row in rows[1:]:  # steps 1..4: the rounds were requested at versions 0, 0, 0, 1
        lag = min(2, row["step"] - 1)
        assert row["rollout/staleness"] == lag and row["rollout/staleness_max"] == lag
        assert row[f"rollout/staleness_share/{lag}"] == 1.0
    for step, ledger in enumerate(_ledgers(straight), start=1):  # every token trained on, from the ledger
        lag = min(2, step - 1)
        for response in ledger.responses:
            for token in response.tokens:
                assert (token.staleness, token.policy_version) == (lag, step - 1 - lag)
                assert token.rollout_logprobs is not None and token.is_weights is None  # no correction: the clip at μ
                if lag == 0:  # sampled by the weights that compute log π_old: the same numbers
                    assert abs(token.rollout_logprobs - token.logprobs) < 1e-4

    victim = _trainer([*common, f"output_dir={resumed}"])
    victim.sinks.sinks.append(KillAt(3))  # after step 3 is logged, before its checkpoint
    with pytest.raises(Killed):
        victim.train()
    again = _trainer([*common, f"output_dir={resumed}"], resume=True)
    assert again.counters.step == 2 and len(again.rounds.rounds) == 2  # rounds 3 and 4, saved with step 2
    again.train()

    assert logged_metrics(straight) == logged_metrics(resumed)  # every number, bit for bit
    assert _prompts(straight) == _prompts(resumed)  # the same prompts at the same steps: none lost, none twice


AGENT_ENV = Path(__file__).resolve().parent / "agentic_env.py"


@pytest.mark.parametrize("k", [2, 0])
def test_multi_turn_episodes_sample_on_the_rollout_ranks_each_token_versioned(local_ray, fast, tmp_path, k):
    """k = 2 on rollout ranks apart; k = 0, the synchronous Ray step, with the actor's ranks sampling."""
    out = tmp_path / "agent"
    overrides = _async(fast, k, "steps=3", f"output_dir={out}")
    overrides = [o for o in overrides if not o.startswith("reward.sources") and (k or not o.startswith("ray.rollout."))]
    overrides += [
        "data.train=task:tool-add",
        "data.eval_size=4",
        "logging.eval_group_by=null",
        "rollout.max_new_tokens=40",  # the tiny model's 64 positions
        f"rollout.agent.environment={AGENT_ENV}:Retry",  # one observation after the first turn
        "reward.sources=[{name: numeric}]",
        "logging.ledger_every=1",
        "logging.ledger_samples=64",
        "batch.mini_batch_prompts=4",  # one optimiser step a batch: log π_old and H from the update's forward
    ]
    trainer = _trainer(overrides)
    trainer.train()
    rows = logged_metrics(out)
    assert [row.get("rollout/staleness_max", 0) for row in rows[1:]] == [min(k, s) for s in range(3)]
    assert trainer.old_logprobs_from_update and all("actor/entropy" in row for row in rows[1:])
    observed = 0
    for step, ledger in enumerate(_ledgers(out), start=1):
        lag = min(k, step - 1) if k else None  # the synchronous step records no version
        for response in ledger.responses:
            assert response.turns
            for token in response.tokens:
                if token.role == "observation":  # in the context, out of every loss, no version
                    observed += 1
                    assert not token.response_mask and token.advantages is None
                    assert token.policy_version is None and token.staleness is None
                elif token.response_mask and k:
                    assert (token.staleness, token.policy_version) == (lag, step - 1 - lag)
    assert observed  # Retry answered the first turns


def test_ppo_with_partial_rollouts_keeps_the_bound(local_ray, fast, tmp_path):
    """PPO (a critic on its ranks) with partial rollouts: new weights are loaded between two tokens
    of a response in progress, so versions may change within a response, never go back, and no
    token lags more than k. (Which tokens get which version depends on timing: nothing else is
    promised.)"""
    out = tmp_path / "ppo"
    overrides = _async(fast, 2, "steps=4", "rollout.partial_rollouts=true", f"output_dir={out}")
    _trainer([*overrides, "ray.critic.resources={CPU: 0.25}"], preset="ppo").train()
    rows = logged_metrics(out)
    assert len(rows) == 5 and all("critic/values/mean" in row for row in rows[1:])
    synced = metric_rows(out)  # new weights loaded between two tokens are proven too (sync truth check)
    assert sum(r.get("sync/checks", 0) for r in synced) >= 1 and all(r.get("sync/breaches", 0) == 0 for r in synced)
    assert all(row["rollout/staleness_max"] <= 2 for row in rows[1:])
    for step, ledger in enumerate(_ledgers(out), start=1):
        for response in ledger.responses:
            versions = [t.policy_version for t in response.tokens if t.response_mask]
            assert versions == sorted(versions) and all(0 <= step - 1 - v <= 2 for v in versions)


class KillRolloutAt:
    """A metrics sink that kills the rollout rank's process (Ray's kill: no clean-up, as SIGKILL)
    right after step ``at`` is logged, while it samples the rounds ahead."""

    def __init__(self, trainer, at: int) -> None:
        self.trainer, self.at = trainer, at

    def log(self, step, metrics):
        if step == self.at:
            for host in self.trainer.workers.rollout.group.hosts:
                ray.kill(host, no_restart=True)

    def close(self):
        pass


def test_a_rollout_rank_killed_ends_the_run_naming_it_and_the_resume_loses_nothing(local_ray, fast, tmp_path):
    common = _async(fast, 1, "steps=4", "logging.checkpoint_every=2")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _trainer([*common, f"output_dir={straight}"]).train()

    victim = _trainer([*common, f"output_dir={killed}"])
    victim.sinks.sinks.append(KillRolloutAt(victim, 3))  # its round for step 4 is in flight
    with pytest.raises(GlassrlError, match=r"rollout worker rank 0 of 1 died"):
        victim.train()
    again = _trainer([*common, f"output_dir={killed}"], resume=True)
    assert again.counters.step == 2
    again.train()
    assert logged_metrics(straight) == logged_metrics(killed)  # every number, bit for bit
    assert _prompts(straight) == _prompts(killed)  # none lost, none twice


def test_dynamic_sampling_and_evaluation_on_the_asynchronous_path(local_ray, fast, tmp_path):
    """DAPO's dynamic sampling takes rounds until its groups are mixed (a round may be taken in the
    step after the one that requested it, and kept groups expire rather than lag too far);
    evaluation samples with the current weights behind the rounds in flight."""
    out = tmp_path / "dapo"
    overrides = _async(fast, 1, "steps=3", "logging.eval_every=2", f"output_dir={out}")
    trainer = _trainer(overrides, preset="dapo")
    trainer.train()
    rows = logged_metrics(out)
    assert all(row["rollout/staleness_max"] <= 1 for row in rows[1:] if "rollout/staleness_max" in row)
    assert sum(row.get("sampling/rounds", 0) for row in rows) >= 3
    assert any(key.startswith("eval/") for row in rows for key in row)
