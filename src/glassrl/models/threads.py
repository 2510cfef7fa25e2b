"""Intra-op threads: as many as this process can actually get, not as many cores as exist.

torch starts one intra-op thread per core present. On a machine that other jobs share, a
parallel op waits for its slowest thread, and a thread that has to share its core with
another process makes every op as slow as that share: issue 14 measured the demo's step
going from 0.3 s to 5–10 s while another job ran on the 2 cores, and GAE's fast path
falling from 15× to 1.7× verl's loop. One thread that runs is faster than two that wait.

:func:`choose_threads` decides, in this order:

1. ``GLASSRL_THREADS`` = N (N ≥ 1): N, whatever the load;
2. ``OMP_NUM_THREADS`` = N set by the user: N (torch reads it too; we do not override it);
3. otherwise the cores free for us: the cores this process may run on (its CPU affinity,
   capped by a cgroup CPU quota where there is one) minus the load that *other* processes put
   on them (the 1-minute load average minus this process's own recent CPU use), rounded
   to the nearest whole core, at least 1.

The load average lags (it is a 1-minute moving average) and counts runnable threads, not
cores used; the choice is made once, when training starts (:func:`set_threads`). Results
are reproducible for a given thread count; set ``GLASSRL_THREADS`` to pin it.
"""

from __future__ import annotations

import math
import os
import resource
import time
from pathlib import Path

import torch

from glassrl.errors import GlassrlError

ENV = "GLASSRL_THREADS"
_START = time.monotonic()  # import time: close enough to the process start for the own-load estimate


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


def own_load() -> float:
    """Cores this process kept busy, averaged as the 1-minute load average weighs them: CPU seconds
    used over max(60 s, its age). For a process busy at a constant rate u since its start this is
    about u·(1 − e^(−age/60 s)), the load average's own weight on it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) / max(60.0, time.monotonic() - _START)


def free_cores(cores: int, load: float, own: float) -> int:
    """Whole cores left free of ``cores`` when other processes put ``load - own`` on them; at least 1."""
    others = max(0.0, load - own)
    return max(1, min(cores, math.floor(cores - others + 0.5)))


def choose_threads(environ: dict[str, str] | None = None) -> tuple[int, str]:
    """(threads, why): the rule of the module docstring; ``why`` is one line for the console."""
    environ = os.environ if environ is None else environ
    for name in (ENV, "OMP_NUM_THREADS"):
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise GlassrlError(f"{name}={value!r}: must be a whole number of threads, at least 1")
            return int(value), f"{name}={value}"
    cores, load, own = usable_cores(), os.getloadavg()[0], own_load()
    threads = free_cores(cores, load, own)
    return threads, f"{cores} usable cores, load average {load:.2f} ({own:.2f} of it this process's)"


def set_threads(environ: dict[str, str] | None = None) -> tuple[int, str]:
    """:func:`choose_threads`, applied with ``torch.set_num_threads``; returns what it chose and why."""
    threads, why = choose_threads(environ)
    torch.set_num_threads(threads)
    return threads, why
