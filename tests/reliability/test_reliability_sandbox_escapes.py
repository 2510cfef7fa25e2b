"""Sandbox escapes of issue 37, each contained, each beside its control: the same program run
outside the sandbox (``outside``) does what the sandbox refuses, so every test can fail.

- a 64 MiB System V shared-memory segment: outside, it outlives the process, the host sees it and
  a later process reads it back; in the sandbox (an IPC namespace of its own) none of that, and
  its segments hold at most ``disk_bytes`` in all;
- a key added to the user key ring: outside, the next process of the uid reads it; in the
  sandbox, never (seccomp refuses the key-ring calls; without seccomp, the uid's ring is emptied
  at the next run's start);
- ptrace of a child, a nested user namespace by unshare(2) and by clone(2): outside they work (as
  the same kind of unprivileged uid), in the sandbox the seccomp filter refuses them;
- the host's name is not read inside (a UTS namespace of its own).

Where the machine lacks the feature, :func:`glassrl.agents.sandbox.isolation` says so in
its note, the python tool warns at start, and the test skips naming why.
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
import warnings
from pathlib import Path

import pytest

from glassrl.agents import sandbox
from glassrl.agents.sandbox import Isolation, PythonTool, SandboxLimits, _run, isolation, run_python

ISO = isolation()
FAST = SandboxLimits(wall_s=20.0, cpu_s=5)
MACHINE = os.uname().machine
needs_namespaces = pytest.mark.skipif(not ISO.namespaces, reason=f"no namespaces here: {ISO.note}")
needs_seccomp = pytest.mark.skipif(not ISO.seccomp, reason=f"no seccomp filter here: {ISO.note}")
needs_keys = pytest.mark.skipif(not Path("/proc/keys").exists(), reason="this kernel has no key rings (CONFIG_KEYS)")
needs_tmp_uid = pytest.mark.skipif(not ISO.tmp_uid, reason="not root: the sandbox runs as the caller's uid")
# An unprivileged uid for the controls, like the sandbox's own (root would pass checks that it fails).
CONTROL_UID = sandbox.UID_BASE - 37 if os.geteuid() == 0 else None

LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def outside(code: str, uid: int | None = None) -> str:
    """``code`` run by the sandbox's interpreter, outside the sandbox (as ``uid`` when given); its stdout."""
    done = subprocess.run(
        [ISO.python, "-I", "-S", "-B", "-c", code], capture_output=True, text=True, timeout=60, user=uid, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def inside(code: str, iso: Isolation = ISO) -> str:
    result = _run(code, FAST, iso)
    assert result.status == "ok", result
    return result.stdout.strip()


# ---------------------------------------------------------------- System V shared memory


SHM = LIBC + (
    "libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]\n"
    "libc.shmat.restype = ctypes.c_void_p\n"
    "libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n"
    "KEY = {key}\n"
)
CREATE = SHM + (
    "shmid = libc.shmget(KEY, 64 << 20, 0o1000 | 0o666)  # IPC_CREAT, mode 666\n"
    "if shmid < 0:\n    print('refused', os.strerror(ctypes.get_errno()))\n    raise SystemExit\n"
    "ctypes.memmove(libc.shmat(shmid, None, 0), b'left-by-episode-1', 17)\n"
    "print('created')\n"
)
READ = SHM + (
    "shmid = libc.shmget(KEY, 0, 0)\n"
    "print('absent' if shmid < 0 else ctypes.string_at(libc.shmat(shmid, None, 0), 17).decode())\n"
)


def host_segment(key: int) -> int | None:
    """The id of the host's System V segment with ``key`` (/proc/sysvipc/shm), or None."""
    for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[0]) == key:
            return int(fields[1])
    return None


def remove_segment(shmid: int) -> None:
    outside(LIBC + f"libc.shmctl({shmid}, 0, None)")  # IPC_RMID


