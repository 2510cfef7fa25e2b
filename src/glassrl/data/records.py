"""The records every data source produces and every reward source reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# A chat prompt is a tuple of {"role": ..., "content": ...} messages.
Messages = tuple[dict[str, str], ...]


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a dataset.

    prompt:   plain text, or chat messages (rendered later by the tokenizer's chat template)
    answer:   reference answer, if the dataset has one (verifiers compare against it)
    metadata: any other fields of the row, passed through to reward sources untouched
    source:   where it came from, for error messages: "data/train.jsonl:17" or "task:add/train#3"
    """

    prompt: str | Messages
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class PreferencePair:
    """A prompt with a preferred and a dispreferred response (reward-model and DPO training).

    prompt: plain text, or chat messages (rendered by the tokenizer's chat template)
    margin: optional preference strength for the margin loss (Llama 2, §3.2.2)
    """

    prompt: str | Messages
    chosen: str
    rejected: str
    margin: float | None = None
    source: str = ""


@dataclass(frozen=True)
class LabelledResponse:
    """A prompt with one response labelled desirable or undesirable (KTO's unpaired data)."""

    prompt: str | Messages
    response: str
    desirable: bool
    source: str = ""
