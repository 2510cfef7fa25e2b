"""Tools by name: the built-ins, and the user's own as ``module:attribute`` or ``path/to/file.py:attribute``.

``build_tools(["calculator", "my_tools:lookup", "tools/weather.py:Weather"], base_dir=...)``:

- a built-in name (``BUILTIN_TOOLS``): calculator, python, search, open_page;
- ``package.module:attribute``: imported with the normal import system;
- ``path/to/file.py:attribute``: that file loaded as a module; a relative path is resolved
  against ``base_dir`` (the directory of the config that names it), so a config and its tools
  travel together.

The attribute may be a tool object (has name, description, parameters, call), a class (called
with no arguments, its instance must be a tool), or a plain function (wrapped in
:class:`~glassrl.agents.tools.FunctionTool`). Anything else, a missing file, module or
attribute, or an import that raises, is one GlassrlError naming the spec.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from glassrl.agents.calculator import Calculator
from glassrl.agents.corpus import OpenPageTool, SearchTool
from glassrl.agents.sandbox import PythonTool
from glassrl.agents.tools import FunctionTool, Tool, tool_map
from glassrl.errors import GlassrlError
from glassrl.user_code import import_file

# name -> constructor with no arguments
BUILTIN_TOOLS: dict[str, Callable[[], Tool]] = {
    "calculator": Calculator,
    "python": PythonTool,
    "search": SearchTool,
    "open_page": OpenPageTool,
}


def build_tools(specs: Sequence[str], base_dir: str | Path = ".") -> list[Tool]:
    """The tools named by ``specs`` (module docstring), in order; GlassrlError for a bad spec or a repeated name."""
    tools = [build_tool(spec, base_dir) for spec in specs]
    try:
        tool_map(tools)
    except ValueError as err:
        raise GlassrlError(f"tools {list(specs)}: {err}") from None
    return tools


def build_tool(spec: str, base_dir: str | Path = ".") -> Tool:
    """One tool from a built-in name or a ``module:attribute`` / ``file.py:attribute`` spec."""
    if spec in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[spec]()
    if not spec.rpartition(":")[0] or not spec.rpartition(":")[2]:
        valid = ", ".join(BUILTIN_TOOLS)
        raise GlassrlError(f"tool {spec!r}: not a built-in ({valid}) nor 'module:attribute' or 'file.py:attribute'")
    return _as_tool(spec, load_attribute(spec, base_dir))


def load_attribute(spec: str, base_dir: str | Path = ".", what: str = "tool") -> Any:
    """The object ``module:attribute`` or ``path/to/file.py:attribute`` names (module docstring);
    GlassrlError naming ``what`` and the spec when the module, file or attribute is missing."""
    where, _, attribute = spec.rpartition(":")
    module = _load_file(spec, where, base_dir, what) if where.endswith(".py") else _import(spec, where, what)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise GlassrlError(f"{what} {spec!r}: {where!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def _import(spec: str, module_name: str, what: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure is the user's to fix
        raise GlassrlError(f"{what} {spec!r}: cannot import {module_name!r}: {type(err).__name__}: {err}") from None


def _load_file(spec: str, file: str, base_dir: str | Path, what: str) -> Any:
    path = Path(file)
    path = (path if path.is_absolute() else Path(base_dir) / path).resolve()
    if not path.is_file():
        raise GlassrlError(f"{what} {spec!r}: no file {path}")
    try:
        return import_file(path, "glassrl_user_tools")
    except ImportError as err:
        raise GlassrlError(f"{what} {spec!r}: {err}") from None


def _as_tool(spec: str, target: Any) -> Tool:
    if inspect.isclass(target):
        try:
            target = target()
        except Exception as err:  # noqa: BLE001
            raise GlassrlError(f"tool {spec!r}: {target.__name__}() raised {type(err).__name__}: {err}") from None
    elif inspect.isfunction(target):
        try:
            target = FunctionTool(target)
        except TypeError as err:
            raise GlassrlError(f"tool {spec!r}: {err}") from None
    if not isinstance(target, Tool) or not isinstance(target.parameters, dict):
        raise GlassrlError(
            f"tool {spec!r}: expected a tool (name, description, parameters dict, call(arguments)), a class "
            f"making one, or a function; got {type(target).__name__}"
        )
    return target
