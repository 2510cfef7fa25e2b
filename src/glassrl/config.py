"""Typed configuration: dataclasses, YAML files, dotted command-line overrides.

    cfg = load_config(SFTConfig, "examples/sft.yaml", ["optim.lr=3e-4", "seed=1"])

- A YAML file gives values for some fields; every other field keeps its default.
- Overrides are ``dotted.path=value``; the value is parsed as YAML
  (``1e-4`` -> float, ``[1, 2]`` -> list, ``null`` -> None) and then checked
  against the field's type. A number indexes a list (``reward.sources.0.weight=2``;
  the list's length appends an element); an optional section takes ``true`` for its
  defaults and ``false``/``null`` for off (``logging.wandb=true``).
- An unknown key or a bad value is a :class:`GlassrlError` that names the key, says where
  it came from (the file, or ``command line`` for an override) and lists the valid keys,
  with the nearest one when there is one ("did you mean algo.lam?"), or, for another library's
  name the config class lists in ``FOREIGN_NAMES``, the glassrl key it maps to ("did you mean
  rollout.n? TRL's num_generations ...").
- A config class with a ``validate(written)`` method is checked by the loader:
  ``written`` holds the dotted keys the user wrote (file and overrides), so a
  check can tell a knob the user set from one left at its default
  (:func:`knob_set`). A file that holds every key (a run's own ``config.yaml``)
  says nothing by its keys: there only values other than the default count as
  written (a key of an optional section, off by default, against that section's own
  default). Every config class has one validation path: its ``validate``, called
  here and again by the trainer with ``written=None``.
- A config class with an ``anchor_paths(config_dir, command_line, saved)`` method is given the
  directory of its file (the working directory without one), the keys the command line set and
  whether the file is a run's own config.yaml, before it is checked, to make the paths that are
  relative to the config file absolute (TrainConfig: glassrl.config_paths).
- Each field's help is given with its default: ``lr: float = option(1e-3, help="peak learning
  rate")`` (:func:`option`, read back by :func:`field_help`); :func:`describe` lists every option
  with its type, default and help (``glassrl config show``, docs/config.md).
- ``to_dict(cfg)`` gives plain data for writing the resolved config next to a run;
  :func:`load_saved_config` reads such a file back.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import sys
import types
import typing
from collections.abc import Set
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, TypeVar

import yaml

from glassrl.errors import GlassrlError
from glassrl.jsonl import TooDeep, check_plain, read_utf8, too_deep

C = TypeVar("C")


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> C:
    """Build ``cls`` from defaults, then the YAML file at ``path``, then ``overrides``; validate it."""
    data = _read(path)
    defaults = to_dict(cls())
    written = set(_dotted_keys(data))
    # glassrl's own config.yaml, judged by value: every key, or a run directory's (a run from an earlier
    # version lacks the keys added since); an optional section's keys against its own defaults (issue 44)
    if set(_dotted_keys(defaults)) <= written or _in_run_directory(path):
        file_leaves, default_leaves = flatten(data), flatten(_sections_on(cls()))
        written = {key for key, value in file_leaves.items() if value != default_leaves.get(key)}
    from_command_line = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not key.isprintable():  # a key with a newline in it is no key
            raise GlassrlError(f"{COMMAND_LINE}: {item!r}: expected dotted.key=value")
        try:
            value = safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as err:
            raise GlassrlError(f"{COMMAND_LINE}: {key}: {raw!r} is not a YAML value: {yaml_error(err)}") from None
        check_plain(value, COMMAND_LINE, key)
        _set_dotted(data, key.split("."), value, defaults)
        from_command_line.append(key)
        written.update(_prefixes(key), _dotted_keys(value, key + ".") if isinstance(value, dict) else ())
    origin = Origin(str(path) if path is not None else "config", tuple(from_command_line), foreign_names(cls))
    cfg = _build(cls, data, prefix="", origin=origin)
    _anchor(cfg, path, frozenset(from_command_line), saved=_in_run_directory(path))
    if hasattr(cfg, "validate"):
        cfg.validate(frozenset(written))
    return cfg


def _sections_on(cfg: Any) -> dict[str, Any]:
    """``to_dict(cfg)``, each optional section that is off (None) given its own defaults."""
    tree, hints = {}, typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        section = next((a for a in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(a)), None)
        value = section() if getattr(cfg, f.name) is None and section is not None else getattr(cfg, f.name)
        tree[f.name] = _sections_on(value) if dataclasses.is_dataclass(value) else copy.deepcopy(value)
    return tree


def foreign_names(cls: type) -> dict[str, str]:
    """{another library's dotted key: the text in parentheses an unknown-key error gives}: a config class's
    ``FOREIGN_NAMES`` (TrainConfig's: TRL's and verl's names, docs/trl-verl.md)."""
    return dict(getattr(cls, "FOREIGN_NAMES", {}))


def _in_run_directory(path: str | Path | None) -> bool:
    """``path`` is a run's config.yaml: beside it, the run's checkpoints or metrics."""
    if path is None:
        return False
    path = Path(path)
    return path.name == "config.yaml" and (
        (path.parent / "checkpoints").is_dir() or (path.parent / "metrics.jsonl").is_file()
    )


def load_saved_config(cls: type[C], path: str | Path) -> C:
    """A config glassrl wrote itself (a run's ``config.yaml``): every key is in the file, so
    ``validate`` judges a knob by its value against the default, not by its presence."""
    cfg = _build(cls, _read(path), prefix="", origin=Origin(str(path)))
    _anchor(cfg, path, saved=True)
    if hasattr(cfg, "validate"):
        cfg.validate(None)
    return cfg


def _anchor(cfg: Any, path: str | Path | None, command_line: frozenset[str] = frozenset(), saved: bool = False) -> None:
    """A config class with an ``anchor_paths(config_dir, command_line, saved)`` method makes its
    paths that are relative to the config file absolute: ``config_dir`` is the file's directory
    (the working directory when the config has no file), ``command_line`` the keys the command
    line set (its paths are the working directory's), ``saved`` whether the file is a run's own
    config.yaml (glassrl.config_paths)."""
    if hasattr(cfg, "anchor_paths"):
        config_dir = Path(path).resolve().parent if path is not None else Path.cwd()
        cfg.anchor_paths(config_dir, command_line, saved)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config dataclass (for YAML/JSON output)."""
    return dataclasses.asdict(cfg)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": [2]} -> {"a.b": 1, "c": [2]}: the leaves of nested mappings; lists are leaves."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


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


# ---------------------------------------------------------------- what each option is (config show, docs)


class Option(NamedTuple):
    """One row of :func:`describe`: a key, its type and value as YAML text, its help; ``section``
    for a nested config (its keys follow it)."""

    key: str
    type: str
    value: str
    help: str
    section: bool


def describe(cls: type, values: Any = None) -> list[Option]:
    """Every option of config class ``cls``, sections first then their keys, in field order;
    ``values`` (an instance of ``cls``) gives the values shown, else the defaults."""
    return _describe(cls, values if values is not None else cls(), "")


def _describe(cls: type, values: Any, prefix: str) -> list[Option]:
    rows: list[Option] = []
    hints, helps = typing.get_type_hints(cls), field_help(cls)
    for f in dataclasses.fields(cls):
        key, hint, value = prefix + f.name, hints[f.name], getattr(values, f.name)
        section = next((a for a in typing.get_args(hint) or (hint,) if dataclasses.is_dataclass(a)), None)
        if section is None:
            rows.append(Option(key, type_text(hint), value_text(value), helps.get(f.name, ""), False))
            continue
        optional = type(None) in typing.get_args(hint)
        shown = "null" if value is None else ""
        rows.append(Option(key, "section | null" if optional else "section", shown, helps.get(f.name, ""), True))
        rows += _describe(section, value if value is not None else section(), key + ".")
    return rows


def option(default: Any = dataclasses.MISSING, *, help: str, factory: Any = dataclasses.MISSING) -> Any:
    """A config field with its help, the text ``glassrl config show`` and docs/config.md give it:
    ``dataclasses.field`` with ``default`` (or ``factory``, for a mutable default) and the help in its
    metadata (:func:`field_help`)."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"help": help})


def field_help(cls: type) -> dict[str, str]:
    """{field name: help}: what each field's :func:`option` gives; "" for a field without one."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def type_text(hint: Any) -> str:
    """A type as the docs write it: ``int``, ``float | null``, ``"reward" | "loss"``, ``list[str]``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' for a in args)
    if origin in (list, tuple):
        return f"list[{type_text(args[0])}]" if args else "list"
    if origin is dict or hint is dict:
        return "mapping"
    if hint is Any:
        return "any"
    if dataclasses.is_dataclass(hint):
        return "section"
    return getattr(hint, "__name__", str(hint))


def value_text(value: Any) -> str:
    """A value as YAML flow text: ``null``, ``true``, ``1e-05``, ``task:add``, ``[{name: x, weight: 1.0}]``."""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else {math.inf: ".inf", -math.inf: "-.inf"}.get(value, ".nan")
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, sort_keys=False, width=math.inf)
    return text.removesuffix("\n...\n").strip()


# ---------------------------------------------------------------- reading, overriding, building


COMMAND_LINE = "command line"


class Origin:
    """Where the values came from, and how the loader words what is wrong with one of them.

    A config's origin is its file and the keys the command line overrode (``of``): an error
    reads ``c.yaml: optim.lr must be a number, got 'fast'``. A loader of other typed input
    (``glassrl explain``'s input file and flags: glassrl.commands.explain_input) words its
    errors by a subclass, through :func:`build`."""

    def __init__(self, file: str, overrides: tuple[str, ...] = (), foreign: dict[str, str] | None = None) -> None:
        self.file, self.overrides, self.foreign = file, overrides, foreign or {}

    def of(self, key: str) -> str:
        """The file, or ``command line`` when an override set ``key`` (or a section above it)."""
        key = key.replace("[", ".").replace("]", "")  # reward.sources[0].name -> reward.sources.0.name
        if any(key == k or key.startswith(k + ".") for k in self.overrides):
            return COMMAND_LINE
        return self.file

    def invalid(self, key: str, expected: str, value: Any) -> GlassrlError:
        """``value`` at ``key`` is not ``expected`` ("a number", "a list", ...)."""
        return GlassrlError(f"{self.of(key)}: {key} must be {expected}, got {value!r}")

    def not_finite(self, key: str, value: Any, number: float | int) -> GlassrlError:
        """``value`` at ``key`` reads as ``number``, which is NaN, ±inf, or beyond a float."""
        return GlassrlError(f"{self.of(key)}: {key} = {number}: must be a finite number")

    def not_one_of(self, key: str, value: Any, options: tuple[Any, ...]) -> GlassrlError:
        return GlassrlError(f"{self.of(key)}: {key}={value!r} is not one of {', '.join(map(repr, options))}")

    def unknown(self, prefix: str, key: Any, fields: list[str], hint: str | None) -> GlassrlError:
        """Key ``key`` of section ``prefix`` ("optim."; "" at the top) is none of ``fields``;
        ``hint``: the field it is likely meant to be."""
        name = _shown(key)
        foreign = self.foreign.get(prefix + name)
        return GlassrlError(
            f"{self.of(prefix + name)}: unknown key {prefix}{name}"
            + (f" ({foreign})" if foreign else f" (did you mean {prefix}{hint}?)" if hint else "")
            + f"; valid keys here: {', '.join(prefix + field for field in fields)}"
        )

    def missing(self, key: str) -> GlassrlError:
        """A field without a default is not given."""
        return GlassrlError(f"{self.of(key)}: {key}: missing")


def _shown(key: Any) -> str:
    """A key as an error shows it: a key of newlines or spaces quoted, on one line."""
    name = str(key)
    return repr(name) if not name.isprintable() or not name.strip() else name


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping holding a key twice (PyYAML keeps the last one silently)
    and any alias (``*name``): nine levels of nine aliases in 2 KB ("billion laughs") name 9⁹ values,
    which every walk over the loaded tree (flatten, deepcopy, the checks) visits one by one, and an
    alias shares one object between two keys, so that a dotted override of one would change both. A
    config names each value once; glassrl writes no alias (its config.yaml holds plain copies)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"an alias (*{event.anchor}): glassrl reads no YAML anchors or aliases; write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: {...}`: keys written beside it override the merged ones, as YAML says
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:
            continue  # an unhashable key: construct_mapping names it
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {first.line + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


def yaml_error(err: yaml.YAMLError) -> str:
    """A YAML error on one line: ``line 4, column 3: duplicate key 'gamma' (first at line 3)``."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return " ".join(f"{where}{problem}".split())


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def safe_load(text: str) -> Any:
    """yaml.safe_load, except that an alias (refused: :class:`_UniqueKeyLoader`), a duplicate key in a mapping,
    values nested deeper than
    glassrl.jsonl.MAX_NESTING (the parser raised RecursionError) and a value a constructor refuses
    (an integer past the int-string limit, a date like 2024-13-45) are each a yaml.YAMLError naming it."""
    try:
        value = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.YAMLError(str(TooDeep())) from None
    except ValueError as err:  # raised by a constructor: an int past the int-string limit, a date like 2024-13-45
        long = max(map(len, re.findall(r"\d+", text)), default=0)
        too_long = long > sys.get_int_max_str_digits() > 0
        raise yaml.YAMLError(
            f"an integer of {long} digits; at most {sys.get_int_max_str_digits()} are read" if too_long else str(err)
        ) from None
    if too_deep(value):
        raise yaml.YAMLError(str(TooDeep()))
    return value


def _read(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise GlassrlError(f"config file not found: {path}")
    try:
        loaded = safe_load(read_utf8(path))
    except yaml.YAMLError as err:
        raise GlassrlError(f"{path}: not valid YAML: {yaml_error(err)}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise GlassrlError(f"{path}: the top level must be a mapping of keys to values")
    check_plain(loaded, str(path))  # a lone surrogate (a "\\ud800" escape)
    return loaded or {}


def _set_dotted(data: dict[str, Any], keys: list[str], value: Any, defaults: dict[str, Any]) -> None:
    """``data[k0][k1]... = value``, making sections on the way. A list on the way (the file's, else
    the default's, copied into ``data``) takes a number: an element, or its length to append one."""
    node: Any = data
    default: Any = defaults
    for depth, part in enumerate(keys):
        if isinstance(node, list):
            if not part.isdigit() or int(part) > len(node):
                where = ".".join(keys[:depth])
                raise GlassrlError(
                    f"{COMMAND_LINE}: {'.'.join(keys)}: {where} is a list of {len(node)}; "
                    f"index it with 0 to {len(node) - 1}, or {len(node)} to append"
                )
            part = int(part)  # type: ignore[assignment]
            if part == len(node):
                node.append({})
            default = default[part] if isinstance(default, list) and part < len(default) else None
        else:
            default = default.get(part) if isinstance(default, dict) else None
        if depth == len(keys) - 1:
            node[part] = value
            return
        child = node[part] if isinstance(node, list) else node.get(part)
        if child is None and isinstance(default, list):
            child = copy.deepcopy(default)
        if not isinstance(child, (dict, list)):
            child = {}
        node[part] = child
        node = child


def _prefixes(key: str) -> list[str]:
    """Every prefix of a dotted key: "a.b.c" -> a, a.b, a.b.c."""
    parts = key.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _dotted_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Every dotted key in nested ``data``, sections included: {"a": {"b": 1}} -> a, a.b."""
    keys = []
    for name, value in data.items():
        keys.append(prefix + str(name))
        if isinstance(value, dict):
            keys += _dotted_keys(value, f"{prefix}{name}.")
    return keys


def build(cls: type[C], data: Any, origin: Origin) -> C:
    """``cls`` (a dataclass) from plain ``data``, every value checked against its field's type
    as a config file's are; errors worded by ``origin``. A field without a default must be
    given; a field with ``init=False`` is derived, not read."""
    return _build(cls, data, prefix="", origin=origin)


def _build(cls: type[C], data: dict[str, Any], prefix: str, origin: Origin, base: Any = None) -> C:
    """``cls`` from ``data``; a field ``data`` does not give takes ``base``'s value when there is a
    ``base`` (the section's default in its parent, e.g. SFTConfig's optimiser with its own warm-up),
    else the class's default."""
    if not isinstance(data, dict):
        raise origin.invalid(prefix.rstrip(".") or "config", "a mapping", data)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        name = _shown(unknown[0])
        hint = _moved(hints, name) or next(iter(difflib.get_close_matches(name, list(fields), n=1)), None)
        raise origin.unknown(prefix, unknown[0], list(fields), hint)
    required = [
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and name not in data
    ]
    if required:
        raise origin.missing(prefix + required[0])
    kwargs = {}
    for name, value in data.items():
        default = getattr(base, name) if base is not None else _field_default(fields[name])
        kwargs[name] = coerce(hints[name], value, f"{prefix}{name}", origin, default=default)
    if base is not None:
        kwargs |= {name: copy.deepcopy(getattr(base, name)) for name in fields if name not in data}
    return cls(**kwargs)


def _field_default(f: dataclasses.Field) -> Any:
    """A field's default value (its factory called); None when it has none."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _moved(hints: dict[str, Any], name: str) -> str | None:
    """``section.name`` when ``name`` is a field of one of these fields' config sections."""
    for field_name, hint in hints.items():
        options = typing.get_args(hint) or (hint,)
        for option in options:
            if dataclasses.is_dataclass(option) and name in {f.name for f in dataclasses.fields(option)}:
                return f"{field_name}.{name}"
    return None


def coerce(hint: Any, value: Any, key: str, origin: Origin, default: Any = None) -> Any:
    """``value`` at ``key`` checked against the type ``hint`` (and converted: a section to its
    dataclass, a number to float); errors worded by ``origin``. A mapping's values are not
    checked by the type: a caller that needs them typed checks each with this. ``default``: the
    field's default; a section's keys that ``value`` leaves out keep the default section's."""
    origin_type = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin_type in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if value is False and type(None) in args and any(dataclasses.is_dataclass(a) for a in options):
            return None  # an optional section written `false`: off
        errors = []
        for option in options:
            try:
                return coerce(option, value, key, origin, default=default)
            except GlassrlError as err:
                errors.append(str(err))
        raise GlassrlError(errors[0])
    if dataclasses.is_dataclass(hint):
        if value is True or value is None:  # a section written `true` (or empty): its defaults
            value = {}
        base = default if isinstance(default, hint) else None
        return _build(hint, value, prefix=key + ".", origin=origin, base=base)
    if origin_type is typing.Literal:
        if value not in args:
            raise origin.not_one_of(key, value, args)
        return value
    if origin_type in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise origin.invalid(key, "a list", value)
        inner = args[0] if args else Any
        items = [coerce(inner, v, f"{key}[{i}]", origin) for i, v in enumerate(value)]
        return items if origin_type is list else tuple(items)
    if origin_type is dict:
        if not isinstance(value, dict):
            raise origin.invalid(key, "a mapping", value)
        return dict(value)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise origin.invalid(key, "true or false", value)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise origin.invalid(key, "an integer", value)
        return value
    if hint is float:
        number = value
        if isinstance(value, str):
            # PyYAML follows YAML 1.1, where "1e-3" (no dot) is a string, not a float.
            try:
                number = float(value)
            except ValueError:
                pass
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise origin.invalid(key, "a number", value)
        try:
            finite = math.isfinite(float(number))
        except OverflowError:  # an integer beyond any float
            finite = False
        if not finite:  # .nan / .inf in a setting end as NaN weights: refused here
            raise origin.not_finite(key, value, number)
        return float(number)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise origin.invalid(key, "a string", value)
        return str(value)
    return value


# ---------------------------------------------------------------- checks and tables shared by every trainer's config


def fail(key: str, value: Any, rule: str) -> NoReturn:
    raise GlassrlError(f"{key} = {value!r}: {rule}")


def at_least(minimum: int, values: dict[str, float | int | None]) -> None:
    """Each ``key: value`` (None skipped) must be >= ``minimum``."""
    for key, value in values.items():
        if value is not None and value < minimum:
            fail(key, value, f"must be >= {minimum}")


def check_seed(value: int) -> None:
    """The top-level ``seed`` of every trainer's config: numpy's range, 0 to 2**32 - 1 (torch's is wider)."""
    if not 0 <= value <= SEED_MAX:
        fail("seed", value, f"must be a whole number in [0, {SEED_MAX}]")


SEED_MAX = 2**32 - 1


def check_threads(value: Any) -> None:
    """The top-level ``threads`` of every trainer's config: auto, or a whole number >= 1."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        fail("threads", value, "must be auto or a whole number of threads >= 1")


def print_resolved(resolved, console) -> None:
    """The resolved table (rich) of a :class:`Resolved`, SFTConfig or RMConfig: its ``title``,
    then one row per quantity with its value and unit (``rows()``)."""
    from rich.table import Table

    table = Table(title=resolved.title, title_justify="left")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("unit")
    for row in resolved.rows():
        table.add_row(*row)
    console.print(table)
