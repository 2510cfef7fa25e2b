"""skyrl-gym (PyPI ``skyrl-gym``, ``glassrl[skyrl-gym]``): its text environments as glassrl environments.

skyrl-gym's environments follow the Gymnasium API for text (skyrl_gym/envs/base_text_env.py): one is
made per episode by ``skyrl_gym.make(id, env_config=, extras=)`` (skyrl_gym/envs/registration.py:233;
the ids are ``skyrl_gym.registry``'s keys, :139; ``extras`` is the dataset row:
``reward_spec.ground_truth``, ``extra_info``, as the gsm8k environment reads them,
skyrl_gym/envs/gsm8k/env.py), ``init(prompt)`` returns the prompt the
model starts from, and each ``step(action)`` takes the model's turn text and returns
``{"observations": [messages], "reward", "done", "metadata"}`` (BaseTextEnvStepOutput).

:class:`SkyRLEnvironment` maps that onto glassrl's protocol (agents/environment.py):

- ``reset(record)``: ``make`` with ``extras`` = the record's metadata, ``reward_spec.ground_truth``
  the record's answer unless the row has its own ``reward_spec``; then ``init`` on the record's
  prompt. An environment whose ``init`` changes the prompt is refused (one GlassrlError): glassrl
  renders the record's prompt, and training on another context than the one sampled is the
  re-tokenisation drift ``glassrl audit`` exists to catch;
- ``step(text, calls)``: ``step(text)``; the observations' contents are the texts the model reads
  next (rendered as the call format renders tool results), the turn's reward is reward part
  ``skyrl`` on that turn's tokens, ``done`` ends the episode (and ``close``s the environment).

Config: ``rollout.agent.environment: glassrl.agents.hubs.skyrl:gsm8k`` (or ``:gsm8k_multi_turn``),
or a file of your own: ``def make(): return SkyRLEnvironment("text2sql", env_config={...})``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from glassrl.agents.environment import StepResult
from glassrl.agents.hubs import require
from glassrl.agents.tools import Tool, ToolCall
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError

REWARD_PART = "skyrl"


def _messages(prompt: Any) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


class SkyRLEnvironment:
    """A skyrl-gym environment by its registered id (module docstring); no tools of glassrl's."""

    tools: Sequence[Tool] = ()

    def __init__(self, env_id: str, env_config: Mapping[str, Any] | None = None) -> None:
        self.skyrl_gym = require("skyrl_gym", "skyrl-gym", "skyrl-gym")
        if env_id not in self.skyrl_gym.registry:
            known = ", ".join(sorted(self.skyrl_gym.registry))
            raise GlassrlError(f"skyrl-gym environment {env_id!r}: not registered; registered: {known}")
        self.env_id = env_id
        self.env_config = dict(env_config or {})
        self.env: Any = None

    def reset(self, record: PromptRecord) -> None:
        extras = dict(record.metadata)
        if "reward_spec" not in extras:
            extras["reward_spec"] = {"ground_truth": record.answer}
        extras.setdefault("extra_info", {})
        self.env = self.skyrl_gym.make(self.env_id, env_config=self.env_config, extras=extras)
        given = _messages(record.prompt)
        prompt, _ = self.env.init(given)
        if _messages(prompt) != given:
            raise GlassrlError(
                f"skyrl-gym environment {self.env_id!r} rewrote the prompt of {record.source or 'a record'} in "
                "init(); glassrl trains on the record's prompt: put the rewritten prompt in the data instead"
            )

    def step(self, text: str, calls: Sequence[ToolCall]) -> StepResult:
        assert self.env is not None, "step before reset"
        out = self.env.step(text)
        done = bool(out["done"])
        observations = tuple(str(m["content"]) for m in out.get("observations") or ())
        if done:
            self.env.close()
        return StepResult(observations=observations, done=done, reward_parts={REWARD_PART: float(out["reward"])})


def gsm8k() -> SkyRLEnvironment:
    """skyrl-gym's ``gsm8k``: one turn, 1 for ``#### ANSWER`` equal to the ground truth."""
    return SkyRLEnvironment("gsm8k")


def gsm8k_multi_turn() -> SkyRLEnvironment:
    """skyrl-gym's ``gsm8k_multi_turn``: up to 5 turns (``extra_info.max_turns``), asked again until right."""
    return SkyRLEnvironment("gsm8k_multi_turn")
