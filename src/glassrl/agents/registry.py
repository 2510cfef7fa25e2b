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

A user's tool runs in a worker process, never in the caller (:class:`WorkerTool`, issue 37: a tool
calling ``os._exit(0)`` ended ``glassrl audit`` with exit code 0 and nothing printed, and would
have ended ``train`` the same way). Its module is imported there (under a time limit, once per
worker), and each call is sent there: a tool that exits, crashes (a segfault) or raises is an
error observation for that call, one that hangs past its time limit a timeout observation (the
worker is killed, not abandoned), and the next call gets a fresh worker. The workers are those of
:mod:`glassrl.worker_pool` (a pool per size, role "tool"); arguments travel pickled, the answer
comes back as JSON text. What a tool keeps between calls lives in its worker: a class is made
once per worker (not per episode), and the pool may send two calls of one episode to different
workers; state an episode needs belongs in an environment (rollout.agent.environment).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from glassrl.agents.calculator import Calculator
from glassrl.agents.corpus import OpenPageTool, SearchTool
from glassrl.agents.sandbox import PythonTool
from glassrl.agents.tools import FunctionTool, Tool, ToolFailed, tool_map
from glassrl.errors import GlassrlError
from glassrl.jsonl import as_text
from glassrl.user_code import import_file
from glassrl.worker_pool import CallOutcome, WorkerPool, shared_pool

# name -> constructor with no arguments
BUILTIN_TOOLS: dict[str, Callable[[], Tool]] = {
    "calculator": Calculator,
    "python": PythonTool,
    "search": SearchTool,
    "open_page": OpenPageTool,
}


# A user's tool module gets this long to import in a fresh worker (not counted in a call's limit).
LOAD_TIMEOUT_S = 120.0
# Worker processes of user tools run at once (calls beyond wait for one; the wait counts in their limit).
TOOL_PROCESSES = 8


def build_tools(
    specs: Sequence[str], base_dir: str | Path = ".", *, call_timeout_s: float = 30.0, processes: int = TOOL_PROCESSES
) -> list[Tool]:
    """The tools named by ``specs`` (module docstring), in order; GlassrlError for a bad spec or a repeated name.
    A user's tool runs in a worker (:class:`WorkerTool`) of a pool of ``processes``, each call
    killed past ``call_timeout_s``."""
    tools = [build_tool(spec, base_dir, call_timeout_s=call_timeout_s, processes=processes) for spec in specs]
    try:
        tool_map(tools)
    except ValueError as err:
        raise GlassrlError(f"tools {list(specs)}: {err}") from None
    return tools


def build_tool(
    spec: str, base_dir: str | Path = ".", *, call_timeout_s: float = 30.0, processes: int = TOOL_PROCESSES
) -> Tool:
    """One tool from a built-in name or a ``module:attribute`` / ``file.py:attribute`` spec (a
    :class:`WorkerTool`)."""
    if spec in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[spec]()
    if not spec.rpartition(":")[0] or not spec.rpartition(":")[2]:
        valid = ", ".join(BUILTIN_TOOLS)
        raise GlassrlError(f"tool {spec!r}: not a built-in ({valid}) nor 'module:attribute' or 'file.py:attribute'")
    pool = shared_pool(recycle_after=None, role="tool", size=processes)
    return WorkerTool(spec, str(Path(base_dir).resolve()), pool, call_timeout_s)


class WorkerTool:
    """A user's tool run in a worker process (module docstring): its name, description and
    parameters are read there when it is built; ``call`` sends the arguments there and returns
    the text, or raises :class:`~glassrl.agents.tools.ToolFailed` ("error": it raised,
    exited or crashed; "timeout": killed past ``call_timeout_s``)."""

    def __init__(self, spec: str, base_dir: str, pool: WorkerPool, call_timeout_s: float) -> None:
        self.spec, self.base_dir, self.pool, self.call_timeout_s = spec, base_dir, pool, call_timeout_s
        outcome = self._run(_describe, (spec, base_dir), LOAD_TIMEOUT_S)
        if outcome.status != "ok":
            message = outcome.message.removeprefix("setup: ").removeprefix("GlassrlError: ")
            if not message.startswith(f"tool {spec!r}"):
                message = f"tool {spec!r}: {message}"
            raise GlassrlError(message)
        self.name, self.description, self.parameters = (outcome.value[k] for k in ("name", "description", "parameters"))

    def call(self, arguments: dict[str, Any]) -> str:
        outcome = self._run(_call, (self.spec, self.base_dir, arguments), self.call_timeout_s)
        if outcome.status != "ok":
            raise ToolFailed(outcome.status, outcome.message.removeprefix("setup: "))
        return outcome.value

    def _run(self, fn: Any, args: tuple, timeout_s: float) -> CallOutcome:
        load = (_load, (self.spec, self.base_dir))
        return self.pool.call(fn, args, timeout_s, setup=load, setup_timeout_s=LOAD_TIMEOUT_S)


# ---------------------------------------------------------------- in the worker process

_LOADED: dict[tuple[str, str], Tool] = {}  # (spec, base_dir) -> the tool, made once per worker
_DIRECTORIES: list[str] = []  # of the tool files loaded: kept on sys.path, which the pool resets per call


def _load(spec: str, base_dir: str) -> None:
    if (spec, base_dir) not in _LOADED:
        _LOADED[spec, base_dir] = _as_tool(spec, load_attribute(spec, base_dir))
        keep_on_path(spec, base_dir)


def keep_on_path(spec: str, base_dir: str) -> None:
    """A ``file.py:attribute`` spec's directory, put back on ``sys.path`` by :func:`on_path` at each call."""
    where = spec.rpartition(":")[0]
    if where.endswith(".py"):
        _DIRECTORIES.append(str((Path(base_dir) / where).resolve().parent))


def on_path() -> None:
    """A tool may import its file's neighbours when called, as when it was loaded."""
    for directory in _DIRECTORIES:
        if directory not in sys.path:
            sys.path.insert(0, directory)


def _describe(spec: str, base_dir: str) -> dict[str, Any]:
    tool = _LOADED[spec, base_dir]
    return {"name": str(tool.name), "description": str(tool.description), "parameters": tool.parameters}


def _call(spec: str, base_dir: str, arguments: dict[str, Any]) -> str:
    on_path()
    return as_text(str(_LOADED[spec, base_dir].call(arguments)))


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
