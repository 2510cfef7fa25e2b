"""Sampling one step ahead (``rollout.overlap``): the next step's batch is generated while this one trains.

One-step off-policy, as verl's one-step-off-policy trainer and AReaL do: at the start of step
s (before its update) the worker copies the actor's weights θ_s into a copy of the policy and,
in a thread, samples the prompts of step s+1 with that copy and computes their log-probs and
entropy with it; step s's update meanwhile changes the actor to θ_{s+1}. Step s+1 then trains
on responses sampled by π_{θ_s}: its π_old is the policy that sampled (Schulman et al. 2017,
PPO: the ratio π_θ/π_old is an importance weight from the behaviour policy), so the ratio and
the KL of step s+1 use the copy's log-probs, not a fresh pass of π_{θ_{s+1}} — the importance
correction of one step of staleness. (AReaL's decoupled objective adds a proximal policy on top;
here the behaviour policy is the proximal one, as in plain PPO.)

The copy costs one more set of weights (no optimiser state). Everything else is shared with
the synchronous path: the same sampling generator, drawn in the same order (never by two
threads at once: the trainer samples ahead only when nothing else samples before the next
step), and ``generate`` samples now, with the actor's own model (evaluation, a step after a
checkpoint). See glassrl.workers.base for the protocols.

On a GPU both threads would queue their kernels on the device's default stream; the overlap
there is not measured (BENCHMARKS.md, "rollout.overlap").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

from glassrl.data.records import PromptRecord
from glassrl.models.precision import compute_precision
from glassrl.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from glassrl.workers.local import FrozenActor, LocalRollout, Passes


class OverlapRollout:
    """A RolloutWorker that can also sample the next batch ahead with a copy of the actor's policy.

    live: the in-process rollout worker (the actor's model, the run's sampling generator).
    model: the actor's model, whose weights :meth:`start_ahead` copies.
    make_engine(model) -> RolloutEngine: the run's engine, built on another model.
    """

    part_names = ("rollout_rng",)

    def __init__(
        self,
        live: LocalRollout,
        model: nn.Module,
        make_engine: Callable[[nn.Module], RolloutEngine],
        passes: Passes,
    ) -> None:
        self.live, self.model = live, model
        self.copy = copy.deepcopy(model).eval().requires_grad_(False)
        self.engine = make_engine(self.copy)
        self.scorer = FrozenActor(self.copy, passes)
        self.compute = passes.compute
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glassrl-sample-ahead")
        self.pending: Future | None = None

    def generate(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> RolloutBatch:
        """Sample now, with the actor's own model (the synchronous path)."""
        return self.live.generate(prompts, n=n, params=params, records=records)

    def start_ahead(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> None:
        """Copy the actor's weights now, then sample ``prompts`` with the copy in the background."""
        if self.pending is not None:
            raise RuntimeError("OverlapRollout: a batch sampled ahead was never taken")
        with torch.no_grad():
            for mine, theirs in zip(self.copy.state_dict().values(), self.model.state_dict().values(), strict=True):
                mine.copy_(theirs)
        self.pending = self.pool.submit(self._sample, prompts, n, params, records)

    def take_ahead(self) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor]:
        """The batch sampled ahead (waiting for it), with its log π_old(a_i|s_i) and H(π_old(·|s_i)),
        both (B, T), computed by the policy that sampled it."""
        if self.pending is None:
            raise RuntimeError("OverlapRollout: no batch was sampled ahead")
        pending, self.pending = self.pending, None
        return pending.result()

    def _sample(self, prompts, n, params, records) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor]:
        # Grad mode and autocast are per thread: set here, in the sampling thread.
        with torch.no_grad(), compute_precision(self.live.generator.device, self.compute):
            batch = self.engine.generate(prompts, n=n, params=params, generator=self.live.generator, records=records)
        inputs = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "response_mask": batch.response_mask,
        }
        logprobs, entropy = self.scorer.compute_logprobs(inputs)
        return batch, logprobs, entropy

    def close(self) -> None:
        """Wait for a batch still being sampled, and stop the thread (idempotent)."""
        self.pool.shutdown(wait=True)
        self.pending = None

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return self.live.state_dict()

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.live.load_state_dict(parts)
