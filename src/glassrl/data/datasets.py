"""Prompt datasets from JSON lines, Parquet, or a Hugging Face ``datasets`` directory.

Formats, chosen by the path:

- ``*.jsonl`` / ``*.json``: one JSON object per line (blank lines skipped);
- ``*.parquet``: read with pyarrow, :data:`PARQUET_BATCH_ROWS` rows at a time;
- a directory written by ``datasets``' ``save_to_disk``: read with ``load_from_disk``;
  pick a split of a ``DatasetDict`` with ``path::split`` (needed when it has several).

Each row has a prompt — plain text, or chat messages ``[{"role", "content"}, ...]`` —
under ``prompt_key``, an optional reference answer under ``answer_key``, and metadata that
the reward sources read: the fields named by ``metadata_keys``, or by default every other
top-level field, untouched. Of a message only ``role`` and ``content`` are kept.

A key is a field name or a dotted path into nested fields (:func:`lookup`):
``reward_model.ground_truth`` is the ``ground_truth`` of the row's ``reward_model`` object,
as verl lays out its Parquet files (``prompt`` as messages, ``data_source``,
``reward_model: {ground_truth, style}``, ``extra_info``); GSM8K's own files need
``prompt_key = question`` (docs/data.md).

A malformed row is a :class:`GlassrlError` naming the file and the row: ``path:17``
(1-based line number) for JSON lines, ``path#17`` (0-based row index) for Parquet
and ``datasets`` directories; a missing field also lists the fields the row has. The answer is optional per row, but an
``answer_key`` other than the default that no row has is a mistake in the key (GlassrlError
naming the file, the key and the first row's fields), not a dataset without answers.

Prompt length limits need the tokenizer and the config: the trainer applies them
(glassrl.rl.prompts).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.jsonl import jsonl_objects

ROLES = ("system", "user", "assistant", "tool")
DEFAULT_ANSWER_KEY = "answer"  # a file without this field holds prompts without references


class MissingField(Exception):
    """A key names no field of the row; the message says what is there instead."""


def load_prompts(
    path: str | Path,
    *,
    prompt_key: str = "prompt",
    answer_key: str = DEFAULT_ANSWER_KEY,
    metadata_keys: Sequence[str] | None = None,
) -> list[PromptRecord]:
    """All prompts of the dataset at ``path`` (see the module docstring)."""
    first: dict[str, Any] = {}  # the first row, for the fields a wrong answer_key names instead
    records = []
    for row, where in _rows(str(path)):
        records.append(_record(row, where, prompt_key, answer_key, metadata_keys))
        first = first or row
    if not records:
        raise GlassrlError(f"{path}: no prompts in the dataset")
    if answer_key != DEFAULT_ANSWER_KEY and all(r.answer is None for r in records):
        raise GlassrlError(
            f"{path}: answer_key = {answer_key!r}: no row has this field (fields of the first row: "
            f"{', '.join(map(str, first)) or 'none'})"
        )
    return records


def lookup(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, or the nested field that the dotted path ``key`` names: "a.b" is
    ``row["a"]["b"]``. A field whose own name holds the dot ("a.b") wins. Raises
    :class:`MissingField` saying which fields the innermost object reached has."""
    if key in row:
        return row[key]
    node: Any = row
    reached: list[str] = []
    for part in key.split("."):
        if not isinstance(node, Mapping):
            raise MissingField(f"{'.'.join(reached)!r} is a {type(node).__name__}, not an object")
        if part not in node:
            where = f" of {'.'.join(reached)!r}" if reached else ""
            raise MissingField(f"fields{where}: {', '.join(map(_name, node)) or 'none'}")
        node = node[part]
        reached.append(part)
    return node


def _name(key: Any) -> str:
    """A field's name as a message shows it: quoted when it holds a newline or another control character."""
    return str(key) if str(key).isprintable() else repr(key)


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
        looked = "" if p.is_absolute() else f"looked for {p.absolute()}; "
        raise GlassrlError(
            f"{path}: no such file or directory ({looked}a relative path in a config file is read from "
            "the file's directory, one on the command line from the working directory)"
        )
    if p.suffix in (".jsonl", ".json"):
        yield from jsonl_objects(p)
    elif p.suffix == ".parquet":
        yield from _parquet_rows(p)
    else:
        formats = ".jsonl, .json (JSON lines), .parquet or a datasets directory"
        raise GlassrlError(f"{path}: unknown format {p.suffix!r}; use {formats}")


# Parquet rows become Python objects this many at a time: never the whole table at once.
PARQUET_BATCH_ROWS = 4096


def _parquet_rows(path: Path) -> Iterator[tuple[Any, str]]:
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS)
        index = 0
        for batch in batches:
            for row in batch.to_pylist():
                yield row, f"{path}#{index}"
                index += 1
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise GlassrlError(f"{path}: cannot read as Parquet: {err}") from None


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


def _record(
    row: Any, where: str, prompt_key: str, answer_key: str, metadata_keys: Sequence[str] | None
) -> PromptRecord:
    if not isinstance(row, dict):
        raise GlassrlError(f"{where}: expected a JSON object, got {type(row).__name__}")

    def field(key: str) -> Any:
        try:
            return lookup(row, key)
        except MissingField as err:
            raise GlassrlError(f"{where}: missing field {key!r} ({err})") from None

    prompt = parse_prompt(field(prompt_key), f"{where}: field {prompt_key!r}")
    try:
        answer = lookup(row, answer_key)
    except MissingField:
        answer = None  # a dataset may hold prompts without references (a reward model scores them)
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
        raise GlassrlError(f"{where}: field {answer_key!r} must be a string or a number, got {type(answer).__name__}")
    if metadata_keys is None:
        metadata = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
    else:
        metadata = {key: field(key) for key in metadata_keys}
    return PromptRecord(prompt=prompt, answer=None if answer is None else str(answer), metadata=metadata, source=where)


def parse_prompt(value: Any, where: str) -> str | tuple[dict[str, str], ...]:
    """A row's prompt: non-empty text, or chat messages (role and content kept); GlassrlError naming ``where``."""
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
