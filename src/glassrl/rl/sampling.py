"""Phase 1 of a step in rounds: the step takes one round, or (DAPO) rounds until it is full.

Shapes: B responses, G = rollout.n responses per group (one group per prompt), P prompt
width, T response width.

A *round* generates ``batch.prompts_per_step`` groups and gets their reward results
(``Trainer.step``, glassrl.rl.loop). The step fills a sampler in a loop:

    while sampler.needs_more():
        sampler.add(<one round>)
    sampled, metrics = sampler.take()

:class:`OneRound` holds one round as the step. :class:`DynamicSampler` is DAPO's dynamic
sampling (Yu et al. 2025, DAPO, eq. 11 constraint 0 < |{o_i : is_equivalent(a, o_i)}| < G,
and Algorithm 1): of each round it keeps only the groups whose scores are not all equal
(glassrl.algos.shaping.dynamic_sampling_keep), in a buffer, until the buffer holds
``prompts_per_step`` groups. Groups kept beyond what the step needs wait in the buffer for
the next step, so the buffer is checkpointed (part ``sample_buffer``): every field of each
group's rollout (tensors, turns of a multi-turn rollout), its prompt record (metadata as the
data file gave it: a Parquet timestamp, a date) and its reward results (details of any
JSON-able kind, plus sets, dates, non-finite floats), encoded by glassrl.run.codec so
that they read back as they were.

Every round comes through :class:`AsyncRounds`, the bounded buffer between the rollout worker and
the step: at ``rollout.max_staleness`` = 0 it samples each round when the step asks for it; at
k ≥ 1 (asynchronous training: Ray's rollout ranks, or, at k = 1, the local backend's copy of the
policy in a thread, glassrl.workers.overlap) it requests rounds ahead.

The filter reads the combined reward's score before any shaping — the paper's
accuracy, not the overlong penalty — over the group's scored members only: failed
responses are left out of the comparison as out of every group baseline
(glassrl.rl.phases), and a group with fewer than 2 scored members is dropped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from glassrl.algos.shaping import dynamic_sampling_keep
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards.base import RewardResult
from glassrl.rl.phases import Sampled, outcome_scores
from glassrl.rollout.base import RolloutBatch, SamplingParams, Turn, concat_rollouts
from glassrl.workers.base import AsyncRolloutWorker, RolloutWorker
from glassrl.workers.sync_truth import SyncLog, Verdict


class OneRound:
    """The step is one round, whatever its scores."""

    part_names: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.round: Sampled | None = None

    def needs_more(self) -> bool:
        return self.round is None

    def add(self, sampled: Sampled) -> None:
        self.round = sampled

    def take(self) -> tuple[Sampled, dict[str, float]]:
        sampled, self.round = self.round, None
        return sampled, {}

    def expire(self, oldest: int | None) -> None:
        """Nothing is kept from one step to the next."""


@dataclass
class _Group:
    rollout: RolloutBatch  # (G rows), group_index all 0
    prompt: PromptRecord
    prompt_ids: list[int]
    results: list[RewardResult]


class DynamicSampler:
    """A buffer of groups with mixed scores; the step adds rounds until it holds ``need``
    groups, at most ``max_rounds`` rounds per step."""

    part_names = ("sample_buffer",)
    data_parts = part_names  # prompts' metadata and reward details: data, which may hold NaN (glassrl.run.validate)

    def __init__(self, need: int, max_rounds: int, pad_id: int) -> None:
        self.need, self.max_rounds, self.pad_id = need, max_rounds, pad_id
        self.buffer: list[_Group] = []
        self.rounds = self.generated = self.kept = self.expired = 0  # this step's counts (sampling/…)

    def needs_more(self) -> bool:
        return len(self.buffer) < self.need

    def add(self, sampled: Sampled) -> None:
        """Buffer the round's groups with mixed scores; an error when ``max_rounds`` rounds
        leave the step short."""
        groups = split_groups(sampled)
        mixed = mixed_groups(sampled)
        self.buffer += [g for g, keep in zip(groups, mixed) if keep]
        self.rounds, self.generated, self.kept = self.rounds + 1, self.generated + len(groups), self.kept + sum(mixed)
        if self.needs_more() and self.rounds == self.max_rounds:
            raise GlassrlError(
                f"algo.dynamic_sampling_max_rounds = {self.max_rounds}: after {self.rounds} rounds "
                f"({self.generated} groups generated, {self.kept} with mixed scores kept) the step holds "
                f"{len(self.buffer)} of batch.prompts_per_step = {self.need} groups; raise the limit, "
                "or use prompts the policy sometimes solves"
            )

    def take(self) -> tuple[Sampled, dict[str, float]]:
        """The step's ``need`` groups (oldest first) and the sampling/… metrics (docs/metrics.md)."""
        step, self.buffer = self.buffer[: self.need], self.buffer[self.need :]
        metrics = {
            "sampling/rounds": self.rounds,
            "sampling/groups_generated": self.generated,
            "sampling/groups_kept": self.kept,
            "sampling/buffer_groups": len(self.buffer),
        }
        if self.expired:
            metrics["sampling/groups_expired"] = self.expired
        self.rounds = self.generated = self.kept = self.expired = 0
        return join_groups(step, self.pad_id), metrics

    def expire(self, oldest: int | None) -> None:
        """Drop the buffered groups that a version older than ``oldest`` sampled (asynchronous training:
        a group kept for a later step must not lag more than rollout.max_staleness; None: no bound);
        counted in sampling/groups_expired."""
        if oldest is None:
            return
        fresh = [g for g in self.buffer if _oldest_version(g.rollout) >= oldest]
        self.expired += len(self.buffer) - len(fresh)
        self.buffer = fresh

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        groups = [
            {
                "rollout": _rollout_state(g.rollout),
                "prompt": _record_state(g.prompt),
                "prompt_ids": g.prompt_ids,
                "results": [_result_state(r) for r in g.results],
            }
            for g in self.buffer
        ]
        return {"sample_buffer": ("torch", {"groups": groups})}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.buffer = [
            _Group(
                _rollout(g["rollout"]),
                _record(g["prompt"]),
                list(g["prompt_ids"]),
                [_result(r) for r in g["results"]],
            )
            for g in parts["sample_buffer"]["groups"]
        ]


