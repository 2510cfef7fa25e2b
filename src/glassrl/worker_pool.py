"""Run user code in isolated worker processes: a time limit, a memory limit, plain JSON back.

A base module: the reward sources (user reward functions, math-verify, majority vote) and the
agent's user tools (glassrl.agents.registry) run their calls here, each through a pool of
its own; a pool's ``role`` ("reward", "tool") names its workers in every message.

What the caller (the trainer) is kept safe from, and how:

- **A call that hangs.** The caller waits on the worker's pipe with a deadline (``poll``, which
  any thread may do; ``signal.alarm`` works only in the main thread). Past it, the worker's whole
  process group is killed with SIGKILL (the worker, anything it started, its reaper) and the slot
  gets a fresh worker on its next use. A thread-based timeout could stop waiting but not stop the
  call; a process can be killed.
- **A return value that attacks its reader.** Nothing is unpickled in the caller. The worker
  encodes what the function returned as JSON (the function must return plain data: the reward
  sources convert user values to plain numbers and JSON-able details inside the worker, with
  :mod:`glassrl.rewards.plain`), and the caller reads at most ``MAX_REPLY_BYTES`` of it, under the
  same deadline. Arguments travel the other way pickled: the worker may trust the caller.
- **An import that hangs or exits.** A call may carry a ``setup`` (importing the user's module)
  that runs in the worker under its own time limit before the call, once per worker; a setup
  that hangs is a timeout, one that raises or calls ``sys.exit`` an error, one that ends the
  process (``os._exit``) a dead worker: never a hang or an exit of the caller.
- **Memory.** Each worker runs under ``RLIMIT_AS`` = ``memory_limit_mb``, so an allocation past
  it is a ``MemoryError`` in the worker (an error result), not the machine swapping.
- **Slow leaks.** A worker is replaced after ``recycle_after`` calls.
- **State.** A :class:`Lease` holds one worker for a series of calls (an environment's episode).
- **A flood of output.** The worker's stdout and stderr (and those of anything it starts) are pipes
  whose first ``MAX_OUTPUT_BYTES`` per call reach the trainer's streams; the rest is dropped, and
  a line says so (:class:`_CappedOutput`).
- **Orphans.** Each worker leads its own process group (a new session: the terminal's Ctrl-C
  goes to the trainer, which handles it). The pool kills the groups on ``close``, when it is
  garbage-collected, and at interpreter exit (``weakref.finalize``). If the caller dies without
  running them (``kill -9``), each worker's reaper — a small process forked into the worker's
  group at start, blocked reading a pipe whose only write end the caller holds — reads
  end-of-file and kills the group.

Workers are started with ``subprocess`` (``python -c`` running :func:`_worker_main`), not
``multiprocessing``: its "fork" copies the trainer, and forking a process that already runs
torch's and OpenMP's threads can deadlock the child; its "spawn" and "forkserver" re-import the
caller's ``__main__``, which would re-run a user's training script that lacks an
``if __name__ == "__main__"`` guard. A fresh interpreter importing only glassrl has neither
problem. Each call sends the caller's ``sys.path`` along, so a module the caller can import, the
worker can import too. POSIX only (pipes passed with ``pass_fds``, process groups, rlimits).

Messages on the pipes are framed: an 8-byte big-endian length, then the bytes.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import resource
import select
import signal
import struct
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from glassrl.cores import usable_cores

# Starting a worker (interpreter start plus glassrl's imports) is not user time; a generous
# bound only catches a worker that cannot start at all.
_START_TIMEOUT_S = 120.0
# A reply larger than this is refused (details with a whole document in them, or a flood).
MAX_REPLY_BYTES = 16 * 1024 * 1024
# What a call may print: per stream (stdout, stderr), per call; the rest is dropped, said once.
MAX_OUTPUT_BYTES = 64 * 1024
# Long exception messages are cut: a result's message is one line in a log.
_MAX_MESSAGE_CHARS = 2000
# A traceback sent back with an error is cut to its last this many characters (the innermost frames).
_MAX_TRACEBACK_CHARS = 64 * 1024
# Frames in these directories are not the user's: glassrl's own, the standard library, installed packages.
_NOT_USER_CODE = tuple(
    {os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep}
    | {os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")}
)
# A guard against a runaway reward, not a budget: address space, not resident memory, and
# libraries reserve much more than they touch (OpenBLAS per thread, torch's import).
DEFAULT_MEMORY_LIMIT_MB = 16384
DEFAULT_RECYCLE_AFTER = 1000
_HEADER = struct.Struct(">Q")
_BOOTSTRAP = (
    "import sys; sys.path[:0] = sys.argv[6:]; "
    "from glassrl.worker_pool import _worker_main; "
    "_worker_main(*map(int, sys.argv[1:5]), sys.argv[5])"
)

Setup = tuple[Callable[..., Any], Sequence[Any]]


@dataclass(frozen=True)
class CallOutcome:
    """What became of one call: its (JSON-decoded) return value, or why there is none."""

    status: Literal["ok", "timeout", "error"]
    value: Any = None
    message: str = ""
    traceback: str = ""  # an exception's, formatted, when the function raised
    at: str = ""  # "path:line" of its innermost frame in the user's code (:func:`user_frame`), "" when none


class _ReplyTooLarge(Exception):
    pass


def _ended(code: int | None) -> str:
    """How a worker ended, from its exit status: "exit code 0", "killed by SIGSEGV"."""
    if code is None:
        return "it did not exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# ---------------------------------------------------------------- framing


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _send(fd: int, data: bytes) -> None:
    _write_all(fd, _HEADER.pack(len(data)) + data)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """``n`` bytes from ``fd``; EOFError if it closes first, TimeoutError past ``deadline``."""
    chunks, got = [], 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float | None, limit: int | None = None) -> bytes:
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if limit is not None and n > limit:
        raise _ReplyTooLarge(n)
    return _read_exact(fd, n, deadline)


# ---------------------------------------------------------------- the worker's side


def describe_error(err: BaseException) -> str:
    """``"Type: message"`` on one line, cut to a log line's length; safe for any user exception."""
    try:
        text = f"{type(err).__name__}: {err}"
    except Exception:  # noqa: BLE001 - a user exception whose __str__ raises
        text = type(err).__name__
    return " ".join(text.split())[:_MAX_MESSAGE_CHARS]


