"""A run's life in its directory, written once for the RL trainer (glassrl.rl.loop) and the
supervised loop (glassrl.supervised.loop).

    lock = take_lock(out / ".lock", f"output_dir = {out}", console)   # 1. before anything is written
    run = RunCheckpoints(out / "checkpoints", keep=2, every=50, resume=resume, what=f"output_dir = {out}")
    run.check_run_dir()                                                # 3. fresh or resumed
    recorded = run.recorded_threads()                                  # 2. the thread count (set_threads)
    threads = run.threads_part(*set_threads(cfg.threads, recorded.threads))
    restored = run.start([run_config, threads, run.counters, ..., GlobalRNG(...)])   # 3. restore
    for step in ...:
        if signum := stop_requested(run, step - 1): raise Stopped(...)   # 5. a stop between steps
        ...
        if run.due(step, steps): run.save(step)                          # 4. a checkpoint when due

1. the lock (glassrl.run.lock): one run per directory; a lock a dead process left is taken over
   and said so;
2. the thread count (glassrl.models.threads, applied by the caller): a resumed run under ``auto``
   computes with the count its checkpoint recorded (part "threads", glassrl.run.state.Threads),
   not the one the machine's load would choose now;
3. fresh or resumed: a fresh run must not mix with an older run's checkpoints; a resumed one needs
   one, and :meth:`RunCheckpoints.start` restores the latest (the newest that verifies, when
   ``latest`` is gone) into the run's parts (glassrl.run.state.restore), its config compared with
   the one saved in it (state.RunConfig: :func:`change_notes` says which allowed keys changed);
4. a checkpoint every ``every`` steps and at the last (:meth:`RunCheckpoints.due`);
5. Ctrl-C or SIGTERM (glassrl.run.stop) lets the step in progress end; between steps
   :func:`stop_requested` then checkpoints the steps taken since the newest checkpoint, so that the
   resumed run is the one that never stopped, and the caller says its one line.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from glassrl.errors import GlassrlError
from glassrl.files import disk_errors
from glassrl.run import state, stop
from glassrl.run.checkpoint import CheckpointManager
from glassrl.run.lock import RunLock


def take_lock(path: Path, what: str, console: Console) -> RunLock:
    """The run's lock at ``path`` (GlassrlError when another live run holds it, or it cannot be
    written); a stale one taken over is said on ``console``. Released by the caller."""
    with disk_errors(what, path.parent):
        lock = RunLock(path, what)
    if lock.stale:
        console.print(
            f"glassrl: took over a stale lock ({lock.stale}; no process holds it: that run ended without "
            "releasing it, killed or its machine lost)",
            markup=False,
            soft_wrap=True,
        )
    return lock


class RunCheckpoints:
    """A run's checkpoints under ``root`` (glassrl.run.checkpoint), its completed steps (``counters``)
    and the parts each checkpoint holds. ``every``: steps between checkpoints (0: only the last
    step's); ``keep``: how many are kept; ``resume``: continue from the latest; ``what``: the run
    directory named in errors."""

    def __init__(self, root: Path, *, keep: int, every: int, resume: bool, what: str) -> None:
        self.manager = CheckpointManager(root, keep)
        self.every, self.resume, self.what = every, resume, what
        self.counters = state.Counters()
        self.components: list[state.Stateful] = []
        self.saved = 0  # the step of the newest checkpoint (0: none yet)
        self.recorded = state.Recorded(None, None)

    def check_run_dir(self) -> None:
        """A fresh run must not mix with an old one's checkpoints; a resumed run needs one."""
        if not self.resume and self.manager.checkpoints():
            raise GlassrlError(
                f"{self.what} already holds checkpoints: resume with --resume, or choose another output_dir"
            )
        if self.resume and self.manager.latest() is None:
            raise GlassrlError(f"--resume: no checkpoint in {self.manager.root}")

    def recorded_threads(self) -> state.Recorded:
        """The thread count the checkpoint to resume from recorded (nothing for a fresh run)."""
        if self.resume:
            self.recorded = state.recorded_threads(self.manager)
        return self.recorded

    def threads_part(self, count: int, why: str) -> state.Threads:
        """Part "threads" for the count the run computes with; a checkpoint written before glassrl
        recorded the count has none to load."""
        r = self.recorded
        return state.Threads(count, why, required=r.checkpoint is None or r.threads is not None)

    def start(self, components: list[state.Stateful]) -> state.Restored | None:
        """The parts every checkpoint holds (the config first: it is checked first; a state.Counters,
        this one's ``counters``, among them); when resuming, the latest checkpoint loaded into them
        (None for a fresh run)."""
        self.components = components
        if not self.resume:
            return None
        restored = state.restore(self.manager, components)
        self.counters.step = self.saved = restored.step
        return restored

    def due(self, step: int, steps: int) -> bool:
        """A checkpoint is written after ``step`` (of ``steps``)."""
        return bool(self.every and step % self.every == 0) or step == steps

    def save(self, step: int) -> Path:
        """Checkpoint ``step`` (its directory)."""
        self.counters.step = step
        path = state.save(self.manager, step, self.components)
        self.saved = step
        return path


def stop_requested(run: RunCheckpoints | None, step: int) -> int | None:
    """Between steps: the signal that asked the run to stop during step ``step`` (None: go on), the
    steps taken since the newest checkpoint checkpointed first (with ``run``)."""
    signum = stop.requested()
    if signum is not None and run is not None and step > run.saved:
        run.save(step)
    return signum


def change_notes(run_config: state.RunConfig) -> list[str]:
    """The keys a resumed run changed (of those it may change), one line each."""
    return [f"{key} changed on resume: {then!r} -> {now!r}" for key, (then, now) in run_config.changes.items()]
