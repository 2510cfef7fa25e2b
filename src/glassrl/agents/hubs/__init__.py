"""Adapters to the environment hubs the field shares (docs/agentic.md, "Bring your environment").

Each adapter is one module and one optional extra; its package is imported when the adapter is
used, not when glassrl is, so a missing extra is one GlassrlError naming the ``pip install``:

- :mod:`.reasoning_gym`: reasoning-gym's procedural tasks (``glassrl[reasoning-gym]``): prompt
  records with the entry kept, its ``score_answer`` as a reward function, and a one-turn environment;
- :mod:`.skyrl`: skyrl-gym's text environments (``glassrl[skyrl-gym]``), ``init``/``step`` per turn;
- :mod:`.openenv`: an OpenEnv server (``glassrl[openenv]``), ``reset``/``step`` over its WebSocket;
- :mod:`.verifiers`: a verifiers 0.4.0 environment (``glassrl[verifiers]``), its own episode run against
  glassrl's OpenAI-compatible endpoint, its rewards returned.

Every adapter but verifiers' is a :class:`~glassrl.agents.environment.Environment`
(``rollout.agent.environment``), so ``glassrl audit`` checks it as it checks a bundled task's;
verifiers' is an endpoint agent (``rollout.agent.endpoint.agent``), whose captured calls the audit
checks the same way.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from glassrl.errors import GlassrlError


def require(module: str, extra: str, package: str) -> ModuleType:
    """``module`` imported, or one GlassrlError saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise GlassrlError(
            f"{package} is not installed ({err}): pip install 'glassrl[{extra}]' (or pip install {package})"
        ) from None