def user_frame(err: BaseException) -> str:
    """``"path:line"``: the innermost frame of ``err``'s traceback in the user's code (a file, not
    glassrl's, the standard library's or an installed package's); "" when there is none."""
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not f.filename.startswith(_NOT_USER_CODE) and not f.filename.startswith("<")
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _run(payload: bytes) -> tuple[bool, bytes]:
    """Unpickle ``(fn, args)``, call it, and encode the outcome as a JSON reply: (ok, reply). An
    exception's reply carries its traceback and the user's line in it (:func:`user_frame`)."""

    def error(message: str, trace: str = "", at: str = "") -> tuple[bool, bytes]:
        reply = {"status": "error", "message": message, "traceback": trace, "at": at}
        return False, json.dumps(reply, ensure_ascii=False).encode()

    try:
        fn, args = pickle.loads(payload)
        value = fn(*args)
    except BaseException as err:  # noqa: BLE001 - SystemExit from user code is an error result, not our exit
        trace = "".join(traceback.format_exception(err))[-_MAX_TRACEBACK_CHARS:]
        return error(describe_error(err), trace, user_frame(err))
    try:
        data = json.dumps({"status": "ok", "value": value}, allow_nan=False, ensure_ascii=False).encode()
    except BaseException as err:  # noqa: BLE001 - a value that is not plain data, or a MemoryError
        return error(f"the result is not plain data (JSON): {describe_error(err)}")
    if len(data) > MAX_REPLY_BYTES:
        return error(f"the result is {len(data)} bytes of JSON, more than the {MAX_REPLY_BYTES} a reply may hold")
    return True, data


def _start_reaper(lifeline_fd: int) -> None:
    """Fork a process into this group that kills the group when the caller's end of the lifeline closes."""
    if os.fork() != 0:
        return
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Hold nothing but the lifeline (and stderr), so the caller's end-of-file on the
        # worker's reply pipe does not wait for this process.
        os.closerange(3, lifeline_fd)
        os.closerange(lifeline_fd + 1, 1 << 16)
        while os.read(lifeline_fd, 1):
            pass
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


