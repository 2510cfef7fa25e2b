"""A Python executor for untrusted code (the model's), in a separate process.

``run_python(code, limits)`` runs ``code`` as ``main.py`` in a fresh directory and returns its
capped stdout and stderr. What holds depends on what the machine allows; the result's
``guarantees`` names what held for that run, and :func:`isolation` says it once for the
machine.

Always:
- **rlimits** in the child (``resource.setrlimit``): CPU seconds (SIGXCPU, then SIGKILL one
  second later), address space (an allocation past it raises MemoryError), processes
  (RLIMIT_NPROC: a fork bomb stops at that count), file size (a write past it fails with
  EFBIG), open files 64, no core files;
- **wall-clock timeout**: the whole process group is SIGKILLed, and the result says timeout;
- **a minimal environment**: no variable of the parent's (``PATH``, ``HOME`` = the work
  directory, ``LANG``, ``PYTHONIOENCODING``); the interpreter runs with ``-I -S -B`` (no
  ``PYTHON*`` variables, no site-packages, no user site, no .pyc written): the standard library;
- **its own temporary directory** as the working directory, deleted afterwards;
- **output capped** at ``output_bytes`` per stream (the rest is read and dropped; the result
  says ``truncated``).

When run as root (``tmp-uid``): the code runs under a uid of its own, unused by anyone
(``UID_BASE`` + a slot): it cannot read root's files (``/root`` is 0700), signal the parent,
or read the parent's ``/proc/<pid>/environ``; RLIMIT_NPROC counts only its own processes;
afterwards every process of that uid is killed, so nothing it started is left behind, even
one that left the process group with ``setsid``.

When ``unshare`` (util-linux) can create namespaces (root with CAP_SYS_ADMIN, as here and in
CI; not in an unprivileged container):
- **net**: a new network namespace with only a loopback interface, down: every TCP/UDP
  connection attempt fails, to the internet and to the host's own listening sockets alike, and
  the host's abstract UNIX sockets (which belong to a network namespace) are out of reach;
- **pid**: a new PID namespace with its own ``/proc``: the code sees only its own processes,
  and when it ends the kernel kills all of them;
- **ipc**: a new IPC namespace: System V shared memory, semaphores and message queues (and POSIX
  message queues) of its own, destroyed with it: a segment it creates is not the host's, cannot
  be attached by a host process or read by a later run, and does not outlive the run
  unaccounted (issue 37 measured a 64 MiB segment, mode 666, left behind by a run without it);
  its segments hold at most ``disk_bytes`` in all (the namespace's own ``shmall``);
- **uts**: a host name of its own (``sandbox``): the host's is not read;
- **min-root** (with a uid of its own: root could mount the host's disk again): a root of its
  own holding only the system's directories (``/usr``, ``/etc``, ``/bin``, ``/lib*``, ``/sbin``)
  and the interpreter's prefix, the device nodes null, zero, full, random, urandom, ``/proc``
  and the work directory. The rest of the host is not there: no file under /tmp, /run, /var,
  /dev/shm, /home, /root or a run directory can be read, even one readable by anybody, and
  no UNIX socket bound in them can be connected to (a network namespace does not scope those:
  X11, D-Bus, /dev/log, a dev server's socket);
- **fs** (same condition): every mount of that root is read-only; the work directory is a
  fresh tmpfs of ``disk_bytes`` (total disk use capped), the only writable place.

When libseccomp (``libseccomp.so.2``, the Debian package libseccomp2) loads and the kernel takes
a filter:
- **seccomp**: a filter refuses (EPERM) what tool code never needs: the key rings (``keyctl``,
  ``add_key``, ``request_key``), ``ptrace`` and reading another process's memory, new
  namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag; ``clone3`` answers
  ENOSYS so that the C library uses ``clone``): no nested user namespace, whose capabilities
  would open the kernel's mount and network code to the code), mounts, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, io_uring and kernel modules (``sandbox_init.DENIED_SYSCALLS``).

Always, besides: the code joins a fresh session key ring, and under a uid of its own that uid's
user key ring is emptied first; **keyring** holds when seccomp does (no key ring can be reached)
or the uid is its own (what a run leaves in its uid's key ring, the next run of that uid does not
find): a key added by one run is never read by the next.

Without namespaces (``isolation().note`` says why), the code can open network connections,
connect to the host's UNIX sockets, read whatever its uid may (world-readable run directories
included) and write wherever its uid may (world-writable directories such as /tmp); without
root it also runs as the caller's uid (reads what the caller may) and a process it detaches
with ``setsid`` can outlive the run. The tool then still runs, best effort: every result's
``guarantees`` lacks what did not hold, and :class:`PythonTool` warns (RuntimeWarning) when it
is built, naming what is missing and why.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from glassrl.cores import usable_cores
from glassrl.errors import GlassrlError

INIT = Path(__file__).with_name("sandbox_init.py")
# Sandbox uids: far above any account a distribution creates (they stop at 65534) and below the
# 2^31 that some tools treat as negative. One per concurrent run: RLIMIT_NPROC counts per uid,
# and the cleanup kills every process of the run's uid.
UID_BASE = 1_900_000_000
UID_SLOTS = 1024
# --mount makes every mount private (util-linux's default propagation); sandbox_init.py mounts /proc.
UNSHARE_FLAGS = ("--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child")

Status = Literal["ok", "error", "timeout"]
# what may hold, in order
GUARANTEES = ("rlimits", "env", "tmpdir", "tmp-uid", "net", "pid", "ipc", "uts", "fs", "min-root", "seccomp", "keyring")


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. ``wall_s`` is elapsed time; ``cpu_s`` CPU time (whole seconds)."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20
    processes: int = 32
    file_bytes: int = 16 * 2**20
    disk_bytes: int = 64 * 2**20
    output_bytes: int = 16 * 2**10

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_bytes", "processes", "file_bytes", "disk_bytes", "output_bytes"):
            if not getattr(self, name) > 0:
                raise GlassrlError(f"sandbox limits: {name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended.

    status:     "ok" (exit code 0), "error" (another exit code, a signal, a setup failure),
                "timeout" (the wall-clock limit; the process group was killed)
    exit_code:  the code's exit status; None when it did not exit by itself
    message:    what happened, in words ("exit code 1", "killed by SIGXCPU (CPU time limit)")
    truncated:  stdout or stderr was longer than the limit and was cut
    guarantees: what held for this run, a subset of GUARANTEES ("rlimits", "env", "tmpdir",
                "tmp-uid", "net", "pid", "ipc", "uts", "fs", "min-root", "seccomp", "keyring"); see the
                module docstring
    workdir:    the directory it ran in (already deleted)
    """

    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    message: str
    truncated: bool
    seconds: float
    guarantees: tuple[str, ...]
    workdir: str = ""


