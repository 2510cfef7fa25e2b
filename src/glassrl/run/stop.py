"""A stop asked for by the user (Ctrl-C: SIGINT) or by a scheduler (SLURM, Kubernetes: SIGTERM,
then SIGKILL once a grace period is over), ending in one line instead of a traceback.

    with stop.handling():                 # SIGINT and SIGTERM are ours while the block runs
        with stop.graceful():             # a training loop: the first signal only asks to stop
            for step in ...:
                if stop.requested():      # checked between steps: save, then raise Stopped
                    ...
                train_one_step()

- Inside :func:`graceful`, the first signal sets :func:`requested` and says on stderr what comes
  next: the run finishes the step it is in (and writes a checkpoint, where the run has them),
  then stops. A second signal abandons the step at once: :class:`Interrupted` is raised wherever
  the main thread is (a checkpoint being written is removed, as after a failed write).
- Outside it (loading a model, starting workers), a signal raises :class:`Interrupted` at once.
- :class:`Interrupted` is a KeyboardInterrupt, so clean-up written for Ctrl-C runs for SIGTERM too.
- A command that stops says one line naming the step and how to go on (:class:`Stopped`, printed
  by glassrl.cli), exit code 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a
  shell reports a process ended by that signal.

Signal handlers belong to the main thread: elsewhere (a run started from a worker thread)
:func:`handling` changes nothing and the signals keep Python's default behaviour. A library that
installs its own handler while the block runs (``ray.init`` sets one for SIGTERM that calls
``sys.exit``) is overruled by a nested :func:`handling`, which restores it on leaving.
"""

from __future__ import annotations

import os
import shlex
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A signal that ends the current work at once (see the module docstring)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stopped(Exception):
    """A run that stopped on a signal: ``str(self)`` is the one line to print, ``exit_code`` 128 + signal."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class _State:
    graceful = 0  # depth of graceful() blocks
    requested: int | None = None  # the signal that asked for a stop (inside graceful)


_state = _State()


def requested() -> int | None:
    """The number of the signal that asked the run to stop when its step ends, or None."""
    return _state.requested


def name(signum: int) -> str:
    return signal.Signals(signum).name


def _handle(signum: int, frame) -> None:
    if _state.graceful and _state.requested is None:
        _state.requested = signum
        again = "Ctrl-C" if signum == signal.SIGINT else name(signum)
        os.write(2, f"glassrl: {name(signum)}: stopping when this step ends; {again} again stops at once\n".encode())
        return
    raise Interrupted(signum)


@contextmanager
def handling() -> Iterator[None]:
    """SIGINT and SIGTERM handled as the module docstring says while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, _handle) for number in SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def graceful() -> Iterator[None]:
    """A block in which the first signal asks for a stop at the end of the step (:func:`requested`)."""
    if _state.graceful == 0:
        _state.requested = None
    _state.graceful += 1
    try:
        yield
    finally:
        _state.graceful -= 1


def resume_line(last: Path | None, step: int, config: Path, why: str | None = None) -> str:
    """The line a stopped ``glassrl train`` ends with: the step of ``last`` (the checkpoint to go on
    from; ``step`` is the last step finished), why that is not ``step`` when it is not, and the
    command that goes on."""
    command = f"glassrl train {shlex.quote(str(config))}"
    if last is None:
        because = f" ({why})" if why else ""
        return f"stopped at step {step}, before any checkpoint{because}; nothing to resume: start again with: {command}"
    at = int(last.name.removeprefix("step_"))
    where = f"stopped at step {at}" if why is None else f"stopped at step {at}, the last checkpoint ({why})"
    return f"{where}; resume with: {command} --resume"
