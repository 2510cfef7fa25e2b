"""The environments of the bundled agentic tasks: a task's tools (named in its module) made real.

:func:`environment_factory` also loads a user's environment by ``module:function`` or
``file.py:Class`` (``rollout.agent.environment``).

The task modules (:mod:`glassrl.data.tasks.tool_add`, :mod:`glassrl.data.tasks.research`) sit
below the rollout layer and name their tools as strings (``TOOLS``); this module builds the
:class:`ToolEnvironment` each episode of such a task runs in. A research episode brings its own
small web (:class:`ResearchEnvironment`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from glassrl.agents.corpus import Corpus, OpenPageTool, Page, RankedSearchTool
from glassrl.agents.environment import Environment, ToolEnvironment
from glassrl.agents.isolated import DEFAULT_TIMEOUT_S, EnvironmentWorkers, make_checked
from glassrl.agents.registry import build_tools, load_attribute
from glassrl.agents.tools import tool_map
from glassrl.data.records import PromptRecord
from glassrl.data.tasks import research, tool_add
from glassrl.errors import GlassrlError


def _tool_add() -> Environment:
    return ToolEnvironment(build_tools(tool_add.TOOLS), valid_call_reward=tool_add.VALID_CALL_REWARD)


class ResearchEnvironment(ToolEnvironment):
    """``search`` and ``open_page`` over the episode's own four pages (glassrl.data.tasks.research.pages),
    made at ``reset`` from the record's episode. Search results show rank, title and url, in the
    episode's seeded ranking (:class:`RankedSearchTool`): the official release is not always
    first, and nothing in a result says which kind of page it is."""

    def __init__(self) -> None:
        super().__init__(self._tools(research.DIALOGUE))

    @staticmethod
    def _tools(episode: research.Episode) -> tuple[RankedSearchTool, OpenPageTool]:
        corpus = Corpus(tuple(Page(**page) for page in research.pages(episode)))
        # Title and url per result, title and text per page: the shortest transcript that holds the story.
        return RankedSearchTool(corpus, k=len(research.KINDS), snippet_chars=0), OpenPageTool(corpus, url_line=False)

    def reset(self, record: PromptRecord) -> None:
        super().reset(record)
        self.tools = self._tools(research.episode_of(record))
        self.by_name = tool_map(self.tools)


def _research() -> Environment:
    return ResearchEnvironment()


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


def environment_factory(
    spec: str, base_dir: str | Path = ".", *, in_process: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Callable[[], Environment]:
    """A fresh environment per call, from ``spec``: a bundled task's name (tool-add, research) or
    ``module:attribute`` / ``file.py:attribute`` (:func:`~glassrl.agents.registry.load_attribute`)
    naming a class or a function that takes no argument and returns an environment. One
    environment is made here, so that a bad spec fails at once (GlassrlError naming it) rather
    than in the middle of a rollout. The user's environment runs in worker processes, one per
    episode (:class:`~glassrl.agents.isolated.EnvironmentWorkers`, each ``reset``/``step`` within
    ``timeout_s``), unless ``in_process`` (trusted code: faster, and its crash is the caller's)."""
    if ":" not in spec:
        return task_environment(spec)
    if not in_process:
        return EnvironmentWorkers(spec, base_dir, timeout_s=timeout_s)
    target: Any = load_attribute(spec, base_dir, "environment")
    if not callable(target):
        raise GlassrlError(f"environment {spec!r}: expected a class or a function, got {type(target).__name__}")
    make_checked(spec, target)
    return target
