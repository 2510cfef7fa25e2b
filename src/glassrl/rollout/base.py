"""The rollout interface: prompts in, a padded batch of sampled responses out.

Shapes: B responses (prompts × n, the n samples of a prompt adjacent), P prompt
width, T response width. The layout is the project's (glassrl.trainer.common):
``prompt_ids`` (B, P) LEFT-padded, ``response_ids`` (B, T) RIGHT-padded,
``attention_mask`` (B, P+T) over their concatenation.

EOS convention (as verl): the EOS token that ends a response is part of it —
``response_mask`` is True on it, so it gets a log-prob, a reward (the outcome
score sits on it, as the last valid token) and a gradient: the policy learns
when to stop. Tokens after EOS are padding (mask False). A response that hit
``max_new_tokens`` without EOS has finish reason "length", otherwise "stop".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``greedy`` ignores temperature, top_p, top_k (argmax decoding:
    evaluation, ReMax baselines). top_k 0 and top_p 1 are off."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


@dataclass
class RolloutBatch:
    """B sampled responses and their prompts.

    prompt_ids (B, P) long, left-padded; prompt_mask (B, P) bool.
    response_ids (B, T) long, right-padded; response_mask (B, T) bool, True on the
        generated tokens up to and including EOS.
    group_index (B,) long: index of the prompt (in the list given to ``generate``,
        plus any offset the caller adds) that each response answers.
    finish_reasons: B strings, "stop" (ended with EOS) or "length".
    texts: B decoded responses, special tokens (EOS) removed.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    group_index: torch.Tensor
    finish_reasons: list[str]
    texts: list[str]

    @property
    def input_ids(self) -> torch.Tensor:
        """cat(prompt_ids, response_ids) (B, P+T)."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P+T) bool, True on real prompt and response tokens."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def lengths(self) -> torch.Tensor:
        """Response lengths in tokens, EOS included (B,)."""
        return self.response_mask.sum(-1)

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
        )


def concat_rollouts(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One batch of all responses in order; prompts re-padded on the left, responses on the right."""
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = max(b.response_ids.shape[1] for b in batches)

    def left(x: torch.Tensor, width: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, width: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    return RolloutBatch(
        torch.cat([left(b.prompt_ids, P, pad_id) for b in batches]),
        torch.cat([left(b.prompt_mask, P, False) for b in batches]),
        torch.cat([right(b.response_ids, T, pad_id) for b in batches]),
        torch.cat([right(b.response_mask, T, False) for b in batches]),
        torch.cat([b.group_index for b in batches]),
        [r for b in batches for r in b.finish_reasons],
        [t for b in batches for t in b.texts],
    )


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that samples responses: Hugging Face ``generate`` (hf.py), vLLM later.

    ``prompts`` are token ids (already formatted, e.g. by the chat template).
    Each prompt is sampled ``n`` times; the n responses of prompt j are rows
    j·n … j·n+n−1 with group_index j. ``generator`` carries the sampling RNG
    state: the engine draws from it and leaves it advanced, so that a caller
    who saves and restores it reproduces the same samples.
    """

    def generate(
        self, prompts: list[list[int]], *, n: int, params: SamplingParams, generator: torch.Generator
    ) -> RolloutBatch: ...