class _CappedOutput:
    """The worker's stdout or stderr (``fd``: 1 or 2, inherited by anything the user's code starts)
    made a pipe; a thread passes at most ``budget`` bytes on to where ``fd`` pointed (the trainer's
    stream) and drops the rest, saying so once. The worker's loop sets ``budget`` at each call."""

    def __init__(self, fd: int, role: str) -> None:
        self.role = role
        self.target = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self.budget = MAX_OUTPUT_BYTES
        threading.Thread(target=self._pump, args=(read_end,), daemon=True).start()

    def _pump(self, read_end: int) -> None:
        while chunk := os.read(read_end, 1 << 16):
            budget = self.budget
            self.budget = budget - len(chunk)
            if budget > 0:
                _write_all(self.target, chunk[:budget])
            if budget >= 0 > self.budget:
                _write_all(
                    self.target,
                    (
                        f"\n[glassrl: a {self.role} call wrote more than {MAX_OUTPUT_BYTES} bytes here; "
                        "the rest is dropped]\n"
                    ).encode(),
                )


def _worker_main(read_fd: int, write_fd: int, lifeline_fd: int, memory_limit_mb: int, role: str) -> None:
    """Worker loop: receive pickled ``(sys.path, setup, call)``, reply to each part with JSON."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _start_reaper(lifeline_fd)
    os.close(lifeline_fd)
    for fd in (read_fd, write_fd):  # a program the user's code runs does not get our pipes
        os.set_inheritable(fd, False)
    if memory_limit_mb > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = memory_limit_mb * 1024 * 1024
        try:
            resource.setrlimit(
                resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard)
            )
        except (ValueError, OSError):
            pass  # macOS does not enforce RLIMIT_AS; the limit holds on Linux
    streams = [_CappedOutput(1, role), _CappedOutput(2, role)]
    _send(write_fd, b'{"status": "ready"}')
    while True:
        try:
            sys_path, setup, call = pickle.loads(_receive(read_fd, None))
        except EOFError:  # the caller closed the pipe or exited
            return
        for stream in streams:
            stream.budget = MAX_OUTPUT_BYTES
        sys.path[:] = sys_path
        if setup is not None:
            ok, reply = _run(setup)
            _send(write_fd, reply)
            if not ok:
                continue
        _send(write_fd, _run(call)[1])


# ---------------------------------------------------------------- the caller's side


@dataclass(eq=False)
class _Worker:
    process: subprocess.Popen
    outbox: int  # requests to the worker
    inbox: int  # replies from the worker
    lifeline: int  # the write end the reaper watches; closing it (or dying) kills the group
    calls: int = 0
    ready: set[bytes] = field(default_factory=set)  # setups already run in this worker
    closed: bool = False

    @classmethod
    def start(cls, memory_limit_mb: int | None, role: str) -> _Worker:
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()
        passed = (to_worker_r, from_worker_w, lifeline_r)
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, *map(str, passed), str(memory_limit_mb or 0), role, *sys.path],
                pass_fds=passed,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, killed as one
            )
        except BaseException:
            for fd in (to_worker_w, from_worker_r, lifeline_w):
                os.close(fd)
            raise
        finally:
            for fd in passed:
                os.close(fd)
        worker = cls(process, to_worker_w, from_worker_r, lifeline_w)
        try:
            _receive(worker.inbox, time.monotonic() + _START_TIMEOUT_S, 64)
        except TimeoutError:
            worker.kill()
            raise OSError(f"{role} worker did not start within {_START_TIMEOUT_S:g} s") from None
        except (EOFError, OSError, _ReplyTooLarge):
            code = worker.exit_code()
            worker.kill()
            limit = f" under a memory limit of {memory_limit_mb} MiB" if memory_limit_mb else ""
            raise OSError(f"{role} worker exited while starting{limit} (exit code {code})") from None
        return worker

    def alive(self) -> bool:
        return self.process.poll() is None

    def exit_code(self) -> int | None:
        """The worker's own exit code once its end of the pipe closed (None if it lingers)."""
        try:
            return self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def kill_group(self) -> None:
        """SIGKILL to the worker's process group; safe while another thread waits on its pipes."""
        if self.process.returncode is None:  # not yet reaped, so its id still names the group
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # the group is gone already

    def kill(self) -> None:
        """Kill the group, reap the worker, close the pipes (once: a closed descriptor's number may be reused)."""
        self.kill_group()
        self.process.wait()
        if not self.closed:
            self.closed = True
            for fd in (self.outbox, self.inbox, self.lifeline):
                os.close(fd)


