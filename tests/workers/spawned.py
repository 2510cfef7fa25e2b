"""Ranks in processes of their own (torch.multiprocessing spawn), joined with a deadline.

``mp.spawn(..., join=True)`` waits forever when ranks wait in a collective that never completes
(ranks that decided differently, a rendezvous gone wrong): a whole test session would then hang
until CI kills it, saying nothing. :func:`spawn_ranks` fails the test after ``hang_s`` instead,
and the failure shows where each rank was: every rank registers faulthandler on SIGUSR1, and
the parent signals the ranks before it kills them, so their Python stacks (all threads) are in
the message.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.multiprocessing as mp

HANG_S = 300  # every multi-rank run here takes 10–30 s on 2 loaded cores


def _stacks_file(out: Path, rank: int) -> Path:
    return Path(out) / f"rank{rank}.stacks"


def _stack(out: Path, rank: int, alive: bool) -> str:
    """What rank ``rank`` wrote on SIGUSR1; a rank still starting has no file yet."""
    if not alive:
        return "(finished)"
    path = _stacks_file(out, rank)
    return path.read_text() if path.exists() else "(no stack: still starting)"


def _armed(rank: int, fn: Callable, out: str, args: tuple) -> None:
    """Rank ``rank``: dump every thread's stack to its file on SIGUSR1, then run ``fn(rank, *args)``."""
    with open(_stacks_file(Path(out), rank), "w") as stacks:
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        fn(rank, *args)


def spawn_ranks(fn: Callable, args: tuple, nprocs: int, out: Path, hang_s: float = HANG_S) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` spawned processes (``fn`` importable by the children) and
    wait for them; a rank's exception fails the test as ``mp.spawn`` raises it; ranks still running
    after ``hang_s`` fail it with their stacks."""
    os.environ["OMP_NUM_THREADS"] = "1"
    ranks = mp.spawn(_armed, args=(fn, str(out), args), nprocs=nprocs, join=False)
    deadline = time.monotonic() + hang_s
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            running = [process.is_alive() for process in ranks.processes]
            for process, alive in zip(ranks.processes, running):
                if alive:
                    os.kill(process.pid, signal.SIGUSR1)
            time.sleep(2)  # faulthandler writes from a signal handler: give it a moment
            for process in ranks.processes:
                process.kill()
            stacks = "\n".join(f"--- rank {r} ---\n{_stack(out, r, alive)}" for r, alive in enumerate(running))
            pytest.fail(f"the ranks still run after {hang_s:g} s (waiting in a collective?); their stacks:\n{stacks}")