def _oldest_version(rollout: RolloutBatch) -> int:
    """The oldest version that sampled a generated token of ``rollout`` (none recorded: no limit)."""
    versions = rollout.policy_versions
    if versions is None or not bool(rollout.response_mask.any()):
        return 1 << 62
    return int(versions[rollout.response_mask].min())


@dataclass
class Round:
    """A round requested: its prompts, and the rollout worker's handle until its samples are in."""

    prompts: list[PromptRecord]
    prompt_ids: list[list[int]]
    pending: Any = None  # AsyncRolloutWorker.submit's handle; None once ``rollout`` is in
    rollout: RolloutBatch | None = None
    seconds: dict[str, float] | None = None  # the rollout worker's perf/… of the round
    verdicts: list[Verdict] = field(default_factory=list)  # the sync truth checks of the weights that sampled it


class AsyncRounds:
    """The bounded buffer between the rollout worker and the step: rounds requested, taken oldest first.

    The bound (rollout.max_staleness = k): before a step takes a round, rounds are requested until
    k + 1 are waiting (requested, not yet taken), each sampled with the weights of the version current
    when it was requested (or newer: partial rollouts). A step takes at least one round, so a round
    requested behind j ≤ k others is taken within the next j + 1 steps, while the actor updates at
    most once per step: no token it holds lags the update that trains on it by more than k versions
    (a group that dynamic sampling keeps for a later step is dropped when it would: DynamicSampler.expire).
    At k = 0 this is the synchronous step: one round requested, then taken; with a plain
    RolloutWorker (no ``submit``) it is sampled then and there.

    A worker that ``shares_generator`` (the local backend's, glassrl.workers.overlap: its thread draws
    from the generator that evaluation draws from) is asked for nothing ahead during a ``quiet`` step
    (one that evaluates, checkpoints or ends the run): the next step then samples its first round itself.

    Checkpoint part "rollout_buffer" (k ≥ 1): the rounds not yet taken, their samples waited for
    first (a checkpoint holds nothing in flight), and the version of the weights. The prompt stream's
    position is after them, so a resumed run takes them, then requests what the uninterrupted run
    would have: no round is lost or taken twice, and with the deterministic schedule it samples the
    same tokens.

    The sync truth checks of the weights that sampled a round (``log``: glassrl.workers.sync_truth) go
    into the log when a step takes the round, never when a checkpoint waits for it: they are saved
    with the round, so that a resumed run counts them (``sync/…``) in the step the straight run does.
    """

    def __init__(
        self, rollout: RolloutWorker | AsyncRolloutWorker, max_staleness: int, pad_id: int, log: SyncLog | None = None
    ) -> None:
        self.rollout, self.max_staleness, self.pad_id, self.log = rollout, max_staleness, pad_id, log
        self.ahead = hasattr(rollout, "submit")  # an AsyncRolloutWorker (submit / result / publish / version)
        self.part_names = ("rollout_buffer",) if self.ahead and max_staleness else ()
        self.data_parts = self.part_names  # sampled rounds: data, NaN allowed (glassrl.run.validate)
        self.rounds: deque[Round] = deque()

    @property
    def version(self) -> int | None:
        """The actor updates the weights hold now (None: a worker without versions)."""
        return self.rollout.version if self.ahead else None

    def oldest(self) -> int | None:
        """The oldest version a token may be sampled by and still train now (None: no bound)."""
        return None if self.version is None or not self.max_staleness else self.version - self.max_staleness

    def fill(
        self,
        next_prompts: Callable[[], tuple[list[PromptRecord], list[list[int]]]],
        n: int,
        params: SamplingParams,
        quiet: bool = False,
    ) -> None:
        """Request rounds until ``max_staleness`` + 1 wait (1 in a ``quiet`` step, when the worker shares
        the generator); ``next_prompts()``: the next round's records and token ids (the prompt stream)."""
        depth = 1 if quiet and getattr(self.rollout, "shares_generator", False) else self.max_staleness + 1
        while len(self.rounds) < depth:
            prompts, prompt_ids = next_prompts()
            if self.ahead:
                pending = self.rollout.submit(prompt_ids, n=n, params=params, records=prompts)
                self.rounds.append(Round(prompts, prompt_ids, pending))
            else:  # sampled now (multi-turn: each episode's environment is reset with its record)
                rollout = self.rollout.generate(prompt_ids, n=n, params=params, records=prompts)
                self.rounds.append(Round(prompts, prompt_ids, None, rollout, {}))

    def take(self) -> tuple[Round, dict[str, float]]:
        """The oldest round, its samples in (waited for), and (asynchronous training) the worker's
        seconds with perf/batch_wait_s."""
        start = time.perf_counter()
        first = self._done(self.rounds.popleft())
        if self.log is not None:
            self.log.add(first.verdicts)
        if not self.ahead:
            return first, {}
        return first, {**first.seconds, "perf/batch_wait_s": time.perf_counter() - start}

    def check(self, staleness: torch.Tensor | None, step: int) -> None:
        """The bound held: no token of the step lags more than max_staleness versions (B, T)."""
        if staleness is not None and int(staleness.max()) > self.max_staleness:
            raise RuntimeError(f"step {step}: a token lags {int(staleness.max())} > {self.max_staleness} versions")

    def _done(self, round_: Round) -> Round:
        if round_.pending is not None:
            round_.rollout, round_.seconds, round_.verdicts = self.rollout.result(round_.pending)
            round_.pending = None
        return round_

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        if not self.part_names:
            return {}
        rounds = [self._done(r) for r in self.rounds]
        state = {
            "version": self.rollout.version,
            "rounds": [
                {
                    "rollout": _rollout_state(r.rollout),
                    "prompts": [_record_state(p) for p in r.prompts],
                    "prompt_ids": r.prompt_ids,
                    "verdicts": [asdict(v) for v in r.verdicts],
                }
                for r in rounds
            ],
        }
        return {"rollout_buffer": ("torch", state)}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        if not self.part_names:
            return
        state = parts["rollout_buffer"]
        self.rounds = deque(
            Round(
                [_record(p) for p in r["prompts"]],
                [list(ids) for ids in r["prompt_ids"]],
                None,
                _rollout(r["rollout"]),
                {},
                [Verdict(**v) for v in r.get("verdicts", [])],  # none in a checkpoint from before they were saved
            )
            for r in state["rounds"]
        )
        self.rollout.publish(int(state["version"]))  # the restored actor's weights, as their version


