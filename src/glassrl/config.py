"""Typed configuration: dataclasses, YAML files, dotted command-line overrides.

    cfg = load_config(SFTConfig, "examples/sft.yaml", ["optim.lr=3e-4", "seed=1"])

- A YAML file gives values for some fields; every other field keeps its default.
- Overrides are ``dotted.path=value``; the value is parsed as YAML
  (``1e-4`` -> float, ``[1, 2]`` -> list, ``null`` -> None) and then checked
  against the field's type.
- An unknown key, in the file or in an override, is a :class:`GlassrlError`
  that names it, says where it came from, and lists the valid keys.
- A config class with a ``validate(written)`` method is checked by the loader:
  ``written`` holds the dotted keys the user wrote (file and overrides), so a
  check can tell a knob the user set from one left at its default
  (:func:`knob_set`). Every config class has one validation path: its
  ``validate``, called here and again by the trainer with ``written=None``.
- ``to_dict(cfg)`` gives plain data for writing the resolved config next to a run;
  :func:`load_saved_config` reads such a file back.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Set
from pathlib import Path
from typing import Any, TypeVar

import yaml

from glassrl.errors import GlassrlError

C = TypeVar("C")


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> C:
    """Build ``cls`` from defaults, then the YAML file at ``path``, then ``overrides``; validate it."""
    data = _read(path)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise GlassrlError(f"override {item!r}: expected dotted.key=value")
        _set_dotted(data, key.strip().split("."), yaml.safe_load(raw) if raw.strip() else None)
    cfg = _build(cls, data, prefix="", source=str(path) if path is not None else "overrides")
    if hasattr(cfg, "validate"):
        cfg.validate(frozenset(_dotted_keys(data)))
    return cfg


def load_saved_config(cls: type[C], path: str | Path) -> C:
    """A config glassrl wrote itself (a run's ``config.yaml``): every key is in the file, so
    ``validate`` judges a knob by its value against the default, not by its presence."""
    cfg = _build(cls, _read(path), prefix="", source=str(path))
    if hasattr(cfg, "validate"):
        cfg.validate(None)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config dataclass (for YAML/JSON output)."""
    return dataclasses.asdict(cfg)


def get_dotted(cfg: Any, key: str) -> Any:
    """The value of the dotted ``key`` ("algo.kl.coef") in a config dataclass."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def knob_set(cfg: Any, key: str, written: Set[str] | None) -> bool:
    """Whether the user set the knob ``key``: wrote it (or a key under it) when ``written`` is
    known, else gave it a value other than its default. A null value never counts as set."""
    value = get_dotted(cfg, key)
    if value is None:
        return False
    if written is not None:
        return key in written or any(w.startswith(key + ".") for w in written)
    return value != get_dotted(type(cfg)(), key)


def _read(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise GlassrlError(f"config file not found: {path}")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise GlassrlError(f"{path}: not valid YAML: {err}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise GlassrlError(f"{path}: the top level must be a mapping of keys to values")
    return loaded or {}


def _set_dotted(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


def _dotted_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Every dotted key in nested ``data``, sections included: {"a": {"b": 1}} -> a, a.b."""
    keys = []
    for name, value in data.items():
        keys.append(prefix + str(name))
        if isinstance(value, dict):
            keys += _dotted_keys(value, f"{prefix}{name}.")
    return keys


def _build(cls: type[C], data: dict[str, Any], prefix: str, source: str) -> C:
    if not isinstance(data, dict):
        raise GlassrlError(f"{source}: {prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        valid = ", ".join(prefix + name for name in fields)
        hint = _moved(hints, str(unknown[0]))
        raise GlassrlError(
            f"{source}: unknown key {prefix}{unknown[0]!s}"
            + (f" (did you mean {prefix}{hint}?)" if hint else "")
            + f"; valid keys here: {valid}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, f"{prefix}{name}", source)
    return cls(**kwargs)


def _moved(hints: dict[str, Any], name: str) -> str | None:
    """``section.name`` when ``name`` is a field of one of these fields' config sections."""
    for field_name, hint in hints.items():
        options = typing.get_args(hint) or (hint,)
        for option in options:
            if dataclasses.is_dataclass(option) and name in {f.name for f in dataclasses.fields(option)}:
                return f"{field_name}.{name}"
    return None


def _coerce(hint: Any, value: Any, key: str, source: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _coerce(option, value, key, source)
            except GlassrlError as err:
                errors.append(str(err))
        raise GlassrlError(errors[0])
    if dataclasses.is_dataclass(hint):
        return _build(hint, value if value is not None else {}, prefix=key + ".", source=source)
    if origin is typing.Literal:
        if value not in args:
            raise GlassrlError(f"{source}: {key}={value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise GlassrlError(f"{source}: {key} must be a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(inner, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise GlassrlError(f"{source}: {key} must be a mapping, got {value!r}")
        return dict(value)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise GlassrlError(f"{source}: {key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise GlassrlError(f"{source}: {key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):
            # PyYAML follows YAML 1.1, where "1e-3" (no dot) is a string, not a float.
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GlassrlError(f"{source}: {key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise GlassrlError(f"{source}: {key} must be a string, got {value!r}")
        return str(value)
    return value
