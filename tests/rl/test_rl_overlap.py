"""rollout.overlap: the next batch is sampled during the step, by the policy before the step's update.

- the importance correction: a batch sampled ahead trains with π_old = the policy that sampled it
  (its log-probs equal those of the weights before the previous update, not the current ones);
- rollout/staleness is 1 for such a batch, 0 for one sampled in its own step (the first, and the
  step after a checkpoint or an evaluation, which sample nothing ahead);
- with a learning rate too small to move the weights, the overlapped run is the synchronous run:
  same prompts, same draws of the sampling generator, same numbers;
- the settings it cannot serve are refused, naming the key;
- it is the asynchronous buffer at k = 1 (glassrl.rl.sampling.AsyncRounds): DAPO's dynamic sampling
  and multi-turn rollouts run on it, and a run stopped with a round in flight checkpoints that round
  and resumes as the run that never stopped.
"""

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.ledger import read_jsonl
from glassrl.report.metrics_doc import undocumented
from glassrl.rl import phases
from glassrl.rl.build import forward_passes
from glassrl.rl.config import TrainConfig
from glassrl.run.checkpoint import CheckpointManager
from glassrl.run.stop import Stopped
from glassrl.workers.local import FrozenActor
from helpers import preset_trainer
from reliability.harness import checkpoint_contents
from run_helpers import assert_same_weights, logged_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
AGENT_ENV = Path(__file__).resolve().parent / "agentic_env.py"
MIXED_REWARD = "reward.sources=[{name: user_function, spec: 'trainer_reward_fns:says_yes'}]"


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_batch_sampled_ahead_trains_with_the_sampling_policys_logprobs(fast, monkeypatch):
    moves = ["actor_optim.warmup_steps=0", "actor_optim.lr=1e-2"]  # so that each update visibly moves π_θ
    trainer = preset_trainer("grpo", [*fast, "steps=3", "rollout.overlap=true", *moves])
    actor = trainer.workers.actor
    before_update = []  # the actor's weights before each step's update
    update = actor.update
    monkeypatch.setattr(
        actor, "update", lambda *args: before_update.append(copy.deepcopy(actor.model)) or update(*args)
    )
    seen = []  # (step's batch, log π_old it trained with)
    policy_outputs = phases.policy_outputs
    monkeypatch.setattr(
        phases, "policy_outputs", lambda exp, lp, *rest: seen.append((exp, lp)) or policy_outputs(exp, lp, *rest)
    )
    trainer.train()
    assert [r["rollout/staleness"] for r in _rows(trainer.out)[1:]] == [0, 1, 1]
    assert len(seen) == 3  # step 1: phase 3's own pass; steps 2 and 3: the sampling copy's log-probs
    moved = 0
    for (exp, logprobs), sampled_by, current in zip(seen[1:], before_update[:2], before_update[1:], strict=True):
        batch = phases.model_batch(exp)
        mask = exp.rollout.response_mask
        passes = forward_passes(trainer.cfg)  # as the run computes (its shared-prefix layout too)
        by_sampler = FrozenActor(sampled_by, passes).compute_logprobs(batch)[0]
        by_current = FrozenActor(current, passes).compute_logprobs(batch)[0]
        assert (logprobs - by_sampler)[mask].abs().max() <= 1e-6
        if (by_current - by_sampler)[mask].abs().max() > 1e-4:  # the update in between moved the policy
            assert (logprobs - by_current)[mask].abs().max() > 1e-4
            moved += 1
    assert moved  # (a step whose rewards are all equal has zero advantages: nothing moves)


def test_no_sampling_ahead_across_a_checkpoint(fast):
    trainer = preset_trainer("grpo", [*fast, "steps=4", "rollout.overlap=true", "logging.checkpoint_every=2"])
    trainer.train()
    rows = _rows(trainer.out)
    assert [r["rollout/staleness"] for r in rows[1:]] == [0, 1, 0, 1]
    assert not trainer.rounds.rounds  # nothing requested ahead is left after the last step
    assert undocumented({k for r in rows for k in r if k != "step"}) == []  # docs/metrics.md


