"""The sandbox's first process: it runs as root (or as the caller) before the user's code.

Not imported by glassrl: :mod:`glassrl.agents.sandbox` runs this file as a script with
``python -I -S -B``, inside new network, mount, PID, IPC and UTS namespaces when the machine
allows them, so it uses the standard library only (and libseccomp through ctypes). Arguments:
one JSON object (see ``sandbox.py``); the user's code arrives on stdin; the outcome goes to the
file descriptor ``status_fd`` as one JSON line, ``{"exit": code}`` or ``{"signal": number}`` or
``{"setup_error": message}``.

Steps, in order:

1. (namespaces) a minimal root: a small tmpfs, mounted on the (empty) work directory, receives
   the system's directories (``SYSTEM_DIRS``) and the interpreter's prefix as bind mounts,
   the device nodes ``DEVICES``, a fresh ``/proc`` (of the new PID namespace) and the work
   directory's path; ``pivot_root`` makes it the root and the old root is unmounted. Nothing
   else of the host is there: not /tmp, /run, /var, /dev/shm, /home, /root, nor a run
   directory, so neither their files nor a UNIX socket bound in them (a network namespace
   scopes abstract UNIX sockets, not those) can be reached. Then every mount is remounted
   read-only, keeping its nosuid/nodev/noexec/atime flags, and a fresh tmpfs of
   ``disk_bytes`` is mounted on the work directory, the one writable place. Before that, the
   IPC namespace's limits are set (:func:`ipc_limits`: shared memory at most ``disk_bytes``
   in all). The mount namespace is private (``unshare --mount``), so none of this is seen
   outside, and it all vanishes with the namespace. The host name (a UTS namespace of its own) becomes ``sandbox``.
2. ``main.py`` (the user's code) is written into the work directory.
3. A child is forked; it closes every inherited descriptor above 2, sets the rlimits, drops to
   the sandbox uid (root only), joins a fresh session key ring and, under a sandbox uid, empties
   that uid's user key ring (what an earlier run of the uid left there), sets no_new_privs (a
   setuid binary cannot raise it back), installs the seccomp filter (:func:`install_seccomp`,
   when asked), and execs the interpreter on ``main.py`` with the minimal environment.
4. This process waits for the child and reports how it ended. In a PID namespace it is
   process 1: when it exits, the kernel kills whatever the child left running.
"""

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
MNT_DETACH = 2
# Per-mount flags of /proc/self/mountinfo that a bind remount must repeat, or it clears them.
KEPT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
PR_SET_NO_NEW_PRIVS = 38
# What the minimal root holds of the host, read-only: the programs, libraries and configuration
# the interpreter and the system's commands need (merged-/usr links stay links).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
SHM_SEGMENTS, MSG_QUEUES = 64, 16  # System V IPC objects of the sandbox's own IPC namespace
# pivot_root(2) has no libc wrapper: its system call number, by os.uname().machine.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
# keyctl(2) has none either (keyutils' libkeyutils is not the C library).
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR, KEY_SPEC_USER_KEYRING = 1, 7, -4

# The seccomp filter: system calls that tool code never needs, refused with EPERM. libseccomp
# (the library systemd, Docker's runc and apt use) builds the BPF program, through ctypes since
# this script has the standard library only. It does what the kernel's documentation asks of a
# filter (Documentation/userspace-api/seccomp_filter.rst, "the filter must check the
# architecture"): a call made through another ABI (x86_64's 32-bit int 0x80; x32, whose numbers
# have bit 30 set) kills the process (libseccomp's bad-architecture action and its x32 check, seen
# in seccomp_export_bpf's program), so no other number reaches a call refused under its own.
DENIED_SYSCALLS = (
    # the key rings: the user key ring belongs to a uid, and sandbox uids are reused (issue 37)
    "keyctl",
    "add_key",
    "request_key",
    # another process's memory and execution, the kernel's event and BPF machinery
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    # namespaces: a nested user namespace would give the code every capability inside it
    "unshare",
    "setns",
    # mounts: the sandbox's root stays as sandbox_init left it
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # io_uring runs operations outside the system calls this filter sees (Docker's profile refuses it too)
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # kernel modules and kexec (root only anyway)
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
)
# clone(2) is how threads and processes start; refused only when it asks for a new namespace
# (its flags are its first argument on x86_64 and aarch64 alike).
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWTIME": 0x80,
    "CLONE_NEWNS": 0x20000,
    "CLONE_NEWCGROUP": 0x2000000,
    "CLONE_NEWUTS": 0x4000000,
    "CLONE_NEWIPC": 0x8000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