@needs_namespaces
def test_a_shared_memory_segment_neither_outlives_the_run_nor_reaches_the_host_or_the_next_run():
    key = 0x61000000 + os.getpid() % 0xFFFF
    assert host_segment(key) is None
    # control: outside, the segment outlives its process, the host sees it, the next process reads it
    assert outside(CREATE.format(key=key)) == "created"
    shmid = host_segment(key)
    try:
        assert shmid is not None
        assert outside(READ.format(key=key)) == "left-by-episode-1"
    finally:
        if shmid is not None:
            remove_segment(shmid)
    # the sandbox: its own IPC namespace, gone with the run
    assert inside(CREATE.format(key=key)) == "created"
    assert host_segment(key) is None
    assert inside(READ.format(key=key)) == "absent"
    assert {"ipc", "uts"} <= set(run_python("pass", FAST).guarantees)


TWO_SEGMENTS = SHM + (
    "ids = [libc.shmget(KEY + k, 64 << 20, 0o1000 | 0o600) for k in range(2)]\n"
    "print(*(i >= 0 for i in ids), os.strerror(ctypes.get_errno()) if min(ids) < 0 else '')\n"
)


@needs_namespaces
def test_shared_memory_in_all_is_bounded_by_the_disk_limit():
    """A segment is memory no process's RLIMIT_AS counts until attached: the namespace's own
    shmall keeps it to ``disk_bytes`` (64 MiB) in all."""
    key = 0x62000000 + os.getpid() % 0xFFFF
    try:  # control: outside, two 64 MiB segments
        assert outside(TWO_SEGMENTS.format(key=key)) == "True True"
    finally:
        for k in range(2):
            if (shmid := host_segment(key + k)) is not None:
                remove_segment(shmid)
    assert inside(TWO_SEGMENTS.format(key=key)) == "True False No space left on device"


@needs_namespaces
def test_the_host_name_is_not_read_inside():
    code = "import socket\nprint(socket.gethostname())"
    assert outside(code) == socket.gethostname()  # control
    assert inside(code) == "sandbox" != socket.gethostname()


# ---------------------------------------------------------------- the key rings

SYS_ADD_KEY = {"x86_64": 248, "aarch64": 217}
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
needs_key_syscalls = pytest.mark.skipif(MACHINE not in SYS_ADD_KEY, reason=f"no key syscall numbers for {MACHINE}")
ADD_KEY = LIBC + (
    "serial = libc.syscall({add_key}, b'user', b'{name}', b'secret', 6, -4)  # KEY_SPEC_USER_KEYRING\n"
    "print('added' if serial > 0 else 'refused ' + os.strerror(ctypes.get_errno()))\n"
)
FIND_KEY = LIBC + (
    "serial = libc.syscall({keyctl}, 10, -4, b'user', b'{name}', 0)  # KEYCTL_SEARCH\n"
    "print('found' if serial > 0 else 'absent')\n"
)
CLEAR_KEYS = LIBC + "libc.syscall({keyctl}, 7, -4)  # KEYCTL_CLEAR\n"


def key_programs() -> tuple[str, str]:
    name = f"glassrl-probe-{uuid.uuid4().hex[:8]}"
    numbers = {"add_key": SYS_ADD_KEY[MACHINE], "keyctl": SYS_KEYCTL[MACHINE], "name": name}
    return ADD_KEY.format(**numbers), FIND_KEY.format(**numbers)


@needs_keys
@needs_key_syscalls
def test_a_key_added_in_one_run_is_not_read_in_the_next():
    add, find = key_programs()
    # control: outside, the next process of the same uid reads the key
    try:
        assert outside(add, CONTROL_UID) == "added"
        assert outside(find, CONTROL_UID) == "found"
    finally:
        outside(CLEAR_KEYS.format(keyctl=SYS_KEYCTL[MACHINE]), CONTROL_UID)
    # the sandbox: two runs in a row (the same sandbox uid, slots are taken in order)
    first = inside(add)
    assert inside(find) == "absent"
    if ISO.seccomp:
        assert first == "refused Operation not permitted"
    assert "keyring" in run_python("pass", FAST).guarantees


