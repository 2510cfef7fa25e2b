"""Call user code with a per-call timeout that works from any thread.

Why a worker process: ``signal.alarm`` works only in the main thread, and the
trainer may score from another one. A thread-based timeout can stop *waiting*,
but it cannot stop the call: a hung user function would keep running (and
holding its thread, its memory and perhaps the GIL) for the rest of the run.
A process can be killed. So the function runs in a worker process; the caller
waits on a pipe with ``poll(timeout_s)``, which any thread may do, and on a
timeout the worker is killed and replaced.

Workers are persistent: a pool starts each worker once and reuses it, so a call
costs a pickle round trip, not a process start. A worker that timed out or
died is replaced by a fresh one on its next use.

Workers are started with ``subprocess`` (``python -c`` running :func:`_worker_main`)
and talk over two pipes. Not ``multiprocessing``: its "fork" copies the trainer,
and forking a process that already runs torch's and OpenMP's threads can
deadlock the child; its "spawn" and "forkserver" re-import the caller's
``__main__``, which would re-run a user's training script that lacks an
``if __name__ == "__main__"`` guard. A fresh interpreter importing only glassrl
has neither problem. (POSIX only: the pipes are passed with ``pass_fds``.)

The function and its arguments must be picklable (a module-level function:
it is pickled by name and imported in the worker). Each call sends the
caller's ``sys.path`` along, so a module the caller can import, the worker can
import too. The worker ignores Ctrl-C (the trainer handles it) and exits when
its pipe closes.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

# Starting a worker (interpreter start plus imports) is not user time; a
# generous bound only catches a worker that cannot start at all.
_START_TIMEOUT_S = 120.0
# The worker's first act: find glassrl where the caller found it, then serve.
_BOOTSTRAP = (
    "import sys; sys.path[:0] = sys.argv[3:]; "
    "from glassrl.rewards.timeout import _worker_main; _worker_main(int(sys.argv[1]), int(sys.argv[2]))"
)


@dataclass(frozen=True)
class CallOutcome:
    """What became of one call: its return value, or why there is none."""

    status: Literal["ok", "timeout", "error"]
    value: Any = None
    message: str = ""


def _worker_main(read_fd: int, write_fd: int) -> None:
    """Worker loop: receive pickled (sys.path, pickled (fn, args)), send back a pickled outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    outbox.send_bytes(b"ready")
    while True:
        try:
            sys_path, payload = pickle.loads(inbox.recv_bytes())
        except EOFError:  # the caller closed the pipe or exited
            return
        sys.path[:] = sys_path
        try:
            fn, args = pickle.loads(payload)
            reply = pickle.dumps(("ok", fn(*args)))
        except BaseException as err:  # noqa: BLE001 - SystemExit from user code is an error result, not our exit
            reply = pickle.dumps(("error", f"{type(err).__name__}: {err}"))
        outbox.send_bytes(reply)


class _Worker:
    def __init__(self) -> None:
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(to_worker_r), str(from_worker_w), *sys.path],
                pass_fds=(to_worker_r, from_worker_w),
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(to_worker_r)
            os.close(from_worker_w)
        self.inbox = Connection(from_worker_r, writable=False)
        self.outbox = Connection(to_worker_w, readable=False)
        if not self.inbox.poll(_START_TIMEOUT_S):
            self.kill()
            raise OSError(f"reward worker did not start within {_START_TIMEOUT_S:g} s")
        try:
            self.inbox.recv_bytes()
        except EOFError:
            self.kill()
            raise OSError(f"reward worker exited while starting (exit code {self.process.returncode})") from None

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.inbox.close()
        self.outbox.close()


class WorkerPool:
    """``size`` persistent worker processes; ``call`` may be used from many threads at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        # None = a slot whose worker has not been started (or was killed); started on use.
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(size):
            self._idle.put(None)

    def call(self, fn: Callable[..., Any], args: Sequence[Any], timeout_s: float) -> CallOutcome:
        """Run ``fn(*args)`` in a worker; give up after ``timeout_s`` seconds of its run time."""
        try:
            payload = pickle.dumps((fn, tuple(args)))
        except Exception as err:  # noqa: BLE001 - an unpicklable function is this call's error
            return CallOutcome("error", message=f"cannot send the call to a worker: {type(err).__name__}: {err}")
        worker = self._idle.get()
        try:
            if worker is not None and not worker.alive():
                worker.kill()
                worker = None
            if worker is None:
                worker = _Worker()
            worker.outbox.send_bytes(pickle.dumps((list(sys.path), payload)))
            if not worker.inbox.poll(timeout_s):
                worker.kill()
                worker = None
                return CallOutcome("timeout", message=f"no result after {timeout_s:g} s (worker killed)")
            status, value = pickle.loads(worker.inbox.recv_bytes())
        except (EOFError, OSError) as err:
            if worker is not None:
                worker.kill()
                code = worker.process.returncode
                worker = None
                return CallOutcome("error", message=f"reward worker died (exit code {code})")
            return CallOutcome("error", message=f"{type(err).__name__}: {err}")
        except Exception as err:  # noqa: BLE001 - the value came back but cannot be unpickled here
            return CallOutcome("error", message=f"cannot read the result: {type(err).__name__}: {err}")
        finally:
            self._idle.put(worker)
        if status == "ok":
            return CallOutcome("ok", value=value)
        return CallOutcome("error", message=value)

    def close(self) -> None:
        """Stop the idle workers (a call in flight keeps its worker until it returns)."""
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                return
            if worker is not None:
                worker.kill()


_default_pool: WorkerPool | None = None
_default_lock = threading.Lock()


def default_pool() -> WorkerPool:
    """The process-wide pool shared by user-function sources (one worker per core, at most 4)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = WorkerPool(min(4, os.cpu_count() or 1))
            atexit.register(_default_pool.close)
        return _default_pool


def call_with_timeout(fn: Callable[..., Any], args: Sequence[Any], timeout_s: float) -> CallOutcome:
    """Run ``fn(*args)`` in the default pool with a timeout; safe from any thread.

    Returns ``ok`` with the value, ``timeout`` (the worker was killed and will be
    replaced), or ``error`` with the exception's type and message.
    """
    return default_pool().call(fn, args, timeout_s)
