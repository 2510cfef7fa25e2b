"""The environments of the bundled agentic tasks: a task's tools (named in its module) made real.

The task modules (:mod:`glassrl.data.tasks.tool_add`, :mod:`glassrl.data.tasks.research`) sit
below the rollout layer and name their tools as strings (``TOOLS``); this module builds the
:class:`ToolEnvironment` each episode of such a task runs in.
"""

from __future__ import annotations

from collections.abc import Callable

from glassrl.data.tasks import research, tool_add
from glassrl.errors import GlassrlError
from glassrl.rollout.agent.environment import Environment, ToolEnvironment
from glassrl.rollout.agent.registry import build_tools


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
