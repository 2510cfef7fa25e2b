"""The environments of the bundled agentic tasks: a task's tools (named in its module) made real.

:func:`environment_factory` also loads a user's environment by ``module:function`` or
``file.py:Class`` (``rollout.agent.environment``).

The task modules (:mod:`glassrl.data.tasks.tool_add`, :mod:`glassrl.data.tasks.research`) sit
below the rollout layer and name their tools as strings (``TOOLS``); this module builds the
:class:`ToolEnvironment` each episode of such a task runs in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from glassrl.data.tasks import research, tool_add
from glassrl.errors import GlassrlError
from glassrl.rollout.agent.environment import Environment, ToolEnvironment
from glassrl.rollout.agent.registry import build_tools, load_attribute


def _tool_add() -> Environment:
    return ToolEnvironment(build_tools(tool_add.TOOLS), valid_call_reward=tool_add.VALID_CALL_REWARD)


def _research() -> Environment:
    return ToolEnvironment(build_tools(research.TOOLS))


# task name -> a fresh environment for one episode
TASK_ENVIRONMENTS: dict[str, Callable[[], Environment]] = {
    tool_add.NAME: _tool_add,
    research.NAME: _research,
}


def task_environment(name: str) -> Callable[[], Environment]:
    """The environment factory of the bundled task ``name``; GlassrlError listing the agentic tasks."""
    if name not in TASK_ENVIRONMENTS:
        raise GlassrlError(f"task {name!r} has no environment; agentic tasks: {', '.join(TASK_ENVIRONMENTS)}")
    return TASK_ENVIRONMENTS[name]


def environment_factory(spec: str, base_dir: str | Path = ".") -> Callable[[], Environment]:
    """A fresh environment per call, from ``spec``: a bundled task's name (tool-add, research) or
    ``module:attribute`` / ``file.py:attribute`` (:func:`~glassrl.rollout.agent.registry.load_attribute`)
    naming a class or a function that takes no argument and returns an environment. One
    environment is made here, so that a bad spec fails at once (GlassrlError naming it) rather
    than in the middle of a rollout."""
    if ":" not in spec:
        return task_environment(spec)
    target: Any = load_attribute(spec, base_dir, "environment")
    if not callable(target):
        raise GlassrlError(f"environment {spec!r}: expected a class or a function, got {type(target).__name__}")
    try:
        made = target()
    except Exception as err:  # noqa: BLE001 - the user's code
        raise GlassrlError(f"environment {spec!r}: calling it raised {type(err).__name__}: {err}") from None
    if not isinstance(made, Environment):
        raise GlassrlError(
            f"environment {spec!r}: made a {type(made).__name__}, not an environment "
            "(tools, reset(record), step(text, calls))"
        )
    return target