EPERM, ENOSYS = 1, 38
# libseccomp's seccomp.h: actions and the masked-equality comparison.
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO = 0x00050000  # | errno
SCMP_CMP_MASKED_EQ = 7  # (argument & datum_a) == datum_b


class ScmpArgCmp(ctypes.Structure):
    """libseccomp's ``struct scmp_arg_cmp``."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def unescape(field):
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 …)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts():
    """(mount point, per-mount flags) of every mount this process sees."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            options = fields[5].split(",")
            yield unescape(fields[4]), sum(KEPT_FLAGS.get(o, 0) for o in options)


def mount(libc, source, target, fstype, flags, data):
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def minimal_root(libc, workdir, keep):
    """Make the (empty) work directory the mount point of a new root holding only SYSTEM_DIRS,
    ``keep``, DEVICES, /proc and the work directory's path; unmount the old root."""
    os.umask(0o022)  # the sandbox uid must be able to walk down to its work directory
    new = workdir
    mount(libc, "tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in (*SYSTEM_DIRS, *keep):
        if os.path.islink(path):
            os.symlink(os.readlink(path), new + path)
        elif os.path.isdir(path) and not os.path.exists(new + path):  # the prefix may lie in /usr
            os.makedirs(new + path)
            mount(libc, path, new + path, None, MS_BIND | MS_REC, None)
    os.mkdir(new + "/dev")
    mount(libc, "tmpfs", new + "/dev", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        open(f"{new}/dev/{name}", "w").close()
        mount(libc, f"/dev/{name}", f"{new}/dev/{name}", None, MS_BIND, None)
    for name, target in {"fd": "", "stdin": "/0", "stdout": "/1", "stderr": "/2"}.items():
        os.symlink(f"/proc/self/fd{target}", f"{new}/dev/{name}")
    os.mkdir(new + "/proc")
    mount(libc, "proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    os.makedirs(new + workdir)
    os.mkdir(new + "/.old-root")
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: no system call number known for {os.uname().machine}")
    if libc.syscall(number, new.encode(), f"{new}/.old-root".encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"pivot_root: {os.strerror(errno)}")
    os.chdir("/")
    if libc.umount2(b"/.old-root", MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unmount the old root: {os.strerror(errno)}")
    os.rmdir("/.old-root")


def ipc_limits(disk_bytes):
    """The IPC namespace's own limits (its sysctls, written through the new /proc): System V shared
    memory in all at most ``disk_bytes``, as the work directory (a segment is memory that no
    process's RLIMIT_AS counts until it is attached), at most SHM_SEGMENTS segments and
    MSG_QUEUES message queues (each holds up to msgmnb, 16 KiB, of kernel memory)."""
    page = os.sysconf("SC_PAGE_SIZE")
    values = {
        "kernel/shmmax": disk_bytes,
        "kernel/shmall": -(-disk_bytes // page),
        "kernel/shmmni": SHM_SEGMENTS,
        "kernel/msgmni": MSG_QUEUES,
    }
    for name, value in values.items():
        with open(f"/proc/sys/{name}", "w") as f:
            f.write(str(value))


def read_only_world(workdir, disk_bytes, uid, keep):
    libc = ctypes.CDLL(None, use_errno=True)
    minimal_root(libc, workdir, keep)
    ipc_limits(disk_bytes)
    for target, flags in mounts():
        mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None)
    owner = "" if uid is None else f",uid={uid},gid={uid}"
    mount(libc, "tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_bytes},mode=0700{owner}")


def install_seccomp():
    """Load the filter of DENIED_SYSCALLS into this process (inherited by all it starts, kept across
    exec). clone3(2) passes its flags in a structure a filter cannot read, so it answers ENOSYS:
    the C library then falls back to clone(2), whose flags the filter reads (what Docker and
    Chromium do). Raises OSError when libseccomp is missing or the kernel refuses."""
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as err:
        raise OSError(f"seccomp: libseccomp.so.2 not found ({err})") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ScmpArgCmp),
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp: seccomp_init failed")

    def rule(name, errno, *comparisons):
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number == -1:  # __NR_SCMP_ERROR: a call this libseccomp does not know (older than the call)
            return
        array = (ScmpArgCmp * len(comparisons))(*comparisons)
        code = lib.seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO | errno, number, len(comparisons), array)
        if code != 0:
            raise OSError(-code, f"seccomp: a rule for {name}: {os.strerror(-code)}")

    try:
        for name in DENIED_SYSCALLS:
            rule(name, EPERM)
        for flag in CLONE_NAMESPACE_FLAGS.values():
            rule("clone", EPERM, ScmpArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
        rule("clone3", ENOSYS)
        code = lib.seccomp_load(ctx)
        if code != 0:
            raise OSError(-code, f"seccomp: loading the filter: {os.strerror(-code)}")
    finally:
        lib.seccomp_release(ctx)


def fresh_key_rings(libc, sandbox_uid):
    """A session key ring of its own; under a sandbox uid, that uid's user key ring emptied (an
    earlier run of the same uid may have left keys there). A kernel without key rings: nothing to do."""
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        return
    libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None)
    if sandbox_uid:
        libc.syscall(number, KEYCTL_CLEAR, KEY_SPEC_USER_KEYRING)


def run_user_code(cfg):
    """In the forked child: limits, identity, then exec. Never returns."""
    os.closerange(3, 65536)  # the status descriptor among them: the code cannot forge an outcome
    limits = cfg["limits"]
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    libc = ctypes.CDLL(None, use_errno=True)
    fresh_key_rings(libc, uid is not None)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if cfg["seccomp"]:
        install_seccomp()
    os.chdir(cfg["workdir"])
    python = cfg["python"]
    os.execve(python, [python, "-I", "-S", "-B", "main.py"], cfg["env"])


def report(cfg, outcome):
    os.write(cfg["status_fd"], (json.dumps(outcome) + "\n").encode())


def main():
    cfg = json.loads(sys.argv[1])
    code = sys.stdin.buffer.read()
    workdir, uid = cfg["workdir"], cfg["uid"]
    try:
        if cfg["namespaces"]:
            read_only_world(workdir, cfg["limits"]["disk_bytes"], uid, cfg["keep"])
            hostname = b"sandbox"
            if ctypes.CDLL(None, use_errno=True).sethostname(hostname, len(hostname)) != 0:
                raise OSError(ctypes.get_errno(), "sethostname")
        path = os.path.join(workdir, "main.py")
        with open(path, "wb") as f:
            f.write(code)
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chown(path, uid, uid)
    except OSError as err:
        report(cfg, {"setup_error": str(err)})
        return
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    pid = os.fork()
    if pid == 0:
        try:
            run_user_code(cfg)
        except BaseException as err:  # noqa: BLE001 - anything before exec is a setup failure
            os.write(2, f"sandbox setup failed: {err}\n".encode())
        os._exit(127)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        report(cfg, {"signal": os.WTERMSIG(status)})
    else:
        report(cfg, {"exit": os.WEXITSTATUS(status)})


if __name__ == "__main__":
    main()