def mixed_groups(sampled: Sampled) -> list[bool]:
    """Per group: its scored responses' scores are not all equal (DAPO eq. 11 constraint)."""
    scores, scored = outcome_scores(sampled.results, torch.device("cpu"))
    group_index = sampled.rollout.group_index.cpu()
    keep = dynamic_sampling_keep(scores[scored], group_index[scored])  # (scored rows,)
    kept = set(group_index[scored][keep].tolist())
    return [g in kept for g in range(len(sampled.prompts))]


def split_groups(sampled: Sampled) -> list[_Group]:
    """One _Group per prompt, its rows in order."""
    groups = []
    for g, (prompt, ids) in enumerate(zip(sampled.prompts, sampled.prompt_ids)):
        rows = (sampled.rollout.group_index == g).nonzero().flatten()  # (G,)
        part = sampled.rollout.select(rows)
        part.group_index = torch.zeros_like(part.group_index)
        groups.append(_Group(part, prompt, ids, [sampled.results[i] for i in rows.tolist()]))
    return groups


def join_groups(groups: list[_Group], pad_id: int) -> Sampled:
    """The groups as one batch, group k's rows with group_index k (re-padded to common widths)."""
    parts = []
    for k, g in enumerate(groups):
        part = g.rollout.select(torch.arange(len(g.rollout)))
        part.group_index = torch.full_like(part.group_index, k)
        parts.append(part)
    return Sampled(
        concat_rollouts(parts, pad_id),
        [g.prompt for g in groups],
        [g.prompt_ids for g in groups],
        [r for g in groups for r in g.results],
    )


