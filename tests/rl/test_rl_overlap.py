"""rollout.overlap: the next batch is sampled during the step, by the policy before the step's update.

- the importance correction: a batch sampled ahead trains with π_old = the policy that sampled it
  (its log-probs equal those of the weights before the previous update, not the current ones);
- rollout/staleness is 1 for such a batch, 0 for one sampled in its own step (the first, and the
  step after a checkpoint or an evaluation, which sample nothing ahead);
- with a learning rate too small to move the weights, the overlapped run is the synchronous run:
  same prompts, same draws of the sampling generator, same numbers;
- the settings it cannot serve are refused, naming the key.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from glassrl.errors import GlassrlError
from glassrl.ledger import read_jsonl
from glassrl.report.metrics_doc import undocumented
from glassrl.rl import phases
from glassrl.rl.build import forward_passes
from glassrl.workers.local import FrozenActor
from helpers import preset_trainer


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
    assert trainer.ahead is None
    assert undocumented({k for r in rows for k in r if k != "step"}) == []  # docs/metrics.md


def test_overlap_equals_sync_when_the_weights_stand_still(fast, tmp_path):
    runs = {}
    for overlap in ("false", "true"):
        out = tmp_path / overlap
        trainer = preset_trainer(
            "grpo", [*fast, "steps=3", "actor_optim.lr=1e-30", f"rollout.overlap={overlap}", f"output_dir={out}"]
        )
        trainer.train()
        runs[overlap] = [{k: v for k, v in r.items() if not k.startswith(("perf/", "rollout/"))} for r in _rows(out)]
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
        (["algo.dynamic_sampling=true"], "algo.dynamic_sampling samples more rounds"),
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
