"""Role workers: the only things that hold models. The trainer (a single controller,
DESIGN §2) calls these methods and never touches a torch model itself, so an
in-process implementation (local.py) and a Ray one can be swapped without
changing a line of the loop.

Shapes: B responses, P prompt width, T response width. Batches are dicts of
tensors with first dimension B:

    input_ids       (B, P+T) long   left-padded prompt ⊕ right-padded response
    attention_mask  (B, P+T) bool   True on real tokens
    response_mask   (B, T)   bool   True on response tokens that train
    old_logprobs    (B, T)   float  log π_old(a_i|s_i)            (actor update)
    advantages      (B, T)   float  what the policy loss sees     (actor update)
    ref_logprobs    (B, T)   float  log π_ref(a_i|s_i)            (actor update, KL in the loss)
    scores          (B,)     float  outcome scores                (actor update, positive-example NLL)
    is_weights      (B, T)   float  off-policy weight w_i         (actor update, algo.off_policy)
    is_keep         (B, T)   bool   the token stays in the policy loss (actor update, algo.off_policy)
    old_values      (B, T)   float  V(s_i) at rollout             (critic update)
    returns         (B, T)   float  R_i, the critic's target      (critic update)

An update takes a ``plan``: one index tensor per optimiser step (the trainer
shuffles with its own generator, so every worker sees the same mini-batches).

Checkpoints: ``state_dict()`` returns named checkpoint parts, ``(kind, value)``
pairs as :class:`glassrl.run.checkpoint.Part` reads them, and ``load_state_dict`` takes the
loaded values by the same names (a Path for "hf" parts). ``part_names`` lists
them, so that a checkpoint missing one is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from glassrl.data.records import PromptRecord
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rollout.base import RolloutBatch, SamplingParams
from glassrl.run.state import Stateful
from glassrl.workers.sync_truth import Verdict

Batch = dict[str, torch.Tensor]


@runtime_checkable
class ActorForward(Protocol):
    """What phase 3 asks of the policy: an ActorWorker, or a checkpoint's actor that is not trained."""

    def compute_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(log π_θ(a_i|s_i), entropy H(π_θ(·|s_i))), both (B, T), no gradient."""


@runtime_checkable
class CriticForward(Protocol):
    """What phase 3 asks of the critic: a CriticWorker, or a checkpoint's critic that is not trained."""

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """V(s_i) (B, T), read at the position before token i (DESIGN §1)."""


@runtime_checkable
class ActorWorker(ActorForward, Stateful, Protocol):
    """The policy π_θ with its optimiser and learning-rate schedule."""

    def update(self, batch: Batch, plan: list[torch.Tensor]) -> dict[str, float]:
        """One optimiser step per index tensor of ``plan``; returns "actor/…" metrics."""

    def save_pretrained(self, path: str) -> None:
        """The policy (and its tokenizer) in Hugging Face format."""


@runtime_checkable
class OnPolicyActor(Protocol):
    """An actor whose update can stand in for phase 3 when the batch makes one optimiser step."""

    def update_on_policy(
        self, batch: Batch, plan: list[torch.Tensor]
    ) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
        """One optimiser step (``plan`` of one index tensor) on a batch without ``old_logprobs``:
        π_old = π_θ before the step, so log π_old is the update's own forward, detached (the ratio
        is 1; glassrl.rl.update.run_updates). Returns the "actor/…" metrics and that forward's
        log π_θ(a_i|s_i) and H(π_θ(·|s_i)), both (B, T): what compute_logprobs would have returned."""


@runtime_checkable
class ReferenceWorker(Stateful, Protocol):
    """The reference policy π_ref: frozen (no checkpoint parts: it is loaded again from its path), or
    following the actor (:class:`SyncedReference`)."""

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """log π_ref(a_i|s_i) (B, T)."""


@runtime_checkable
class SyncedReference(ReferenceWorker, Protocol):
    """π_ref that moves towards π_θ (algo.kl.ref_sync_every, TR-DPO); its weights are part "reference"."""

    def follow_actor(self) -> None:
        """θ_ref ← α·θ + (1 − α)·θ_ref with the actor's weights of now (α: algo.kl.ref_sync_alpha): in
        one process from the actor's model, on Ray over the weight-sync path (actor rank 0 broadcasts to
        the reference ranks: glassrl.workers.weight_sync.MixSink)."""


@runtime_checkable
class CriticWorker(CriticForward, Stateful, Protocol):
    """The value model V with its optimiser and schedule."""

    def update(self, batch: Batch, plan: list[torch.Tensor]) -> dict[str, float]:
        """One optimiser step per index tensor of ``plan``; returns "critic/…" metrics."""


@runtime_checkable
class RewardWorker(Protocol):
    """Reward sources (glassrl.rewards) behind one call."""

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        """One typed result (ok / timeout / error) per request, in order."""


@runtime_checkable
class RolloutWorker(Stateful, Protocol):
    """Sampling from the current policy; owns the sampling RNG (saved in checkpoints)."""

    def generate(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> RolloutBatch:
        """len(prompts) × n responses (glassrl.rollout.base); ``records``, the prompts' rows, for a
        multi-turn engine (its environments are reset with them)."""


@runtime_checkable
class AsyncRolloutWorker(RolloutWorker, Protocol):
    """A rollout worker that keeps sampling while the actor trains (``rollout.max_staleness`` ≥ 1: the Ray
    ranks, glassrl.workers.ray.RayAsyncRollout; at 1 on the local backend, glassrl.workers.overlap). A
    batch is sent ahead and taken later; it is sampled with the weights of the version current when it
    was sent (or newer, with partial rollouts), and its ``policy_versions`` say which sampled each token."""

    version: int  # the actor updates the weights hold now

    def submit(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, records: Sequence[PromptRecord] | None = None
    ) -> Any:
        """Send len(prompts) × n responses to be sampled; returns a handle for :meth:`result`."""

    def result(self, pending: Any) -> tuple[RolloutBatch, dict[str, float], list[Verdict]]:
        """The batch of ``pending`` (waiting for it), the ranks' "perf/…" seconds, and the sync truth
        checks of the weights that sampled it (glassrl.workers.sync_truth: the caller logs them)."""

    def publish(self, version: int) -> None:
        """The actor's weights, just restored, are ``version``: send them as such."""