class WorkerPool:
    """``size`` persistent worker processes; ``call`` may be used from many threads at once.

    memory_limit_mb: address-space limit of each worker (RLIMIT_AS); None = no limit
    recycle_after:   calls a worker serves before it is replaced; None = never
    role:            what the workers run, in messages ("reward worker died (exit code 0)")
    """

    def __init__(
        self,
        size: int,
        *,
        memory_limit_mb: int | None = None,
        recycle_after: int | None = None,
        role: str = "reward",
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if memory_limit_mb is not None and memory_limit_mb < 1:
            raise ValueError(f"memory_limit_mb must be >= 1 or None, got {memory_limit_mb}")
        if recycle_after is not None and recycle_after < 1:
            raise ValueError(f"recycle_after must be >= 1 or None, got {recycle_after}")
        self.size = size
        self.memory_limit_mb = memory_limit_mb
        self.recycle_after = recycle_after
        self.role = role
        # None = a slot whose worker has not been started (or was killed); started on use.
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(size):
            self._idle.put(None)
        self._live: set[_Worker] = set()  # every started worker, idle or busy, for close()
        self._lock = threading.Lock()
        # A pool let go without close() (a Trainer made and dropped in a notebook, a test suite's
        # hundreds) ends its workers when it is collected, and at interpreter exit: otherwise each
        # worker (a whole interpreter, often with torch imported) lived until the caller died.
        weakref.finalize(self, _end_workers, self._live, self._idle, self._lock)

    def call(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        timeout_s: float,
        *,
        setup: Setup | None = None,
        setup_timeout_s: float = 60.0,
    ) -> CallOutcome:
        """Run ``fn(*args)`` in a worker; give up after ``timeout_s`` seconds of its run time. ``fn`` must
        return plain data (JSON: dicts with string keys, lists, strings, finite numbers, booleans, None);
        the outcome's value is that data as JSON decodes it. ``setup`` — ``(setup_fn, setup_args)`` — runs
        first, once per worker, within ``setup_timeout_s``; if it fails, its failure is the outcome."""
        with self.lease() as lease:
            return lease.call(fn, args, timeout_s, setup=setup, setup_timeout_s=setup_timeout_s)

    def lease(self) -> Lease:
        """One worker held for a series of calls (:class:`Lease`); waits while every worker is held."""
        return Lease(self, self._idle.get())

    def grow(self, size: int) -> None:
        """At least ``size`` workers (started on use): a caller holding a lease per episode needs one per episode."""
        with self._lock:
            for _ in range(size - self.size):
                self.size += 1
                self._idle.put(None)

    def _exchange(
        self, worker: _Worker, setup: bytes | None, setup_timeout_s: float, call: bytes, timeout_s: float
    ) -> tuple[CallOutcome, bool]:
        """(outcome, whether the worker may serve again)."""
        if setup in worker.ready:
            setup = None
        try:
            _send(worker.outbox, pickle.dumps((list(sys.path), setup, call)))
        except OSError:
            return CallOutcome("error", message=f"{self.role} worker died ({_ended(worker.exit_code())})"), False
        if setup is not None:
            reply, healthy = self._reply(worker, setup_timeout_s, "setup")
            if reply.status != "ok":
                return reply, healthy
            worker.ready.add(setup)
        worker.calls += 1
        return self._reply(worker, timeout_s, "")

    def _reply(self, worker: _Worker, timeout_s: float, stage: str) -> tuple[CallOutcome, bool]:
        prefix = f"{stage}: " if stage else ""
        try:
            data = _receive(worker.inbox, time.monotonic() + timeout_s, MAX_REPLY_BYTES)
        except TimeoutError:
            return CallOutcome("timeout", message=f"{prefix}no result after {timeout_s:g} s (worker killed)"), False
        except (EOFError, OSError):
            return CallOutcome(
                "error", message=f"{prefix}{self.role} worker died ({_ended(worker.exit_code())})"
            ), False
        except _ReplyTooLarge as err:
            message = f"{prefix}the reply is {err.args[0]} bytes, more than {MAX_REPLY_BYTES}"
            return CallOutcome("error", message=message), False
        try:
            reply = json.loads(data)
            status = reply["status"]
            if status == "ok":
                return CallOutcome("ok", value=reply["value"]), True
            if status == "error":
                message = prefix + str(reply["message"])[:_MAX_MESSAGE_CHARS]
                trace, at = str(reply.get("traceback", "")), str(reply.get("at", ""))
                return CallOutcome("error", message=message, traceback=trace, at=at), True
        except Exception:  # noqa: BLE001 - bytes that are not our reply: someone else wrote to the pipe
            pass
        return CallOutcome("error", message=f"{prefix}unreadable reply from the {self.role} worker"), False

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)

    def close(self) -> None:
        """Kill every worker's process group, idle or busy (a busy call then ends as an error). Only idle
        workers are reaped and their pipes closed here; a busy worker's thread does that when its call ends.
        The pool stays usable: a later call starts a fresh worker."""
        _end_workers(self._live, self._idle, self._lock)


