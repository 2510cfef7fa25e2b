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
- :mod:`.tasks`: the environments of the bundled agentic tasks (tool-add, research);
- :mod:`.isolated`: a user's environment in a worker process per episode.

docs/agentic.md describes the whole.
"""

import importlib

# name -> the submodule that defines it. Imported on first use (PEP 562), so that importing one
# submodule does not import them all: a user tool's worker process (glassrl.worker_pool) imports
# .registry and .tools, and must not pay for .loop's torch.
_EXPORTS = {
    "Environment": "environment",
    "StepResult": "environment",
    "ToolEnvironment": "environment",
    "EnvironmentWorkers": "isolated",
    "HermesFormat": "formats",
    "TaggedFormat": "formats",
    "build_call_format": "formats",
    "supports_tools": "formats",
    "AgentRolloutEngine": "loop",
    "HFTurnSampler": "loop",
    "SampledTurn": "loop",
    "TurnSampler": "loop",
    "agent_prompt_ids": "loop",
    "reward_parts": "loop",
    "BUILTIN_TOOLS": "registry",
    "build_tool": "registry",
    "build_tools": "registry",
    "TASK_ENVIRONMENTS": "tasks",
    "environment_factory": "tasks",
    "task_environment": "tasks",
    "FunctionTool": "tools",
    "Tool": "tools",
    "ToolCall": "tools",
    "ToolResult": "tools",
    "run_call": "tools",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


__all__ = [
    "BUILTIN_TOOLS",
    "TASK_ENVIRONMENTS",
    "AgentRolloutEngine",
    "Environment",
    "EnvironmentWorkers",
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
