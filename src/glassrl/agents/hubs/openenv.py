"""OpenEnv (PyPI ``openenv-core``, ``glassrl[openenv]``): an OpenEnv server's episodes as glassrl environments.

An OpenEnv environment is a server (openenv/core/env_server/http_server.py: ``POST /reset``,
``POST /step``, and ``WS /ws`` for a session that keeps its episode, :1299); a client opens one
WebSocket session per episode and sends ``reset`` then ``step`` messages
(openenv/core/env_client.py:372 and :392). ``GenericEnvClient`` (openenv/core/generic_client.py)
speaks it with plain dictionaries, whatever the environment's Action and Observation types, and
its ``.sync()`` wrapper runs the session on its own event loop (openenv/core/sync_client.py), so a
step may be called from glassrl's worker threads.

:class:`OpenEnvEnvironment` maps an episode onto glassrl's protocol (agents/environment.py):

- ``reset(record)``: a fresh session, ``reset(**record.metadata["openenv_reset"])`` (e.g. a seed;
  nothing when the row has none). The model reads the record's prompt: the reset observation is
  not shown to it (put what it says in the data);
- ``step(text, calls)``: the action is ``{action_field: text}`` (the Action model's text field: the
  echo environment's ``message``); the observation's ``observation_field`` (all of it as JSON when
  None) is the text the model reads next; the step's reward is reward part ``openenv`` on the
  turn's tokens; ``done`` ends the episode and closes the session (so does ``max_turns``: the
  session is closed when the environment is collected).

Config: a file of your own, ``rollout.agent.environment: my_env.py:make`` with::

    from glassrl.agents.hubs.openenv import OpenEnvEnvironment
    def make():
        return OpenEnvEnvironment("http://127.0.0.1:8000", action_field="message", observation_field="echoed_message")
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from typing import Any

from glassrl.agents.environment import StepResult
from glassrl.agents.hubs import require
from glassrl.agents.tools import Tool, ToolCall
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError

REWARD_PART = "openenv"
RESET_FIELD = "openenv_reset"  # a record's keyword arguments to reset (a mapping), optional


def _close(client: Any) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - a session that is already gone is closed
        pass


class OpenEnvEnvironment:
    """One OpenEnv session per episode (module docstring); no tools of glassrl's."""

    tools: Sequence[Tool] = ()

    def __init__(
        self,
        base_url: str,
        *,
        action_field: str = "message",
        observation_field: str | None = None,
        message_timeout_s: float = 60.0,
    ) -> None:
        self.generic = require("openenv.core.generic_client", "openenv", "openenv-core").GenericEnvClient
        self.base_url, self.action_field, self.observation_field = base_url, action_field, observation_field
        self.message_timeout_s = message_timeout_s
        self.client: Any = None
        self._finalizer: weakref.finalize | None = None

    def reset(self, record: PromptRecord) -> None:
        self._end()
        kwargs = record.metadata.get(RESET_FIELD) or {}
        if not isinstance(kwargs, dict):
            raise GlassrlError(f"{record.source or 'a record'}: {RESET_FIELD} = {kwargs!r}: expected a mapping")
        self.client = self.generic(base_url=self.base_url, message_timeout_s=self.message_timeout_s).sync()
        self._finalizer = weakref.finalize(self, _close, self.client)
        try:
            self.client.connect()
            self.client.reset(**kwargs)
        except (OSError, ConnectionError, TimeoutError) as err:
            self._end()
            raise GlassrlError(f"OpenEnv server {self.base_url}: {type(err).__name__}: {err}") from None

    def step(self, text: str, calls: Sequence[ToolCall]) -> StepResult:
        assert self.client is not None, "step before reset"
        result = self.client.step({self.action_field: text})
        observation = result.observation
        if self.observation_field is None:
            seen = json.dumps(observation, ensure_ascii=False, sort_keys=True)
        elif self.observation_field not in observation:
            raise GlassrlError(
                f"OpenEnv server {self.base_url}: the observation has no field {self.observation_field!r}; "
                f"it has {', '.join(sorted(observation))}"
            )
        else:
            seen = str(observation[self.observation_field])
        reward = float(result.reward or 0.0)
        if result.done:
            self._end()
            return StepResult(done=True, reward_parts={REWARD_PART: reward})
        return StepResult(observations=(seen,), reward_parts={REWARD_PART: reward})

    def _end(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self.client, self._finalizer = None, None