def _end_workers(live: set[_Worker], idle: queue.Queue[_Worker | None], lock: threading.Lock) -> None:
    """:meth:`WorkerPool.close` on a pool's parts (its finalizer must not hold the pool itself)."""
    with lock:
        workers = list(live)
        live.clear()
    for worker in workers:
        worker.kill_group()
    held = []
    while True:
        try:
            held.append(idle.get_nowait())
        except queue.Empty:
            break
    for worker in held:
        if worker is not None:
            worker.kill()
        idle.put(None)


class Lease:
    """One worker held for a series of calls (``with pool.lease() as lease``): what its calls leave in the
    worker's modules stays for the next. Once a call lost the worker (it died, hung, or sent what is not a
    reply), every later call is an error saying so. ``release`` gives the worker back to the pool."""

    def __init__(self, pool: WorkerPool, worker: _Worker | None) -> None:
        self.pool, self.worker, self.lost, self.released, self.calls = pool, worker, "", False, 0

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def call(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        timeout_s: float,
        *,
        setup: Setup | None = None,
        setup_timeout_s: float = 60.0,
    ) -> CallOutcome:
        """:meth:`WorkerPool.call` on this lease's worker."""
        if self.lost:
            return CallOutcome("error", message=self.lost)
        pool, worker = self.pool, self.worker
        try:
            call = pickle.dumps((fn, tuple(args)))
            setup_bytes = None if setup is None else pickle.dumps((setup[0], tuple(setup[1])))
        except Exception as err:  # noqa: BLE001 - an unpicklable function is this call's error
            return CallOutcome("error", message=f"cannot send the call to a worker: {describe_error(err)}")
        self.calls += 1
        if worker is not None and not worker.alive() and self.calls == 1:  # died while idle: replace it
            pool._discard(worker)
            worker = self.worker = None
        if worker is None:
            try:
                worker = self.worker = _Worker.start(pool.memory_limit_mb, pool.role)
            except OSError as err:
                return CallOutcome("error", message=str(err))
            with pool._lock:
                pool._live.add(worker)
        outcome, healthy = pool._exchange(worker, setup_bytes, setup_timeout_s, call, timeout_s)
        if not healthy:
            pool._discard(worker)
            self.worker = None
            self.lost = f"the {pool.role} worker was lost in an earlier call ({outcome.message})"
        return outcome

    def release(self) -> None:
        if self.released:  # once
            return
        self.released = True
        worker, pool = self.worker, self.pool
        if worker is not None and pool.recycle_after is not None and worker.calls >= pool.recycle_after:
            pool._discard(worker)
            worker = None
        pool._idle.put(worker)


_shared: dict[tuple[int | None, int | None, str, int], WorkerPool] = {}
_shared_lock = threading.Lock()


def shared_pool(
    memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
    recycle_after: int | None = DEFAULT_RECYCLE_AFTER,
    *,
    role: str = "reward",
    size: int | None = None,
) -> WorkerPool:
    """The process-wide pool for these limits, role and size, shared by the callers that ask for the
    same. ``size`` None: one worker per usable core (glassrl.cores: the CPU affinity, not every
    core the machine has), at most 4."""
    size = min(4, usable_cores()) if size is None else size
    with _shared_lock:
        key = (memory_limit_mb, recycle_after, role, size)
        if key not in _shared:
            _shared[key] = WorkerPool(size, memory_limit_mb=memory_limit_mb, recycle_after=recycle_after, role=role)
        return _shared[key]


def default_pool() -> WorkerPool:
    """The shared pool with the default limits."""
    return shared_pool()


def call_with_timeout(fn: Callable[..., Any], args: Sequence[Any], timeout_s: float) -> CallOutcome:
    """Run ``fn(*args)`` in the default pool with a timeout; safe from any thread.

    Returns ``ok`` with the (plain) value, ``timeout`` (the worker's process group was killed
    and will be replaced), or ``error`` with the exception's type and message.
    """
    return default_pool().call(fn, args, timeout_s)
