"""DAPO dynamic sampling (Yu et al. 2025, eq. 11 constraint, Algorithm 1) in the trainer:
over-sample, keep groups with mixed scores, buffer the surplus — checkpointed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardResult
from glassrl.rl.config import TrainConfig
from glassrl.rl.phases import Sampled
from glassrl.rl.sampling import DynamicSampler
from glassrl.rollout.base import RolloutBatch
from glassrl.run.checkpoint import CheckpointManager, Part
from run_helpers import KillAt, Killed, assert_same_weights, logged_metrics, remove_checkpoint_part

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# A reward most groups of the tiny model disagree on, so that rounds leave a surplus to buffer.
MIXED_REWARD = "reward.sources=[{name: user_function, spec: 'trainer_reward_fns:says_yes'}]"

# ---------------------------------------------------------------- the sampler alone (hand-checked)


def _round(scores: list[list[float | None]], tag: str) -> Sampled:
    """A fake round: one group per inner list (G = its length); None is a failed score."""
    G, k = len(scores[0]), len(scores)
    B = G * k
    rollout = RolloutBatch(
        prompt_ids=torch.full((B, 2), 7),
        prompt_mask=torch.ones((B, 2), dtype=torch.bool),
        response_ids=torch.arange(B * 3).reshape(B, 3),
        response_mask=torch.ones((B, 3), dtype=torch.bool),
        group_index=torch.arange(k).repeat_interleave(G),
        finish_reasons=["stop"] * B,
        texts=[f"{tag}{g}.{i}" for g in range(k) for i in range(G)],
    )
    results = [
        RewardResult.error("boom") if s is None else RewardResult.ok(s, details={"sources": {"a": RewardResult.ok(s)}})
        for group in scores
        for s in group
    ]
    prompts = [PromptRecord(f"{tag}{g}", answer="1", metadata={"task": "x"}, source=f"{tag}#{g}") for g in range(k)]
    return Sampled(rollout, prompts, [[7, 7]] * k, results)


def fill(sampler: DynamicSampler, *rounds: Sampled):
    """The step's loop (glassrl.rl.loop.Trainer.step) with these rounds."""
    it = iter(rounds)
    while sampler.needs_more():
        sampler.add(next(it))
    return sampler.take()


def test_keeps_mixed_groups_and_buffers_the_surplus():
    sampler = DynamicSampler(need=2, max_rounds=3, pad_id=0)
    # round 1: [1,1] all equal (drop), [0,1] mixed (keep); round 2: both mixed -> 3 kept, 2 used, 1 left
    r1 = _round([[1.0, 1.0], [0.0, 1.0]], "a")
    r2 = _round([[1.0, 0.0], [0.5, 0.0]], "b")
    sampled, metrics = fill(sampler, r1, r2)
    assert metrics == {
        "sampling/rounds": 2,
        "sampling/groups_generated": 4,
        "sampling/groups_kept": 3,
        "sampling/buffer_groups": 1,
    }
    assert [p.prompt for p in sampled.prompts] == ["a1", "b0"]  # oldest first
    assert sampled.rollout.texts == ["a1.0", "a1.1", "b0.0", "b0.1"]
    assert sampled.rollout.group_index.tolist() == [0, 0, 1, 1]
    assert [r.score for r in sampled.results] == [0.0, 1.0, 1.0, 0.0]
    # next step: the buffered group plus one from a new round; the all-zero group is dropped
    sampled, metrics = fill(sampler, _round([[0.0, 0.0], [1.0, 0.5]], "c"))
    assert [p.prompt for p in sampled.prompts] == ["b1", "c1"]
    assert metrics == {
        "sampling/rounds": 1,
        "sampling/groups_generated": 2,
        "sampling/groups_kept": 1,
        "sampling/buffer_groups": 0,
    }


def test_failed_scores_are_left_out_of_the_comparison():
    sampler = DynamicSampler(need=1, max_rounds=1, pad_id=0)
    # [1, fail, 1]: the scored ones agree (a failure's 0 must not make it "mixed");
    # [fail, fail, 0]: one scored member, no comparison; [0, fail, 1]: mixed
    r = _round([[1.0, None, 1.0], [None, None, 0.0], [0.0, None, 1.0]], "a")
    sampled, metrics = fill(sampler, r)
    assert [p.prompt for p in sampled.prompts] == ["a2"]
    assert metrics["sampling/groups_kept"] == 1
    assert [x.status for x in sampled.results] == ["ok", "error", "ok"]  # failed rows travel with their group


