"""The bundled configs, shipped inside the package (package data), so that an installed glassrl
(``pip install .``, no source tree) runs ``glassrl demo`` and ``glassrl train grpo``.

One YAML file per preset: the RL algorithms (``grpo.yaml``, ``ppo.yaml``, ...: TrainConfig,
each with an ``algo`` section), ``sft.yaml`` (SFTConfig) and ``rm.yaml`` (RMConfig), and the
presets of the agentic tasks' demos (``tool_add.yaml``, ``research_grpo.yaml`` and
``research_ppo.yaml``: ``TASKS``, ``COMPANIONS``). In a source
checkout ``examples/<name>.yaml`` is a relative symlink to the file here, so
``glassrl train examples/grpo.yaml`` reads the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from glassrl.config import safe_load
from glassrl.errors import GlassrlError

DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """Every bundled config, by name (the file's stem)."""
    return sorted(p.stem for p in DIR.glob("*.yaml"))


# An agentic task's demo (``glassrl demo --task NAME``) -> its preset: an algorithm on that task and its model.
TASKS = {"tool-add": "tool_add", "research": "research_grpo"}
# A task's demo that compares algorithms also trains these presets, beside its own (research: PPO beside GRPO).
COMPANIONS = {"research": ("research_ppo",)}


def rl_names() -> list[str]:
    """The algorithm presets (``glassrl train`` / ``glassrl demo --algo``): the configs with an
    ``algo`` section, the task presets (``TASKS``, ``COMPANIONS``) left out."""
    tasks = {*TASKS.values(), *(name for names in COMPANIONS.values() for name in names)}
    return [
        name
        for name in names()
        if name not in tasks and "algo" in (safe_load(path(name).read_text(encoding="utf-8")) or {})
    ]


def path(name: str) -> Path:
    """The file of preset ``name``; GlassrlError listing the presets when there is none."""
    file = DIR / f"{name}.yaml"
    if not file.is_file():
        raise GlassrlError(f"no preset {name!r}; presets: {', '.join(names())}")
    return file


def config_file(arg: str) -> Path:
    """A command's CONFIG argument: a YAML file, or else the name of a bundled preset ("grpo")."""
    given = Path(arg)
    if given.is_file() or given.suffix in (".yaml", ".yml") or len(given.parts) > 1:
        return given  # a path: load_config names it when it is missing
    if not (DIR / f"{arg}.yaml").is_file():
        raise GlassrlError(f"{arg!r} is neither a config file nor a preset; presets: {', '.join(names())}")
    return DIR / f"{arg}.yaml"


def config_and_overrides(arg: str | None, overrides: list[str]) -> tuple[Path | None, list[str]]:
    """A supervised command's CONFIG and overrides, CONFIG optional: ``glassrl rm data=pairs.jsonl``
    (no file: the config class's defaults) reads its first ``key=value`` as an override, not a file."""
    if arg is None:
        return None, list(overrides)
    if "=" in arg and not Path(arg).is_file():
        return None, [arg, *overrides]
    return config_file(arg), list(overrides)