# The buffer as plain data for a "torch" checkpoint part (glassrl.run.codec): tensors,
# containers and scalars; dataclasses become dicts of their fields here and back below.


def _rollout_state(r: RolloutBatch) -> dict[str, Any]:
    state = {f.name: getattr(r, f.name) for f in fields(RolloutBatch)}
    if r.turns is not None:
        state["turns"] = [[{f.name: getattr(t, f.name) for f in fields(Turn)} for t in turns] for turns in r.turns]
    return state


def _rollout(state: dict[str, Any]) -> RolloutBatch:
    turns = state["turns"]
    if turns is not None:
        turns = [tuple(Turn(**t) for t in response) for response in turns]
    return RolloutBatch(**{**state, "turns": turns})


def _record_state(r: PromptRecord) -> dict[str, Any]:
    return {"prompt": r.prompt, "answer": r.answer, "metadata": r.metadata, "source": r.source}


def _record(state: dict[str, Any]) -> PromptRecord:
    return PromptRecord(state["prompt"], state["answer"], state["metadata"], state["source"])


def _result_state(r: RewardResult) -> dict[str, Any]:
    return {
        "status": r.status,
        "score": r.score,
        "process_rewards": r.process_rewards,
        "message": r.message,
        "details": _encode(r.details),
    }


def _result(state: dict[str, Any]) -> RewardResult:
    return RewardResult(
        state["status"], state["score"], state["process_rewards"], state["message"], _decode(state["details"])
    )


def _encode(value: Any) -> Any:
    """details may nest RewardResults (a combined reward's sources)."""
    if isinstance(value, RewardResult):
        return {"__reward_result__": _result_state(value)}
    if type(value) is dict:
        return {k: _encode(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_encode(v) for v in value)
    return value


def _decode(value: Any) -> Any:
    if type(value) is dict:
        if set(value) == {"__reward_result__"}:
            return _result(value["__reward_result__"])
        return {k: _decode(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_decode(v) for v in value)
    return value
