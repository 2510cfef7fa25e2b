"""Typed configuration: dataclasses, YAML files, dotted command-line overrides.

    cfg = load_config(SFTConfig, "examples/sft.yaml", ["optim.lr=3e-4", "seed=1"])

- A YAML file gives values for some fields; every other field keeps its default.
- Overrides are ``dotted.path=value``; the value is parsed as YAML
  (``1e-4`` -> float, ``[1, 2]`` -> list, ``null`` -> None) and then checked
  against the field's type.
- An unknown key, in the file or in an override, is a :class:`GlassrlError`
  that names it, says where it came from, and lists the valid keys.
- ``to_dict(cfg)`` gives plain data for writing the resolved config next to a run.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from glassrl.errors import GlassrlError

C = TypeVar("C")


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> C:
    """Build ``cls`` from defaults, then the YAML file at ``path``, then ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise GlassrlError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise GlassrlError(f"{path}: not valid YAML: {err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise GlassrlError(f"{path}: the top level must be a mapping of keys to values")
        data = loaded or {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise GlassrlError(f"override {item!r}: expected dotted.key=value")
        _set_dotted(data, key.strip().split("."), yaml.safe_load(raw) if raw.strip() else None)
    source = str(path) if path is not None else "overrides"
    return _build(cls, data, prefix="", source=source)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config dataclass (for YAML/JSON output)."""
    return dataclasses.asdict(cfg)


def _set_dotted(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


def _build(cls: type[C], data: dict[str, Any], prefix: str, source: str) -> C:
    if not isinstance(data, dict):
        raise GlassrlError(f"{source}: {prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        valid = ", ".join(prefix + name for name in fields)
        raise GlassrlError(f"{source}: unknown key {prefix}{unknown[0]!s}; valid keys here: {valid}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, f"{prefix}{name}", source)
    return cls(**kwargs)


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
