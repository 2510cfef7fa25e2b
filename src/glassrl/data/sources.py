"""A prompt set as a config names it: one source, or a mixture of weighted sources.

    train: data/gsm8k.jsonl                      # one source: a path or "task:NAME[/SPLIT]"
    train:                                       # a mixture, sampled by weight
      - {path: data/gsm8k.jsonl, weight: 3, prompt_key: question}
      - {path: task:arith-verify, weight: 1}

An entry of a mixture is ``{path, weight}`` plus, optionally, the reading keys of its own
file (``prompt_key``, ``answer_key``, ``metadata_keys``: files laid out differently can be
mixed); a key it leaves out is the ``data.*`` one. :func:`parse_sources` turns either form
into :class:`Source` objects and names the entry and key of anything wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from glassrl.errors import GlassrlError


@dataclass(frozen=True)
class Source:
    """One prompt source: where it is, its share of a mixture, and how to read its rows.

    path:          a dataset path (JSON lines, Parquet, datasets directory) or "task:NAME[/SPLIT]"
    weight:        relative sampling weight w_k (probability w_k / Σ w); 1 for a single source
    prompt_key, answer_key, metadata_keys: the fields of glassrl.data.datasets.load_prompts
    key:           the config key it came from, for errors ("data.train[1]")
    """

    path: str
    weight: float = 1.0
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    metadata_keys: tuple[str, ...] | None = None
    key: str = "data.train"


ENTRY_KEYS = ("path", "weight", "prompt_key", "answer_key", "metadata_keys")


def parse_sources(value: str | Sequence[Any], key: str, defaults: Source) -> list[Source]:
    """``value`` (a path, or a list of mixture entries) -> its sources; the reading keys that an
    entry leaves out come from ``defaults``. GlassrlError naming ``key[i].field``."""
    if isinstance(value, str):
        return [replace(defaults, path=value, weight=1.0, key=key)]
    if not isinstance(value, Sequence) or not value:
        raise GlassrlError(f"{key} = {value!r}: expected a path or a non-empty list of {{path, weight}}")
    return [_entry(item, f"{key}[{i}]", defaults) for i, item in enumerate(value)]


def _entry(item: Any, key: str, defaults: Source) -> Source:
    if not isinstance(item, dict):
        raise GlassrlError(f"{key} = {item!r}: expected a mapping {{path, weight}}")
    unknown = sorted(set(item) - set(ENTRY_KEYS))
    if unknown:
        raise GlassrlError(f"{key}.{unknown[0]}: unknown key; valid: {', '.join(ENTRY_KEYS)}")
    path = item.get("path")
    if not isinstance(path, str) or not path:
        raise GlassrlError(f"{key}.path = {path!r}: expected a dataset path or task:NAME")
    weight = item.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (math.isfinite(weight) and weight > 0):
        raise GlassrlError(f"{key}.weight = {weight!r}: must be a number > 0")
    fields: dict[str, Any] = {}
    for name in ("prompt_key", "answer_key"):
        if name in item:
            if not isinstance(item[name], str) or not item[name]:
                raise GlassrlError(f"{key}.{name} = {item[name]!r}: expected a field name or dotted path")
            fields[name] = item[name]
    if "metadata_keys" in item:
        keys = item["metadata_keys"]
        if keys is not None and (not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys)):
            raise GlassrlError(f"{key}.metadata_keys = {keys!r}: expected a list of field names (or null)")
        fields["metadata_keys"] = None if keys is None else tuple(keys)
    return replace(defaults, path=path, weight=float(weight), key=key, **fields)


def probabilities(sources: Sequence[Source]) -> list[float]:
    """Each source's sampling probability w_k / Σ_j w_j."""
    total = sum(s.weight for s in sources)
    return [s.weight / total for s in sources]