def test_overlap_equals_sync_when_the_weights_stand_still(fast, tmp_path):
    runs = {}
    for overlap in ("false", "true"):
        out = tmp_path / overlap
        trainer = preset_trainer(
            "grpo", [*fast, "steps=3", "actor_optim.lr=1e-30", f"rollout.overlap={overlap}", f"output_dir={out}"]
        )
        trainer.train()
        rows = _rows(out)
        # the sync truth check: only the sampling copy (overlap) has weights moved to it, every sync proven
        assert all(r.get("sync/breaches", 0) == 0 for r in rows)
        assert (overlap == "true") == any("sync/checks" in r for r in rows)
        runs[overlap] = [{k: v for k, v in r.items() if not k.startswith(("perf/", "rollout/", "sync/"))} for r in rows]
        for step in (1, 2, 3):
            ledger = read_jsonl(out / "ledgers" / f"step_{step:06d}.jsonl")
            runs[overlap].append([(r.response, [t.logprobs for t in r.tokens]) for r in ledger.responses])
    sync, ahead = runs["false"], runs["true"]
    assert len(sync) == len(ahead)
    for a, b in zip(sync, ahead):
        if isinstance(a, dict):
            assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-6, nan_ok=True) for k in a)
        else:  # the same responses, the same log π_old per token
            assert [text for text, _ in a] == [text for text, _ in b]
            assert torch.allclose(
                torch.tensor([x for _, lp in a for x in lp]), torch.tensor([x for _, lp in b for x in lp]), atol=1e-6
            )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["algo.advantage=remax"], "algo.advantage = remax samples greedy baselines"),
        (["trainer.backend=ray"], "not wired into trainer.backend = ray"),
    ],
)
def test_overlap_refuses_what_samples_within_a_step(extra, message, fast):
    with pytest.raises(GlassrlError, match=f"rollout.overlap = True: {message}"):
        preset_trainer("grpo", [*fast, "rollout.overlap=true", *extra])


def test_max_staleness_one_is_overlap_on_the_local_backend(fast, tmp_path):
    runs = {}
    for key in ("rollout.overlap=true", "rollout.max_staleness=1"):
        out = tmp_path / key
        preset_trainer("grpo", [*fast, "steps=3", key, "logging.checkpoint_every=2", f"output_dir={out}"]).train()
        runs[key] = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in _rows(out)]
    overlap, staleness = runs.values()
    assert [r["rollout/staleness"] for r in staleness[1:]] == [0, 1, 0]
    assert overlap == staleness  # every number, bit for bit


class StopAt:
    """A metrics sink that asks the run to stop (SIGINT, as Ctrl-C) right after logging step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def log(self, step, metrics):
        if step == self.at:
            os.kill(os.getpid(), signal.SIGINT)

    def log_samples(self, step, rows):
        pass

    def close(self):
        pass


def _agentic(model: Path, out: Path) -> list[str]:
    return [
        f"model.actor={model}",
        "data.train=task:tool-add",
        "data.eval_size=4",
        f"output_dir={out}",
        "rollout.n=2",
        "rollout.max_new_tokens=40",
        "batch.prompts_per_step=4",
        "batch.mini_batch_prompts=2",
        "batch.micro_batch_responses=4",
        "logging.eval_group_by=null",
        "reward.sources=[{name: numeric}]",
        f"rollout.agent.environment={AGENT_ENV}:Retry",
        # in the trainer: the worker's episodes are these (tests/reliability/test_reliability_environment_isolation.py)
        "rollout.agent.environment_in_process=true",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dynamic_sampling", "agent"])
def test_sampling_ahead_with_a_round_in_flight_stops_and_resumes_exactly(case, fast, tiny_model_dir, tmp_path):
    """DAPO's dynamic sampling and multi-turn rollouts sample ahead on the local backend; a stop after a
    step that requested the next round checkpoints that round (waited for) with the generator after it,
    and the resumed run is the run that never stopped: every metric, the weights, the last checkpoint."""
    if case == "dynamic_sampling":
        preset, common = "dapo", [*fast, MIXED_REWARD, "algo.dynamic_sampling_max_rounds=8"]
    else:
        preset, common = "grpo", _agentic(tiny_model_dir, tmp_path / "run")
    common += ["steps=4", "rollout.max_staleness=1", "logging.ledger_every=0", "logging.checkpoint_every=0"]

    def trainer(out: Path, **kwargs):
        from glassrl.rl.loop import Trainer

        cfg = load_config(TrainConfig, EXAMPLES / f"{preset}.yaml", [*common, f"output_dir={out}"])
        return Trainer(cfg, progress=False, **kwargs)

    straight = trainer(tmp_path / "straight")
    straight.train()
    rows = logged_metrics(tmp_path / "straight")
    assert [r["rollout/staleness"] for r in rows[1:]] == [0, 1, 1, 1]
    victim = trainer(tmp_path / "stopped")
    victim.sinks.sinks.append(StopAt(2))
    with pytest.raises(Stopped):
        victim.train()
    checkpoints = CheckpointManager(tmp_path / "stopped" / "checkpoints", 1)
    buffer = checkpoints.load_part(checkpoints.latest(), "rollout_buffer")
    assert checkpoints.latest().name == "step_00000002" and len(buffer["rounds"]) == 1  # step 3's, requested in 2
    again = trainer(tmp_path / "stopped", resume=True)
    assert again.counters.step == 2 and len(again.rounds.rounds) == 1
    again.train()
    assert_same_weights(straight.workers.actor.model, again.workers.actor.model)
    assert logged_metrics(tmp_path / "stopped") == rows  # every number, bit for bit
    one, two = (
        checkpoint_contents(r / "checkpoints" / "step_00000004") for r in (tmp_path / "straight", tmp_path / "stopped")
    )
    assert {k: v for k, v in one.items() if k != "config"} == {k: v for k, v in two.items() if k != "config"}
