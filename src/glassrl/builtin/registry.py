"""The embedded models by their ``model.actor`` name: the function that finds (or first builds) each."""

from __future__ import annotations

from glassrl.builtin.agent_model import AGENT_MODEL, ensure_agent_model
from glassrl.builtin.default_model import ensure_default_model
from glassrl.builtin.reasoning_gym_model import RG_MODEL, ensure_reasoning_gym_model
from glassrl.builtin.research_model import RESEARCH_MODEL, ensure_research_model

BUILTIN_MODELS = {
    "default": ensure_default_model,
    AGENT_MODEL: ensure_agent_model,
    RESEARCH_MODEL: ensure_research_model,
    RG_MODEL: ensure_reasoning_gym_model,
}
# model.actor name -> the `glassrl init-model` flags that rebuild it
REBUILD = {
    "default": "--force",
    AGENT_MODEL: "--force --agent",
    RESEARCH_MODEL: "--force --agent research",
    RG_MODEL: "--force --agent reasoning-gym",
}
