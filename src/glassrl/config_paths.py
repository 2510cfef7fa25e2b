"""Where a training config's relative paths are read from: one rule (docs/config.md, "Paths").

- Files that travel with a config — data (``data.train``, ``data.test``, ``data.ptx``, the paths of
  a mixture), reward functions (``reward.sources``' ``file.py:fn`` specs, through
  ``reward.base_dir``), tools and environments (``rollout.agent.tools``, ``.environment``) — are
  read from the directory of the config file that names them.
- A path given on the command line (``key=value``) is read from the working directory, as any path
  typed in a shell is.
- Where runs live — ``output_dir`` and the models (``model.*``, a reward model's or teacher's
  ``path``), which are usually an earlier run's ``output_dir`` — is the working directory's.

``glassrl sft``, ``rm`` and ``dpo`` follow the same rule for their ``data`` and ``eval_data``
(:func:`anchor_data`). ``TrainConfig.anchor_paths`` makes the first kind absolute when the config
file names them, so that
the run's config.yaml, and a resume from it, read the same files from anywhere; a path from the
command line, and one in a run's own config.yaml (runs before this rule recorded them as given),
stays relative: the working directory's. "No such file" errors name the path they looked for.
"""

from __future__ import annotations

import os
from collections.abc import Set
from pathlib import Path
from typing import Any

TASK = "task:"  # a bundled task's prompts: not a path


def given(key: str, command_line: Set[str]) -> bool:
    """Whether the command line set ``key``, a key under it, or a section holding it."""
    return any(k == key or k.startswith(key + ".") or key.startswith(k + ".") for k in command_line)


def data_path(value: Any, base: Path) -> Any:
    """A data spec with its relative path joined to ``base``: ``task:NAME`` and absolute paths as
    they are; ``path::split`` keeps its split; a mixture's entries each their ``path``."""
    if isinstance(value, list):
        return [{**item, "path": data_path(item["path"], base)} if isinstance(item, dict) else item for item in value]
    if not isinstance(value, str) or value.startswith(TASK):
        return value
    path, sep, split = value.partition("::")
    return _joined(path, base) + sep + split


def file_spec(spec: Any, base: Path) -> Any:
    """A ``file.py:attribute`` spec with its relative file joined to ``base``; any other spec
    (a built-in name, ``module:attribute``) as it is."""
    if not isinstance(spec, str):
        return spec
    where, sep, attribute = spec.rpartition(":")
    if not sep or not where.endswith(".py"):
        return spec
    return f"{_joined(where, base)}:{attribute}"


def anchor_data(cfg: Any, keys: tuple[str, ...], config_dir: Path, command_line: Set[str], saved: bool) -> None:
    """The supervised trainers' rule, the same as ``glassrl train``'s: each data field of ``cfg``
    named in ``keys`` (a spec or a list of specs) joined to the config file's directory, unless the
    command line set it or the file is a run's own config.yaml."""
    for key in keys:
        value = getattr(cfg, key)
        if saved or given(key, command_line) or value is None:
            continue
        specs = value if isinstance(value, list) else [value]
        joined = [data_path(spec, config_dir) for spec in specs]
        setattr(cfg, key, joined if isinstance(value, list) else joined[0])


def _joined(path: str, base: Path) -> str:
    if not path or Path(path).is_absolute():
        return path
    return os.path.normpath(base / path)
