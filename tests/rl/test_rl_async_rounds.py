"""The bounded buffer of asynchronous training (glassrl.rl.sampling.AsyncRounds) without Ray: a
fake rollout worker that samples each round with the version it was requested at. Over any
schedule of steps (the rounds a step takes, when the actor updates), no token a step takes lags
the actor by more than max_staleness versions, rounds come out in the order requested, each
once; a checkpoint's state brings the rounds back; dynamic sampling's kept groups expire."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rl_sampling import _round

from glassrl.data.records import PromptRecord
from glassrl.rl.sampling import AsyncRounds, DynamicSampler
from glassrl.rollout.base import RolloutBatch, SamplingParams
from glassrl.workers.sync_truth import SyncLog, Verdict

PARAMS = SamplingParams(max_new_tokens=2)


class FakeRollout:
    """An AsyncRolloutWorker: ``version`` is the actor's; a round is sampled with the version
    current when it was submitted (the deterministic schedule)."""

    def __init__(self) -> None:
        self.version = 0
        self.published: list[int] = []

    def submit(self, prompts, *, n, params, records=None):
        return (prompts, self.version)

    def result(self, pending):
        prompts, version = pending
        B = len(prompts) * 1
        batch = RolloutBatch(
            prompt_ids=torch.tensor(prompts),
            prompt_mask=torch.ones((B, 1), dtype=torch.bool),
            response_ids=torch.full((B, 2), 5),
            response_mask=torch.ones((B, 2), dtype=torch.bool),
            group_index=torch.arange(B),
            finish_reasons=["stop"] * B,
            texts=["x"] * B,
            policy_versions=torch.full((B, 2), version),
        )
        return batch, {"perf/rollout_sample_s": 0.0}, [Verdict("fake", version, 1)]

    def publish(self, version: int) -> None:
        self.version = version
        self.published.append(version)


def _stream():
    counter = iter(range(10**6))

    def next_prompts():
        i = next(counter)
        return [PromptRecord(f"p{i}", None, {}, "test")], [[i]]

    return next_prompts


@settings(max_examples=60, deadline=None)
@given(k=st.integers(0, 3), schedule=st.lists(st.tuples(st.integers(1, 2), st.booleans()), min_size=1, max_size=12))
def test_no_round_lags_more_than_k_and_each_comes_once_in_order(k, schedule):
    rollout, next_prompts = FakeRollout(), _stream()
    rounds = AsyncRounds(rollout, k, pad_id=0)
    taken = []
    for takes, updates in schedule:  # a step: its rounds (dynamic sampling takes several), then an update
        for _ in range(takes):
            rounds.fill(next_prompts, 1, PARAMS)
            assert len(rounds.rounds) == k + 1  # the buffer's bound
            got, seconds = rounds.take()
            lag = rollout.version - int(got.rollout.policy_versions.max())
            assert 0 <= lag <= k  # the bound, whatever the step takes
            taken.append(got.prompt_ids[0][0])
        rollout.version += int(updates)
    assert taken == list(range(len(taken)))  # in order, none lost, none twice


def test_one_round_a_step_lags_exactly_min_k_steps():
    for k in (0, 1, 2):
        rollout, next_prompts = FakeRollout(), _stream()
        rounds = AsyncRounds(rollout, k, pad_id=0)
        lags = []
        for _ in range(5):
            rounds.fill(next_prompts, 1, PARAMS)
            got, _ = rounds.take()
            lags.append(rollout.version - int(got.rollout.policy_versions.max()))
            rollout.version += 1
        assert lags == [min(k, s) for s in range(5)]


def test_the_rounds_in_flight_come_back_from_a_checkpoint():
    rollout, next_prompts = FakeRollout(), _stream()
    rounds = AsyncRounds(rollout, 2, pad_id=0)
    rounds.fill(next_prompts, 1, PARAMS)
    rounds.take()
    rollout.version = 1
    state = rounds.state_dict()
    other_rollout = FakeRollout()
    other = AsyncRounds(other_rollout, 2, pad_id=0)
    other.load_state_dict({name: value for name, (_, value) in state.items()})
    assert other_rollout.published == [1]  # the restored weights sent as their version
    assert [r.prompt_ids for r in other.rounds] == [[[1]], [[2]]] and all(r.pending is None for r in other.rounds)
    got, _ = other.take()
    assert got.prompts[0].prompt == "p1" and got.rollout.policy_versions.max() == 0


def test_a_rounds_sync_checks_count_in_the_step_that_takes_it_also_after_a_checkpoint():
    """A checkpoint waits for the round in flight: its sync truth check is saved with it, not logged
    then (the stopped run's last step is logged already), and a resumed run counts it in the step
    that takes the round, as the straight run does (tests/reliability: rollout.overlap stopped)."""
    rollout, next_prompts, log = FakeRollout(), _stream(), SyncLog()
    rounds = AsyncRounds(rollout, 1, pad_id=0, log=log)
    rounds.fill(next_prompts, 1, PARAMS)
    rounds.take()
    assert [v.version for v in log.verdicts] == [0]
    log.drain()
    rollout.version = 1
    state = rounds.state_dict()  # waits for round 2, requested at version 0
    assert log.verdicts == []
    resumed_log = SyncLog()
    other = AsyncRounds(FakeRollout(), 1, pad_id=0, log=resumed_log)
    other.load_state_dict({name: value for name, (_, value) in state.items()})
    for buffer, buffer_log in ((rounds, log), (other, resumed_log)):  # the straight run's next step, the resumed one's
        buffer.take()
        assert buffer_log.verdicts == [Verdict("fake", 0, 1)]


def test_kept_groups_that_would_lag_too_far_expire():
    sampler = DynamicSampler(need=1, max_rounds=1, pad_id=0)
    old, new = _round([[0.0, 1.0], [1.0, 0.0]], "a"), _round([[0.0, 1.0]], "b")
    old.rollout.policy_versions = torch.full(old.rollout.response_mask.shape, 3)
    new.rollout.policy_versions = torch.full(new.rollout.response_mask.shape, 5)
    sampler.add(old)  # two mixed groups: one trains now, one is kept
    sampler.take()
    sampler.expire(4)  # the kept group, sampled by version 3, would lag too far
    sampler.add(new)
    sampled, metrics = sampler.take()
    assert metrics["sampling/groups_expired"] == 1 and [p.prompt for p in sampled.prompts] == ["b0"]