@dataclass(frozen=True)
class Isolation:
    """What this machine allows: namespaces (net, pid, ipc, uts, min-root, fs), a uid of its own (root),
    the seccomp filter, and why not."""

    namespaces: bool
    tmp_uid: bool
    python: str
    note: str = ""
    seccomp: bool = False

    @property
    def guarantees(self) -> tuple[str, ...]:
        out = ["rlimits", "env", "tmpdir"]
        if self.tmp_uid:
            out.append("tmp-uid")
        if self.namespaces:
            out += ["net", "pid", "ipc", "uts"]
        if self.namespaces and self.tmp_uid:
            # code running as root could remount the read-only mounts writable, or mount the old root again
            out += ["fs", "min-root"]
        if self.seccomp:
            out.append("seccomp")
        if self.seccomp or self.tmp_uid:
            out.append("keyring")
        return tuple(out)


class _UidSlots:
    """A free sandbox uid per concurrent run; the process id spreads parallel trainers apart."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: set[int] = set()

    def take(self) -> int:
        with self._lock:
            start = (os.getpid() * 37) % UID_SLOTS
            for k in range(UID_SLOTS):
                slot = (start + k) % UID_SLOTS
                if slot not in self._used:
                    self._used.add(slot)
                    return UID_BASE + slot
        raise RuntimeError(f"more than {UID_SLOTS} sandbox runs at once")

    def give_back(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid - UID_BASE)


_UIDS = _UidSlots()


def _world_executable(path: str) -> bool:
    """Every directory above ``path`` is searchable by others and the file is executable by them."""
    p = Path(path).resolve()
    try:
        if not p.is_file() or not p.stat().st_mode & stat.S_IXOTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in p.parents)
    except OSError:
        return False


def _interpreter(for_other_uid: bool) -> str | None:
    """A Python 3 the sandbox uid can run: this one when reachable, else the system's."""
    own = str(Path(getattr(sys, "_base_executable", sys.executable)).resolve())
    if not for_other_uid:
        return own
    for candidate in (own, shutil.which("python3") or "", "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and _world_executable(candidate):
            return str(Path(candidate).resolve())
    return None


@lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Probe once per process: run ``pass`` under the seccomp filter, then in namespaces; fall back
    from either, saying why."""
    root = os.geteuid() == 0
    python = _interpreter(for_other_uid=root)
    notes = [] if root else ["not root: the code runs as this process's uid"]
    if root and python is None:
        notes.append("no Python interpreter reachable by another uid: the code runs as root")
        python = _interpreter(for_other_uid=False)
    tmp_uid = root and _interpreter(for_other_uid=True) is not None
    probe = _run("pass", SandboxLimits(wall_s=20.0), Isolation(False, tmp_uid, python, seccomp=True))
    seccomp = probe.status == "ok"
    if not seccomp:
        notes.append(f"no seccomp filter ({probe.message}: {probe.stderr.strip()[-200:]})")
    if shutil.which("unshare") is None:
        notes.append("no unshare command (util-linux): no network, mount, PID, IPC or UTS namespace")
        return Isolation(False, tmp_uid, python, "; ".join(notes), seccomp)
    probe = _run("pass", SandboxLimits(wall_s=20.0), Isolation(True, tmp_uid, python, seccomp=seccomp))
    if probe.status != "ok":
        notes.append(f"namespaces unavailable ({probe.message}: {probe.stderr.strip()[-200:]})")
        return Isolation(False, tmp_uid, python, "; ".join(notes), seccomp)
    return Isolation(True, tmp_uid, python, "; ".join(notes), seccomp)


@lru_cache(maxsize=1)
def _running() -> threading.BoundedSemaphore:
    """One sandbox per usable core at once (glassrl.cores): rollout.agent.tool_workers environments
    times rollout.agent.max_calls calls each would otherwise start that many at once, each with
    its own process, memory and CPU limits, and share the cores until every one ran past its wall
    clock. A run waits for its turn (the wait counts in the tool call's time limit)."""
    return threading.BoundedSemaphore(usable_cores())


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` in the sandbox (module docstring) and wait for it; never raises for the code's sake.
    At most one run per usable core at once (:func:`_running`)."""
    with _running():
        return _run(code, limits, isolation())


def _run(code: str, limits: SandboxLimits, iso: Isolation) -> SandboxResult:
    start = time.monotonic()
    uid = _UIDS.take() if iso.tmp_uid else None
    workdir = tempfile.mkdtemp(prefix="glassrl-sandbox-")
    status_r, status_w = os.pipe()
    try:
        config = {
            "workdir": workdir,
            "status_fd": status_w,
            "uid": uid,
            "namespaces": iso.namespaces,
            "seccomp": iso.seccomp,
            "python": iso.python,
            "keep": [str(Path(iso.python).parent.parent)],  # the interpreter's prefix, in the minimal root
            "env": {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"},
            "limits": {
                "cpu_s": int(limits.cpu_s),
                "memory_bytes": int(limits.memory_bytes),
                "file_bytes": int(limits.file_bytes),
                "processes": int(limits.processes),
                "disk_bytes": int(limits.disk_bytes),
            },
        }
        argv = [iso.python, "-I", "-S", "-B", str(INIT), json.dumps(config)]
        if iso.namespaces:
            argv = [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, *argv]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            cwd="/",
            start_new_session=True,
            pass_fds=(status_w,),
        )
        os.close(status_w)
        status_w = -1
        stdout, stderr = (
            _CappedReader(proc.stdout, limits.output_bytes),
            _CappedReader(proc.stderr, limits.output_bytes),
        )
        try:
            proc.stdin.write(code.encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            proc.wait()
        if uid is not None and not iso.namespaces:
            _kill_uid(uid)  # a process that left the group with setsid
        with os.fdopen(status_r, "rb") as f:
            status_r = -1
            outcome = _outcome(f.read())
        out, out_cut = stdout.result()
        err, err_cut = stderr.result()
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            _UIDS.give_back(uid)
    status, exit_code, message = _classify(outcome, timed_out, limits)
    return SandboxResult(
        status, exit_code, out, err, message, out_cut or err_cut, time.monotonic() - start, iso.guarantees, workdir
    )


def _outcome(raw: bytes) -> dict[str, Any]:
    lines = raw.decode(errors="replace").strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return {}


def _classify(outcome: dict[str, Any], timed_out: bool, limits: SandboxLimits) -> tuple[Status, int | None, str]:
    if timed_out:
        return "timeout", None, f"no result within {limits.wall_s:g} s (wall clock): killed"
    if "setup_error" in outcome:
        return "error", None, f"sandbox setup failed: {outcome['setup_error']}"
    if "signal" in outcome:
        number = int(outcome["signal"])
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
        why = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)", "SIGKILL": " (CPU or memory limit)"}
        return "error", None, f"killed by {name}{why.get(name, '')}"
    if "exit" in outcome:
        code = int(outcome["exit"])
        return ("ok" if code == 0 else "error"), code, f"exit code {code}"
    return "error", None, "the sandbox ended without reporting (killed from outside?)"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is ``uid`` (only sandbox runs use it), until none is left."""
    for _ in range(100):
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "status").read_text().split("\nUid:\t", 1)[1].split()[0] == str(uid):
                    pids.append(int(entry.name))
            except (OSError, IndexError):
                continue
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


@dataclass
class _CappedReader:
    """Reads a pipe to its end in a thread, keeping the first ``cap`` bytes."""

    stream: Any
    cap: int
    data: bytearray = field(default_factory=bytearray)
    cut: bool = False

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        fd = self.stream.fileno()
        while chunk := os.read(fd, 65536):
            room = self.cap - len(self.data)
            if len(chunk) > room:
                self.cut = True
            self.data += chunk[: max(room, 0)]

    def result(self) -> tuple[str, bool]:
        # A writer outside our reach (no namespaces, no uid of its own) may hold the pipe open.
        self.thread.join(timeout=2.0)
        self.stream.close()
        return self.data.decode(errors="replace"), self.cut


class PythonTool:
    """``python(code)`` -> what the code printed, run in the sandbox; a failure says how it ended."""

    name = "python"
    description = "Run Python 3 code (standard library only, no network, no files kept) and return what it prints."
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a Python program; print the answer"}},
        "required": ["code"],
    }

    def __init__(self, limits: SandboxLimits = SandboxLimits()) -> None:
        self.limits = limits
        iso = isolation()
        missing = [g for g in GUARANTEES if g not in iso.guarantees]
        if missing:  # at start, where the run is built: model-written code is about to run less contained
            warnings.warn(
                f"python tool: model-written code runs without {', '.join(missing)} ({iso.note}); "
                "see glassrl.agents.sandbox",
                RuntimeWarning,
                stacklevel=2,
            )

    def call(self, arguments: dict[str, Any]) -> str:
        result = run_python(arguments["code"], self.limits)
        cut = "\n[output truncated]" if result.truncated else ""
        if result.status == "ok":
            return result.stdout + cut
        return f"{result.stdout}{result.stderr}{cut}\n[{result.status}: {result.message}]".lstrip("\n")
