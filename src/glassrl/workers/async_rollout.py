"""A rollout rank of asynchronous training (``rollout.max_staleness`` ≥ 1, docs/scale-out.md): it keeps
sampling while the actor trains, so the weights it samples with change under it.

A rollout rank placed apart holds a copy of π_θ (glassrl.rl.build_ray.rollout_rank). In synchronous
training the weight sync writes into that copy between batches. Here the actor finishes an update
while the rank is sampling, and its batches were requested at different versions (a version: the
actor updates the weights hold). So:

- a thread of the rank receives every sync (glassrl.workers.weight_sync: the version, then the
  buckets) into a staging copy of the trained weights (:class:`StagedWeights`), never into the model
  that samples (:class:`BackgroundReceiver`);
- each batch names a version (the actor updates when the trainer asked for it: the batch may lag
  the update that trains on it by at most ``rollout.max_staleness`` of them, glassrl.rl.sampling).
  With ``rollout.partial_rollouts: false`` the rank samples the whole batch with exactly that
  version (waiting for it when it has not arrived): which weights sample a batch then depends on
  the schedule alone, never on timing, so a run and its resume are bit-identical. With
  ``partial_rollouts`` the rank takes the newest weights it holds (at least the batch's version),
  and newer ones between two tokens of a response as they arrive (:meth:`StagedWeights.refresh`,
  called by the decoding loop before every forward pass): a response in progress continues with
  them, each token recording the version that sampled it (slime's ``--partial-rollout``; PipelineRL's
  in-flight weight updates, which keep the cache the older weights wrote). Which tokens get which
  version then depends on timing: such a run is not reproducible, and its resume is not the run.

The sync truth check (``check.sync``, glassrl.workers.sync_truth): what the sender sent for it travels
with each staged version, and the rank checks its model each time it loads one (:meth:`StagedWeights._load`):
the weights it samples with, proven; the verdicts go back with the batch.

Memory: the staged copies of the trained weights (under LoRA, the adapters) received and not yet
used: at most ``max_staleness`` of them (a batch lags at most that many versions); with partial
rollouts one, the newest (an older one is never used again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rollout.base import RolloutBatch, SamplingParams
from glassrl.workers.local import LocalRollout
from glassrl.workers.sync_truth import Checker, Verdict
from glassrl.workers.weight_sync import WeightReceiver, copy_into, trained_parameters

Slot = dict[str, torch.Tensor]  # a staging copy of the trained weights, by parameter name


class StagedWeights:
    """The versions of π_θ a rollout rank has received and not yet sampled with, and the one it
    samples with (``version``; −1 before the first). The receiving thread stages (:meth:`begin`,
    :meth:`load_weights`, :meth:`publish`); the sampling thread loads (:meth:`use`,
    :meth:`refresh`). A PolicyVersions (glassrl.rollout.base) for the engine."""

    def __init__(
        self, model: nn.Module, newest_only: bool, timeout_s: float = 600.0, checker: Checker | None = None
    ) -> None:
        self.params = dict(trained_parameters(model))
        self.checker = checker
        self.sent: dict[int, tuple] = {}  # version -> what its sender sent for the check (WeightReceiver.sent)
        self.verdicts: list[Verdict] = []  # the checks of the versions loaded, until taken
        self.newest_only, self.timeout_s = newest_only, timeout_s
        self.version = -1
        self.staged: dict[int, Slot] = {}
        self.spare: list[Slot] = []  # slots already used, written again by a later sync
        self.receiving: Slot | None = None
        self.error: BaseException | None = None
        self.cond = threading.Condition()

    # ---------------------------------------------------------------- the receiving thread

    def begin(self) -> None:
        """A sync is arriving: a slot to receive it into."""
        with self.cond:
            slot = self.spare.pop() if self.spare else None
        self.receiving = slot or {name: torch.empty_like(p) for name, p in self.params.items()}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """A bucket of the sync arriving (glassrl.workers.weight_sync.LoadWeights): copied into the slot."""
        copy_into(self.receiving, weights)

    def publish(self, version: int, sent: tuple | None = None) -> None:
        """The slot received holds ``version`` (``sent``: its check's data); with ``newest_only`` an older
        staged one is dropped."""
        with self.cond:
            if self.newest_only:
                self.spare += self.staged.values()
                self.staged.clear()
                self.sent.clear()
            self.staged[version] = self.receiving
            if sent is not None:
                self.sent[version] = sent
            self.receiving = None
            self.cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The receiving thread stopped: whoever waits for weights hears why."""
        with self.cond:
            self.error = error
            self.cond.notify_all()

    # ---------------------------------------------------------------- the sampling thread

    def use(self, version: int) -> float:
        """Sample with ``version`` from now on (newest_only: the newest staged, at least ``version``),
        waiting for it to arrive; returns the seconds waited."""
        start = time.perf_counter()
        with self.cond:
            if not self.cond.wait_for(lambda: self.error is not None or self._has(version), self.timeout_s):
                raise GlassrlError(
                    f"rollout rank: the weights of version {version} did not arrive within {self.timeout_s:g} s"
                )
            if self.error is not None:
                raise GlassrlError(f"rollout rank: receiving weights failed: {self.error!r}")
            newest = max(self.staged, default=self.version)
            self._load(newest if self.newest_only else version)
        return time.perf_counter() - start

    def refresh(self) -> int:
        """glassrl.rollout.base.PolicyVersions: with newest_only, load the newest weights staged (a
        response in progress continues with them); the version the next forward pass runs with."""
        if self.newest_only and self.staged:
            with self.cond:
                if self.staged:
                    self._load(max(self.staged))
        return self.version

    def _has(self, version: int) -> bool:
        if self.newest_only:
            return max(self.staged, default=self.version) >= version
        if version < self.version:
            raise RuntimeError(f"StagedWeights.use({version}) after version {self.version}: requests go forward")
        return version == self.version or version in self.staged

    def take_verdicts(self) -> list[Verdict]:
        """The checks of the versions loaded since the last call."""
        with self.cond:
            verdicts, self.verdicts = self.verdicts, []
        return verdicts

    @torch.no_grad()
    def _load(self, version: int) -> None:
        """Copy the staged ``version`` into the model, and check it there; it and every older staged slot
        become spare."""
        if version != self.version:
            start = time.perf_counter()
            slot = self.staged[version]
            for name, p in self.params.items():
                p.copy_(slot[name])
            self.version = version
            sent = self.sent.get(version)
            if self.checker is not None and sent is not None:
                self.verdicts.append(self.checker.verdict(version, *sent, start))
        for old in [v for v in self.staged if v <= version]:
            self.spare.append(self.staged.pop(old))
            self.sent.pop(old, None)


class BackgroundReceiver:
    """The rank's side of the weight sync group (glassrl.workers.ray.RayWeightSync), receiving every
    sync in a thread of its own into ``staged``. ``timeout_s``: how long it may wait for the next sync
    (a training step's length; a week by default)."""

    def __init__(self, staged: StagedWeights, timeout_s: float = 7 * 24 * 3600.0) -> None:
        self.staged, self.timeout_s = staged, timeout_s
        self.receiver = WeightReceiver(staged.load_weights)
        self.thread: threading.Thread | None = None

    def join(self, address: str, port: int, rank: int, world_size: int, device: str = "cpu") -> None:
        """Join the sync group (reading its layout), then receive in the background."""
        self.receiver.join(address, port, rank, world_size, device, self.timeout_s)
        self.thread = threading.Thread(target=self._receive, name="glassrl-weights", daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        try:
            while True:
                self.staged.begin()
                version = self.receiver.receive()
                self.staged.publish(version, self.receiver.sent)
        except BaseException as err:  # noqa: BLE001 - handed to the sampling thread, which raises it
            self.staged.fail(err)


class AsyncRolloutRank:
    """Samples each batch with the weights of the version it names (module docstring), from the rank's
    RNG (``rollout``: its engine samples with ``staged`` as its PolicyVersions). Checkpoint part
    "rollout_rng", as glassrl.workers.local.LocalRollout."""

    part_names = ("rollout_rng",)

    def __init__(self, rollout: LocalRollout, staged: StagedWeights) -> None:
        self.rollout, self.staged = rollout, staged
        self.finished: float | None = None  # when the last batch was done

    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        params: SamplingParams,
        records: Sequence[PromptRecord] | None = None,
        version: int,
    ) -> tuple[RolloutBatch, dict[str, float], list[Verdict]]:
        """len(prompts) × n responses sampled with version ``version`` (or newer: partial rollouts), the
        rank's seconds (idle before the batch, nothing queued; waiting for its weights; sampling it) and
        the sync checks of the weights it loaded (glassrl.workers.sync_truth)."""
        start = time.perf_counter()
        idle = 0.0 if self.finished is None else start - self.finished
        waited = self.staged.use(version)
        sampling = time.perf_counter()
        batch = self.rollout.generate(prompts, n=n, params=params, records=records)
        self.finished = time.perf_counter()
        timings = {
            "perf/rollout_idle_s": idle,
            "perf/weights_wait_s": waited,
            "perf/rollout_sample_s": self.finished - sampling,
        }
        return batch, timings, self.staged.take_verdicts()

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return self.rollout.state_dict()

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.rollout.load_state_dict(parts)