def test_too_many_rounds_is_an_error_naming_the_key_and_counts():
    sampler = DynamicSampler(need=2, max_rounds=2, pad_id=0)
    same = [[1.0, 1.0], [0.0, 0.0]]
    with pytest.raises(
        GlassrlError,
        match=r"algo.dynamic_sampling_max_rounds = 2: after 2 rounds \(4 groups "
        r"generated, 1 with mixed scores kept\) the step holds 1 of "
        r"batch.prompts_per_step = 2",
    ):
        fill(sampler, _round(same, "a"), _round([[0.0, 1.0], [1.0, 1.0]], "b"))


def test_the_buffer_round_trips_through_a_checkpoint(tmp_path):
    sampler = DynamicSampler(need=1, max_rounds=1, pad_id=0)
    fill(sampler, _round([[0.0, 1.0], [1.0, 0.0], [1.0, 0.5]], "a"))
    assert len(sampler.buffer) == 2
    ((name, (kind, value)),) = sampler.state_dict().items()
    assert (name, kind) == ("sample_buffer", "torch")
    manager = CheckpointManager(tmp_path, keep=1)
    loaded = manager.load(manager.save(1, {name: Part(kind, value)}), {name})
    other = DynamicSampler(need=2, max_rounds=1, pad_id=0)
    other.load_state_dict(loaded)
    one, _ = fill(sampler)  # need 1 from the buffer: no round
    sampler.need = 1
    two, _ = fill(other)  # need 2 from the restored buffer
    assert [p.prompt for p in two.prompts] == ["a1", "a2"]
    assert [p.prompt for p in one.prompts] == ["a1"]
    assert two.prompts[0] == one.prompts[0]
    assert two.results[:2] == one.results  # nested source results restored as RewardResults
    assert torch.equal(two.rollout.response_ids[:2], one.rollout.response_ids)


# ---------------------------------------------------------------- in the trainer


def _trainer(overrides, **kwargs):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / "dapo.yaml", overrides), progress=False, **kwargs)


def test_every_trained_group_is_mixed_and_the_counters_add_up(fast, tmp_path, monkeypatch):
    trained: list[Sampled] = []
    take = DynamicSampler.take
    monkeypatch.setattr(DynamicSampler, "take", lambda self: (out := take(self), trained.append(out[0]))[0])
    common = [*fast, MIXED_REWARD, "steps=3", "algo.dynamic_sampling_max_rounds=8", "logging.ledger_every=0"]
    _trainer(common).train()
    rows = logged_metrics(tmp_path / "run")[1:]
    assert len(trained) == len(rows) == 3
    buffered = 0
    for sampled, row in zip(trained, rows):
        assert len(sampled.prompts) == 4 and len(sampled.results) == 16  # the step is full
        scores = torch.tensor([r.score for r in sampled.results]).reshape(4, 4)  # (groups, G), all scored here
        assert (scores.amax(-1) > scores.amin(-1)).all()  # raw scores, before the overlong penalty
        assert row["sampling/groups_generated"] == 4 * row["sampling/rounds"]
        assert buffered + row["sampling/groups_kept"] == 4 + row["sampling/buffer_groups"]
        buffered = row["sampling/buffer_groups"]
    assert sum(r["sampling/groups_generated"] for r in rows) > 12  # it did over-sample


@pytest.mark.slow
def test_resume_with_a_non_empty_buffer_is_bit_identical(fast, tmp_path):
    common = [
        *fast,
        MIXED_REWARD,
        "steps=4",
        "algo.dynamic_sampling_max_rounds=8",
        "logging.checkpoint_every=1",
        "logging.keep_checkpoints=1",
        "logging.ledger_every=0",
    ]
    straight = _trainer([*common, f"output_dir={tmp_path / 'straight'}"])
    straight.train()
    rows = logged_metrics(tmp_path / "straight")
    # the first checkpoint whose buffer holds groups: resume from it
    resumed_at = next(r["step"] for r in rows[1:-1] if r["sampling/buffer_groups"] > 0)

    run = [*common, f"output_dir={tmp_path / 'resumed'}"]
    victim = _trainer(run)
    victim.sinks.sinks.append(KillAt(resumed_at + 1))
    with pytest.raises(Killed):
        victim.train()
    again = _trainer(run, resume=True)
    assert again.counters.step == resumed_at
    assert len(again.sampler.buffer) == rows[resumed_at]["sampling/buffer_groups"] > 0
    again.train()
    assert_same_weights(straight.workers.actor.model, again.workers.actor.model)
    assert rows == logged_metrics(tmp_path / "resumed")


def test_a_missing_buffer_part_is_an_error(fast, tmp_path):
    run = [*fast, MIXED_REWARD, "steps=1", "algo.dynamic_sampling_max_rounds=8"]
    _trainer(run).train()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000001"
    remove_checkpoint_part(checkpoint, "sample_buffer")
    with pytest.raises(GlassrlError, match=r"checkpoint step_00000001 has no part 'sample_buffer'"):
        _trainer(run, resume=True)