@needs_keys
@needs_key_syscalls
@needs_tmp_uid
def test_without_seccomp_the_next_run_of_the_uid_finds_its_key_ring_emptied():
    add, find = key_programs()
    no_seccomp = Isolation(ISO.namespaces, ISO.tmp_uid, ISO.python, seccomp=False)
    assert inside(add, no_seccomp) == "added"  # control: without the filter the call works
    assert inside(find, no_seccomp) == "absent"
    assert "keyring" in no_seccomp.guarantees and "seccomp" not in no_seccomp.guarantees


# ---------------------------------------------------------------- seccomp: ptrace, nested user namespaces

PTRACE = LIBC + (
    "import signal, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n    time.sleep(30)\n    os._exit(0)\n"
    "attached = libc.ptrace(16, pid, None, None) == 0  # PTRACE_ATTACH\n"
    "err = ctypes.get_errno()\n"
    "os.kill(pid, signal.SIGKILL)\nos.waitpid(pid, 0)\n"
    "print('attached' if attached else 'refused ' + os.strerror(err))\n"
)
UNSHARE_USER = LIBC + (
    "ok = libc.unshare(0x10000000) == 0  # CLONE_NEWUSER\n"
    "print('unshared' if ok else 'refused ' + os.strerror(ctypes.get_errno()))\n"
)
SYS_CLONE = {"x86_64": 56, "aarch64": 220}
CLONE_USER = LIBC + (
    "pid = libc.syscall({clone}, 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD, fork-like\n"
    "if pid == 0:\n    os._exit(0)\n"
    "err = ctypes.get_errno()\n"
    "if pid > 0:\n    os.waitpid(pid, 0)\n"
    "print('cloned' if pid > 0 else 'refused ' + os.strerror(err))\n"
)


def control_or_skip(code: str, expected: str) -> None:
    """The control: outside, as an unprivileged uid like the sandbox's, ``code`` succeeds; a machine
    that refuses it anyway (Yama, user namespaces switched off) cannot show the filter's doing."""
    got = outside(code, CONTROL_UID)
    if got != expected:
        pytest.skip(f"refused outside the sandbox too ({got}): nothing for the filter to show here")


@needs_seccomp
@pytest.mark.parametrize(
    ("name", "code", "works"),
    [
        ("ptrace", PTRACE, "attached"),
        ("unshare(CLONE_NEWUSER)", UNSHARE_USER, "unshared"),
        ("clone(CLONE_NEWUSER)", CLONE_USER.format(clone=SYS_CLONE.get(MACHINE, -1)), "cloned"),
    ],
)
def test_the_filter_refuses_ptrace_and_nested_user_namespaces(name, code, works):
    if "clone(" in name and MACHINE not in SYS_CLONE:
        pytest.skip(f"no clone syscall number for {MACHINE}")
    control_or_skip(code, works)
    assert inside(code) == "refused Operation not permitted"
    assert (
        inside(code, Isolation(ISO.namespaces, ISO.tmp_uid, ISO.python, seccomp=False)) == works
    )  # the filter's doing


@needs_seccomp
def test_threads_processes_and_subprocesses_still_run_under_the_filter():
    code = (
        "import os, subprocess, threading\n"
        "t = threading.Thread(target=print, args=('thread',))\nt.start()\nt.join()\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(7)\n"
        "print('child', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "print(subprocess.run(['/bin/echo', 'spawned'], capture_output=True, text=True).stdout.strip())\n"
    )
    assert inside(code).splitlines() == ["thread", "child 7", "spawned"]


def test_a_machine_without_seccomp_is_told_so_at_start(monkeypatch):
    """No silent fallback: the python tool, built where the filter cannot load, warns naming it."""
    without = Isolation(True, True, ISO.python, note="no seccomp filter (libseccomp.so.2 not found)", seccomp=False)
    monkeypatch.setattr(sandbox, "isolation", lambda: without)
    with pytest.warns(RuntimeWarning, match="without seccomp .*libseccomp.so.2 not found"):
        PythonTool(FAST)
    monkeypatch.setattr(sandbox, "isolation", lambda: Isolation(True, True, ISO.python, seccomp=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PythonTool(FAST)
