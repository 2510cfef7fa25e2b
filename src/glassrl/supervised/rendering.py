"""How the supervised trainers render text prompts: the one rule of ``glassrl train``
(glassrl.models.chat_rendering: ``chat_template``, ``system_prompt``) for ``sft``, ``rm`` and
``dpo`` alike, so that a reward model scores, and a preference-trained policy learns, prompts in
the form the policy later samples from (docs/data.md, "What the model sees")."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

from glassrl.data.formatting import Prompt, render_text_prompts
from glassrl.models.chat_rendering import applies_template, rendering

R = TypeVar("R")  # a record with .prompt and .source: PreferencePair, LabelledResponse


def render_prompts(
    tokenizer, prompts: Sequence[Prompt], sources: Sequence[str], mode: str, system_prompt: str | None, key: str
) -> list[Prompt]:
    """Text prompts as chat messages when the rule says so, ``system_prompt`` first in each
    (glassrl.data.formatting.render_text_prompts); ``key``: the config key of the prompts' data."""
    return render_text_prompts(
        prompts,
        sources,
        chat=applies_template(tokenizer, mode),
        system_prompt=system_prompt,
        how=rendering(tokenizer, mode, key="chat_template"),
        key=key,
        system_key="system_prompt",
    )


def render_records(tokenizer, records: list[R], mode: str, system_prompt: str | None, key: str) -> list[R]:
    """``records`` (dataclasses with ``prompt`` and ``source``) with their prompts rendered by
    :func:`render_prompts`."""
    prompts = render_prompts(
        tokenizer, [r.prompt for r in records], [r.source for r in records], mode, system_prompt, key
    )
    return [dataclasses.replace(r, prompt=p) for r, p in zip(records, prompts)]


def rendering_row(mode: str) -> tuple[str, str, str]:
    """The start table's row (print_resolved) saying how text prompts are rendered."""
    how = "plain text" if mode == "none" else "the tokenizer's chat template, if any (not the default model's)"
    return ("text prompts", how, f"chat_template = {mode}")
