"""Sampling ahead on the local backend (``rollout.max_staleness: 1``, or its older name ``rollout.overlap``):
the asynchronous buffer's rollout worker in one process (glassrl.rl.sampling.AsyncRounds, k = 1).

One-step off-policy, as verl's one-step-off-policy trainer and AReaL do: a round requested at the
start of step s (before its update) is sampled with the actor's weights θ_s of that moment, by a
copy of the policy in a thread, which also computes the log-probs and entropy of what it sampled;
step s's update meanwhile changes the actor to θ_{s+1}. Step s+1 then trains on responses sampled
by π_{θ_s}: its π_old is the policy that sampled (Schulman et al. 2017, PPO: the ratio π_θ/π_old
is an importance weight from the behaviour policy), so the ratio and the KL of step s+1 use the
copy's log-probs (``RolloutBatch.behaviour_logprobs``), not a fresh pass of π_{θ_{s+1}} — the
importance correction of one step of staleness. (AReaL's decoupled objective adds a proximal
policy on top; here the behaviour policy is the proximal one, as in plain PPO.)

The interface is the one of the Ray rollout ranks (glassrl.workers.base.AsyncRolloutWorker):
:meth:`submit` takes the actor's weights now (a snapshot: one more set of weights while a round
waits for the thread, no optimiser state) and queues the round; :meth:`result` waits for it;
``version`` counts the actor's updates (glassrl.workers.local.LocalActor), :meth:`publish` sets
it on a resume. The sampling generator is the run's one, shared with ``generate`` (the actor's
own model: evaluation), so ``shares_generator``: the buffer requests nothing ahead across a step
that evaluates, checkpoints or ends the run (AsyncRounds.fill), and nothing else draws from the
generator while the thread does. ``state_dict`` waits for the rounds in flight first, so that
the generator it saves is the one after them (the buffer saves their samples).

The copy is a sampler the weights move to: with ``log`` (the sync truth check, glassrl.workers.sync_truth)
each round checks that the copy holds, bit for bit, the snapshot it was given.

On a GPU both threads would queue their kernels on the device's default stream; the overlap
there is not measured (BENCHMARKS.md, "rollout.overlap").
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

from glassrl.data.records import PromptRecord
from glassrl.models.precision import compute_precision
from glassrl.rollout.base import RolloutBatch, RolloutEngine, SamplingParams, close_engine
from glassrl.workers.local import FrozenActor, LocalActor, LocalRollout, Passes
from glassrl.workers.sync_truth import Checker, SyncLog, Verdict, fingerprints


class OverlapRollout:
    """An AsyncRolloutWorker in one process: rounds sampled by a copy of the actor's policy, in a thread.

    live: the in-process rollout worker (the actor's model, the run's sampling generator).
    actor: the actor, whose weights :meth:`submit` takes and whose updates are the versions.
    make_engine(model) -> RolloutEngine: the run's engine, built on another model.
    """

    part_names = ("rollout_rng",)
    shares_generator = True

    def __init__(
        self,
        live: LocalRollout,
        actor: LocalActor,
        make_engine: Callable[[nn.Module], RolloutEngine],
        passes: Passes,
        log: SyncLog | None = None,
    ) -> None:
        self.live, self.actor, self.log = live, actor, log
        self.copy = copy.deepcopy(actor.model).eval().requires_grad_(False)
        self.engine = make_engine(self.copy)
        self.scorer = FrozenActor(self.copy, passes)
        self.checker = Checker(self.copy, "sampling copy") if log is not None else None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glassrl-sample-ahead")
        self.pending: list[Future] = []

    @property
    def version(self) -> int:
        """The actor updates its weights hold now."""
        return self.actor.version

    def publish(self, version: int) -> None:
        """The actor's weights, just restored, are ``version``."""
        self.actor.version = version

    def generate(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> RolloutBatch:
        """Sample now, with the actor's own model (evaluation)."""
        return self.live.generate(prompts, n=n, params=params, records=records)

    def submit(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> Future:
        """Take the actor's weights now, and queue ``prompts`` to be sampled with them in the thread."""
        with torch.no_grad():
            weights = [t.detach().clone() for t in self.actor.model.state_dict().values()]
        pending = self.pool.submit(self._sample, weights, self.version, prompts, n, params, records)
        self.pending.append(pending)
        return pending

    def result(self, pending: Future) -> tuple[RolloutBatch, dict[str, float], list[Verdict]]:
        """The round of ``pending`` (waiting for it): its ``behaviour_logprobs`` and ``behaviour_entropy``
        computed by the policy that sampled it, its ``policy_versions`` the version it was requested at;
        and the check of the copy's weights (counted in the step that takes the round, whenever the
        thread ran it: glassrl.rl.sampling.AsyncRounds)."""
        batch, verdict = pending.result()
        self.pending.remove(pending)
        return batch, {}, [] if verdict is None else [verdict]

    def _sample(self, weights, version, prompts, n, params, records) -> tuple[RolloutBatch, Verdict | None]:
        start, verdict = time.perf_counter(), None
        with torch.no_grad():
            for mine, theirs in zip(self.copy.state_dict().values(), weights, strict=True):
                mine.copy_(theirs)
        if self.checker is not None:  # the copy against the snapshot it was given
            given = dict(zip(self.copy.state_dict(), weights))
            names = list(self.checker.params)
            sent = fingerprints((name, given[name]) for name in names)
            verdict = self.checker.verdict(version, names, sent, None, start)
        del weights
        # Grad mode and autocast are per thread: set here, in the sampling thread.
        with torch.no_grad(), compute_precision(self.live.generator.device, self.live.compute):
            batch = self.engine.generate(prompts, n=n, params=params, generator=self.live.generator, records=records)
        inputs = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "response_mask": batch.response_mask,
        }
        batch.behaviour_logprobs, batch.behaviour_entropy = self.scorer.compute_logprobs(inputs)
        batch.policy_versions = torch.where(batch.response_mask, version, -1)  # (B, T): these weights sampled
        return batch, verdict

    def close(self) -> None:
        """Wait for a round still being sampled, stop the thread, end the copy's engine's workers (idempotent)."""
        self.pool.shutdown(wait=True)
        self.pending = []
        close_engine(self.engine)
        self.live.close()

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        for pending in self.pending:  # the generator after every round in flight (their samples: the buffer's)
            pending.exception()
        return self.live.state_dict()

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.live.load_state_dict(parts)
