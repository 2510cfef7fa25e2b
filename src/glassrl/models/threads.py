"""Intra-op threads: as many as this process can actually get, not as many cores as exist.

torch starts one intra-op thread per core present. On a machine that other jobs share, a
parallel op waits for its slowest thread, and a thread that has to share its core with
another process makes every op as slow as that share: issue 14 measured the demo's step
going from 0.3 s to 5–10 s while another job ran on the 2 cores, and GAE's fast path
falling from 15× to 1.7× verl's loop. One thread that runs is faster than two that wait.

The config key ``threads`` (RL, SFT and reward-model configs) is ``auto`` or a count N ≥ 1.
:func:`choose_threads` decides, in this order:

1. ``threads: N``: N;
2. a resumed run under ``auto``: the count the run recorded in its checkpoint (part
   "threads", glassrl.run.state), whatever the load now, so that it computes what the
   run would have computed had it not stopped;
3. ``GLASSRL_THREADS`` = N (N ≥ 1): N;
4. ``OMP_NUM_THREADS`` = N set by the user: N (torch reads it too; we do not override it);
5. otherwise the cores free for us: the cores this process may run on (its CPU affinity,
   capped by a cgroup CPU quota where there is one) minus the load that *other* processes put
   on them (the 1-minute load average minus this process's own recent CPU use), rounded
   to the nearest whole core, at least 1.

Whatever chose it, the count is capped at the usable cores, and the line says so
(glassrl.cores: ``threads=1000000`` made torch start a million OpenMP threads, the tokenizer's
pool panicked and the process crashed).

The load average lags (it is a 1-minute moving average) and counts runnable threads, not
cores used; the choice is made once, when a trainer starts (:func:`set_threads`), and the
console says which count and why (:func:`startup_line`).
"""

from __future__ import annotations

import math
import os
import resource
import time
from typing import Literal

import torch

from glassrl.cores import usable_cores
from glassrl.errors import GlassrlError

ENV = "GLASSRL_THREADS"
AUTO = "auto"
_START = time.monotonic()  # import time: close enough to the process start for the own-load estimate


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


def auto_threads(environ: dict[str, str] | None = None) -> tuple[int, str]:
    """(threads, why) of ``threads: auto`` for a run that recorded none: steps 3–5 of the module docstring."""
    environ = os.environ if environ is None else environ
    for name in (ENV, "OMP_NUM_THREADS"):
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise GlassrlError(f"{name}={value!r}: must be a whole number of threads, at least 1")
            return int(value), f"auto: {name}={value}"
    cores, load, own = usable_cores(), os.getloadavg()[0], own_load()
    threads = free_cores(cores, load, own)
    return (
        threads,
        f"auto: {cores} usable cores, load average {load:.2f} ({own:.2f} of it this process's) → {threads} free",
    )


def choose_threads(
    setting: int | Literal["auto"] = AUTO, recorded: int | None = None, environ: dict[str, str] | None = None
) -> tuple[int, str]:
    """(threads, why): the rule of the module docstring, capped at the usable cores (glassrl.cores:
    ``threads=1000000`` exhausted the machine's threads). ``setting``: the config's ``threads``;
    ``recorded``: the count a resumed run recorded (None for a fresh run, or one that recorded none);
    ``why`` is the parenthesis of the start-up line."""
    threads, why = _choose(setting, recorded, environ)
    cores = usable_cores()
    if threads > cores:
        return cores, f"{why}; capped at the {cores} usable cores: more threads would only wait for each other"
    return threads, why


def _choose(setting: int | Literal["auto"], recorded: int | None, environ: dict[str, str] | None) -> tuple[int, str]:
    if setting != AUTO:
        noted = (
            f"; the run recorded {recorded}: its numbers may differ in the last bits from an unbroken run's"
            if recorded is not None and recorded != setting
            else ""
        )
        return setting, f"threads = {setting}{noted}"
    if recorded is not None:
        now, _ = auto_threads(environ)
        return recorded, f"auto: recorded by the run in its checkpoint (auto would choose {now} now)"
    return auto_threads(environ)


def set_threads(
    setting: int | Literal["auto"] = AUTO, recorded: int | None = None, environ: dict[str, str] | None = None
) -> tuple[int, str]:
    """:func:`choose_threads`, applied with ``torch.set_num_threads``; returns what it chose and why."""
    threads, why = choose_threads(setting, recorded, environ)
    torch.set_num_threads(threads)
    return threads, why


def startup_line(threads: int, why: str) -> str:
    """The console line a trainer prints when it starts: ``threads: 1 (auto: 2 usable cores, …)``."""
    return f"threads: {threads} ({why})"
