"""The cores this process may use, and the one rule for counts that become threads or processes.

A base module: the trainers' ``threads`` (glassrl.models.threads), the worker pools of reward
functions and user tools (glassrl.worker_pool) and the rollout's tool threads (glassrl.rl.build)
all read it.

The rule (docs/reliability.md, "Counts that become threads or processes"): a count of threads or
processes that compute is capped at the usable cores (:func:`usable_cores`), and the start-up
line says so; a count of threads that wait is bounded by the work there is. Never an error: more
than the cores only wait for each other (issue 14 measured two threads sharing a core making
every op as slow as the slower), and an absurd count (``threads=1000000``, issue 37) exhausted
the machine's threads: the tokenizer's pool panicked and the process crashed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 ``cpu.max`` quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def _cgroup_quota() -> float | None:
    """cgroup v2 ``cpu.max`` as cores ("max" or no file: None)."""
    try:
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) / int(period)
