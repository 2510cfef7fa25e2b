"""Agentic rollouts: multi-turn generation with tools, observations kept in the context.

- :mod:`.tools`: the tool protocol (name, JSON schema, ``call(arguments) -> text``), argument
  checks, calls with time limits;
- :mod:`.registry`: built-in tools by name, the user's by ``module:attribute`` or
  ``path/to/file.py:attribute``;
- :mod:`.environment`: the environment protocol (``reset(record)``, ``step(text, calls)``)
  and :class:`ToolEnvironment`;
- :mod:`.formats`: how a call is written and its result read back (chat template with
  ``tools=``, or the tagged format);
- :mod:`.loop`: :class:`AgentRolloutEngine`, the multi-turn loop;
- :mod:`.sandbox`: the Python executor; :mod:`.calculator`, :mod:`.corpus`: the other built-ins;
- :mod:`.tasks`: the environments of the bundled agentic tasks (tool-add, research).

docs/agentic.md describes the whole.
"""

from glassrl.agents.environment import Environment, StepResult, ToolEnvironment
from glassrl.agents.formats import HermesFormat, TaggedFormat, build_call_format, supports_tools
from glassrl.agents.loop import (
    AgentRolloutEngine,
    HFTurnSampler,
    SampledTurn,
    TurnSampler,
    agent_prompt_ids,
    reward_parts,
)
from glassrl.agents.registry import BUILTIN_TOOLS, build_tool, build_tools
from glassrl.agents.tasks import TASK_ENVIRONMENTS, environment_factory, task_environment
from glassrl.agents.tools import FunctionTool, Tool, ToolCall, ToolResult, run_call

__all__ = [
    "BUILTIN_TOOLS",
    "TASK_ENVIRONMENTS",
    "AgentRolloutEngine",
    "Environment",
    "FunctionTool",
    "HFTurnSampler",
    "HermesFormat",
    "SampledTurn",
    "StepResult",
    "TaggedFormat",
    "Tool",
    "ToolCall",
    "ToolEnvironment",
    "ToolResult",
    "TurnSampler",
    "agent_prompt_ids",
    "build_call_format",
    "build_tool",
    "build_tools",
    "environment_factory",
    "reward_parts",
    "run_call",
    "supports_tools",
    "task_environment",
]
