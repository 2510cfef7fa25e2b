"""The OpenAI-compatible endpoint a user's agent program talks to during rollouts (docs/agentic.md,
"Bring your agent").

- :mod:`.engine`: :class:`EndpointRolloutEngine`, a RolloutEngine whose episodes are the agent (a
  function or a command), each with its own base URL;
- :mod:`.server`: ``/v1/chat/completions`` and ``/v1/models`` on 127.0.0.1 (FastAPI, uvicorn);
- :mod:`.session`: one rollout's answer to a request;
- :mod:`.render`: messages -> ids, a sampled turn -> an OpenAI message;
- :mod:`.capture`: every call token-exact, chained into samples (the rewrite rule);
- :mod:`.batcher`: the agents' calls sampled in lockstep batches by the turn sampler.
"""

from glassrl.agents.endpoint.capture import REWRITES
from glassrl.agents.endpoint.engine import EndpointRolloutEngine, task_of

__all__ = ["REWRITES", "EndpointRolloutEngine", "task_of"]
