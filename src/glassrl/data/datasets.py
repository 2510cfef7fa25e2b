"""Prompt datasets from JSON lines, Parquet, or a Hugging Face ``datasets`` directory.

Formats, chosen by the path:

- ``*.jsonl`` / ``*.json``: one JSON object per line (blank lines skipped);
- ``*.parquet``: read with pyarrow;
- a directory written by ``datasets``' ``save_to_disk``: read with ``load_from_disk``;
  pick a split of a ``DatasetDict`` with ``path::split`` (needed when it has several).

Each row has a prompt — plain text, or chat messages ``[{"role", "content"}, ...]`` —
under ``prompt_key``, an optional reference answer under ``answer_key``, and any
other fields, which go into ``PromptRecord.metadata`` untouched (the reward sources
read them). Of a message only ``role`` and ``content`` are kept.

A malformed row is a :class:`GlassrlError` naming the file and the row: ``path:17``
(1-based line number) for JSON lines, ``path#17`` (0-based row index) for Parquet
and ``datasets`` directories.

With a tokenizer and ``max_prompt_tokens``, prompts longer than that many tokens
(as the policy will see them: chat prompts through the chat template) are dropped,
and the log says how many.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.jsonl import jsonl_objects

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")


def load_prompts(
    path: str | Path,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    tokenizer: Any = None,
    max_prompt_tokens: int | None = None,
) -> list[PromptRecord]:
    """All prompts of the dataset at ``path`` (see the module docstring), over-long ones filtered."""
    if max_prompt_tokens is not None and tokenizer is None:
        raise GlassrlError("max_prompt_tokens needs a tokenizer to count tokens with")
    records = [_record(row, where, prompt_key, answer_key) for row, where in _rows(str(path))]
    if not records:
        raise GlassrlError(f"{path}: no prompts in the dataset")
    if max_prompt_tokens is None:
        return records
    kept = [r for r in records if prompt_token_count(r.prompt, tokenizer) <= max_prompt_tokens]
    if len(kept) < len(records):
        dropped = len(records) - len(kept)
        logger.warning(
            "filtered %d of %d prompts longer than %d tokens (%s)", dropped, len(records), max_prompt_tokens, path
        )
    if not kept:
        raise GlassrlError(f"{path}: all {len(records)} prompts are longer than max_prompt_tokens={max_prompt_tokens}")
    return kept


def prompt_token_count(prompt: str | tuple[dict[str, str], ...], tokenizer: Any) -> int:
    """Tokens of ``prompt`` as the policy sees it: text with the tokenizer's special tokens,
    messages through the chat template with the generation prompt."""
    if isinstance(prompt, str):
        return len(tokenizer(prompt)["input_ids"])
    if not tokenizer.chat_template:
        raise GlassrlError("the prompts are chat messages but the tokenizer has no chat template")
    text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _rows(path: str) -> Iterator[tuple[Any, str]]:
    """(row, where) pairs; ``where`` names the file and row for error messages."""
    path, _, split = path.partition("::")
    p = Path(path)
    if p.is_dir():
        yield from _hf_rows(p, split)
        return
    if split:
        raise GlassrlError(f"{path}: '::{split}' picks a split of a datasets directory; this is a file")
    if not p.is_file():
        raise GlassrlError(f"{path}: no such file or directory")
    if p.suffix in (".jsonl", ".json"):
        yield from jsonl_objects(p)
    elif p.suffix == ".parquet":
        yield from _parquet_rows(p)
    else:
        formats = ".jsonl, .json (JSON lines), .parquet or a datasets directory"
        raise GlassrlError(f"{path}: unknown format {p.suffix!r}; use {formats}")


def _parquet_rows(path: Path) -> Iterator[tuple[Any, str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise GlassrlError(f"{path}: cannot read as Parquet: {err}") from None
    for index, row in enumerate(table.to_pylist()):
        yield row, f"{path}#{index}"


def _hf_rows(path: Path, split: str) -> Iterator[tuple[Any, str]]:
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - datasets raises several types for a bad directory
        raise GlassrlError(f"{path}: not a directory saved by datasets' save_to_disk: {err}") from None
    if isinstance(data, datasets.DatasetDict):
        names = list(data)
        if not split and len(names) == 1:
            split = names[0]
        if split not in data:
            wanted = f"split {split!r} not found" if split else "several splits; pick one with PATH::SPLIT"
            raise GlassrlError(f"{path}: {wanted}; splits: {', '.join(names)}")
        data = data[split]
        where = f"{path}::{split}"
    elif split:
        raise GlassrlError(f"{path}: holds one dataset without splits; drop '::{split}'")
    else:
        where = str(path)
    for index, row in enumerate(data):
        yield row, f"{where}#{index}"


def _record(row: Any, where: str, prompt_key: str, answer_key: str) -> PromptRecord:
    if not isinstance(row, dict):
        raise GlassrlError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if prompt_key not in row:
        raise GlassrlError(f"{where}: missing field {prompt_key!r} (fields: {', '.join(map(str, row)) or 'none'})")
    prompt = _prompt(row[prompt_key], f"{where}: field {prompt_key!r}")
    answer = row.get(answer_key)
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
        raise GlassrlError(f"{where}: field {answer_key!r} must be a string or a number, got {type(answer).__name__}")
    metadata = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
    return PromptRecord(prompt=prompt, answer=None if answer is None else str(answer), metadata=metadata, source=where)


def _prompt(value: Any, where: str) -> str | tuple[dict[str, str], ...]:
    if isinstance(value, str):
        if not value.strip():
            raise GlassrlError(f"{where}: the prompt is empty")
        return value
    if not isinstance(value, list) or not value:
        raise GlassrlError(f"{where}: expected a string or a non-empty list of messages, got {value!r:.80}")
    messages = []
    for number, message in enumerate(value, start=1):
        if not isinstance(message, dict):
            raise GlassrlError(f"{where}: message {number} is not an object: {message!r:.80}")
        for key in ("role", "content"):
            if message.get(key) is None:
                raise GlassrlError(f"{where}: message {number} has no {key!r}")
            if not isinstance(message[key], str):
                kind = type(message[key]).__name__
                raise GlassrlError(f"{where}: message {number}: {key!r} must be a string, got {kind}")
        if message["role"] not in ROLES:
            raise GlassrlError(f"{where}: message {number} has role {message['role']!r}; valid: {', '.join(ROLES)}")
        messages.append({"role": message["role"], "content": message["content"]})
    return tuple(messages)
