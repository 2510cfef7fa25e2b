"""The rollout interface: prompts in, a padded batch of sampled responses out.

Shapes: B responses (prompts × n, the n samples of a prompt adjacent), P prompt
width, T response width. The layout is the project's (glassrl.optim):
``prompt_ids`` (B, P) LEFT-padded, ``response_ids`` (B, T) RIGHT-padded,
``attention_mask`` (B, P+T) over their concatenation.

EOS convention (as verl): the EOS token that ends a response is part of it —
``response_mask`` is True on it, so it gets a log-prob, a reward (the outcome
score sits on it, as the last valid token) and a gradient: the policy learns
when to stop. Tokens after EOS are padding (mask False). A response that hit
``max_new_tokens`` without EOS has finish reason "length", otherwise "stop".

Multi-turn responses (glassrl.agents) interleave generated tokens with
observation tokens (tool results) that the model did not write. Two masks tell
them apart: ``response_mask`` is True on generated tokens only (they train);
``response_context_mask`` is True on every real response token, generated or
observation, and is what ``attention_mask`` uses, so every recomputed log-prob,
value and reference log-prob sees exactly the tokens that were in the context
when the response was sampled. ``turns`` records where each turn and each
observation lies. For a single-turn response the two masks are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from glassrl.data.records import PromptRecord


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``greedy`` ignores temperature, top_p, top_k, min_p (argmax decoding:
    evaluation, ReMax baselines). top_k 0, top_p 1, min_p 0 and repetition_penalty 1 are off.
    ``repetition_penalty`` (Keskar et al. 2019, CTRL, §4.1: a seen token's logit divided by it
    when positive, multiplied when negative; prompt tokens count) applies when greedy too, as
    in transformers' ``generate``."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    repetition_penalty: float = 1.0
    min_p: float = 0.0


# token_roles values
ROLE_PAD, ROLE_GENERATED, ROLE_OBSERVATION = 0, 1, 2


@dataclass(frozen=True)
class Turn:
    """One turn of a multi-turn response, in response positions (0-based, as ``response_ids``).

    Generated tokens [start, end), then the observation that answered the turn
    [end, observation_end) (empty when none followed: observation_end == end).

    finish_reason: why the turn ended: "tool_call" (it called a tool; an observation
        follows), "continue" (the environment went on without a call), "stop" (final
        answer: EOS, or the environment ended the episode), "length" (the response's
        token budget ran out, in the turn or before its observation fitted),
        "turn_limit" (it called a tool in the last turn allowed; the call was not run),
        "env_error" (the environment failed: it raised, exited, crashed or hung; see ``error``).
    text: the generated text (special tokens kept, the turn's EOS left out).
    observation: the observation text as appended (format markup included).
    tool_calls: one record per call: {"name", "arguments", "status", "seconds"}.
    reward_parts: named rewards the environment gave for this turn.
    error: what became of the environment, with finish reason "env_error"; "" otherwise.
    """

    start: int
    end: int
    observation_end: int
    finish_reason: str
    text: str
    observation: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()
    reward_parts: dict[str, float] = field(default_factory=dict)
    error: str = ""


@dataclass
class RolloutBatch:
    """B sampled responses and their prompts.

    prompt_ids (B, P) long, left-padded; prompt_mask (B, P) bool.
    response_ids (B, T) long, right-padded; response_mask (B, T) bool, True on the
        generated tokens up to and including EOS (the tokens that train).
    group_index (B,) long: index of the prompt (in the list given to ``generate``,
        plus any offset the caller adds) that each response answers.
    finish_reasons: B strings, "stop" (ended with EOS) or "length"; multi-turn: the
        last turn's finish reason (also "turn_limit").
    texts: B decoded responses, special tokens (EOS) removed; multi-turn: the final
        answer (the last turn, when it is not a tool call; else "").
    response_context_mask (B, T) bool: True on every real response token, generated
        or observation; None (the default) means equal to response_mask.
    turns: per response, its turns in order; None for single-turn batches.
    rollout_logprobs (B, T) float32: log π(y_i | s_i) as computed while sampling
        (softmax of logits / temperature), 0 off generated tokens; None unless the
        engine was asked for them.
    policy_versions (B, T) long: the version of the weights that sampled each generated
        token (asynchronous training: the actor updates before those weights), −1 off
        generated tokens; None unless the engine samples with :class:`PolicyVersions`.
    behaviour_logprobs, behaviour_entropy (B, T) float: log π(y_i | s_i) and H(π(·|s_i)) of the
        weights that sampled, recomputed by a forward pass of them (the local backend's sampling
        ahead, glassrl.workers.overlap: the batch's π_old); None when the trainer computes them.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    group_index: torch.Tensor
    finish_reasons: list[str]
    texts: list[str]
    response_context_mask: torch.Tensor | None = None
    turns: list[tuple[Turn, ...]] | None = None
    rollout_logprobs: torch.Tensor | None = None
    policy_versions: torch.Tensor | None = None
    behaviour_logprobs: torch.Tensor | None = None
    behaviour_entropy: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.response_context_mask is None:
            self.response_context_mask = self.response_mask

    @property
    def input_ids(self) -> torch.Tensor:
        """cat(prompt_ids, response_ids) (B, P+T)."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P+T) bool, True on real prompt and response tokens (observations included)."""
        return torch.cat([self.prompt_mask, self.response_context_mask], dim=1)

    @property
    def lengths(self) -> torch.Tensor:
        """Generated tokens per response, EOS included (B,); observations not counted."""
        return self.response_mask.sum(-1)

    @property
    def context_lengths(self) -> torch.Tensor:
        """Real response tokens per response, generated and observation (B,)."""
        return self.response_context_mask.sum(-1)

    @property
    def token_roles(self) -> torch.Tensor:
        """(B, T) int8: ROLE_GENERATED on generated tokens, ROLE_OBSERVATION on observation
        tokens, ROLE_PAD on padding."""
        observation = torch.where(self.response_context_mask, ROLE_OBSERVATION, ROLE_PAD)
        return torch.where(self.response_mask, ROLE_GENERATED, observation).to(torch.int8)

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, index: torch.Tensor) -> RolloutBatch:
        """The responses at ``index`` (K,) long, in that order."""
        rows = index.tolist()
        return RolloutBatch(
            self.prompt_ids[index],
            self.prompt_mask[index],
            self.response_ids[index],
            self.response_mask[index],
            self.group_index[index],
            [self.finish_reasons[i] for i in rows],
            [self.texts[i] for i in rows],
            self.response_context_mask[index],
            None if self.turns is None else [self.turns[i] for i in rows],
            None if self.rollout_logprobs is None else self.rollout_logprobs[index],
            None if self.policy_versions is None else self.policy_versions[index],
            None if self.behaviour_logprobs is None else self.behaviour_logprobs[index],
            None if self.behaviour_entropy is None else self.behaviour_entropy[index],
        )


def masked_token_lists(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's token ids where ``mask`` is True: ids (B, T) long, mask (B, T) bool -> B lists
    (two ``tolist`` calls, not a tensor op per row)."""
    return [[t for t, keep in zip(row, keeps) if keep] for row, keeps in zip(ids.tolist(), mask.tolist())]


def concat_rollouts(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One batch of all responses in order; prompts re-padded on the left, responses on the right."""
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = max(b.response_ids.shape[1] for b in batches)

    def left(x: torch.Tensor, width: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, width: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    multi_turn = {b.turns is not None for b in batches}
    with_logprobs = {b.rollout_logprobs is not None for b in batches}
    with_versions = {b.policy_versions is not None for b in batches}
    with_behaviour = {b.behaviour_logprobs is not None for b in batches}
    if len(multi_turn) > 1 or len(with_logprobs) > 1 or len(with_versions) > 1 or len(with_behaviour) > 1:
        raise ValueError(
            "concat_rollouts: batches differ in turns, rollout_logprobs, policy_versions or behaviour_logprobs "
            "(single- vs multi-turn engines, versioned vs not, sampled ahead vs not)"
        )
    behaviour = with_behaviour == {True}
    return RolloutBatch(
        torch.cat([left(b.prompt_ids, P, pad_id) for b in batches]),
        torch.cat([left(b.prompt_mask, P, False) for b in batches]),
        torch.cat([right(b.response_ids, T, pad_id) for b in batches]),
        torch.cat([right(b.response_mask, T, False) for b in batches]),
        torch.cat([b.group_index for b in batches]),
        [r for b in batches for r in b.finish_reasons],
        [t for b in batches for t in b.texts],
        torch.cat([right(b.response_context_mask, T, False) for b in batches]),
        [t for b in batches for t in b.turns] if multi_turn == {True} else None,
        torch.cat([right(b.rollout_logprobs, T, 0.0) for b in batches]) if with_logprobs == {True} else None,
        torch.cat([right(b.policy_versions, T, -1) for b in batches]) if with_versions == {True} else None,
        torch.cat([right(b.behaviour_logprobs, T, 0.0) for b in batches]) if behaviour else None,
        torch.cat([right(b.behaviour_entropy, T, 0.0) for b in batches]) if behaviour else None,
    )


@runtime_checkable
class PolicyVersions(Protocol):
    """The version of the weights an engine samples with (asynchronous training,
    glassrl.workers.async_rollout.StagedWeights). The engine calls :meth:`refresh` before each forward
    pass of its sampling; it may load newer weights first (a response in progress then continues
    with them: partial rollouts) and returns the version that pass runs with, which the engine
    records on the token it samples from that pass (``RolloutBatch.policy_versions``)."""

    def refresh(self) -> int: ...


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that samples responses: Hugging Face ``generate`` (hf.py), vLLM (vllm.py).

    ``prompts`` are token ids (already formatted, e.g. by the chat template).
    Each prompt is sampled ``n`` times; the n responses of prompt j are rows
    j·n … j·n+n−1 with group_index j. ``generator`` carries the sampling RNG
    state: the engine draws from it and leaves it advanced, so that a caller
    who saves and restores it reproduces the same samples. ``records`` are the prompts' rows
    (PromptRecord, in the order of ``prompts``): a multi-turn engine resets each episode's
    environment with its record; a single-turn engine ignores them. ``path`` says how it samples
    (the decoding loop or ``model.generate``, and why), for the run's start-up lines.
    """

    path: str

    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
        records: Sequence[PromptRecord] | None = None,
    ) -> RolloutBatch: ...


def close_engine(engine: RolloutEngine) -> None:
    """End what ``engine`` holds outside this process (a multi-turn engine's environment workers, the
    endpoint's server); an engine without ``close`` holds nothing. It may sample again afterwards."""
    closer = getattr(engine, "close", None)
    if callable(closer):
        closer()
