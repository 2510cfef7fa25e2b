"""One run per directory: an exclusive lock on a run's output directory.

    lock = RunLock(run_dir / ".lock", what=f"output_dir = {run_dir}")  # GlassrlError when taken
    ...
    lock.release()

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a lock file that holds the owner's pid, host and
start time (the host: on a cluster the driver that died may have run on another machine). The
kernel drops a flock when its process dies, however it dies (kill -9 included), so a lock file
left by a dead process is free: the next run takes it over and says whose it was
(:attr:`RunLock.stale`). A live owner is named in the error.

After ``flock`` succeeds the path is checked to still name the locked file: a releasing
owner unlinks the file (under its lock), and a run that opened the old file just before
would otherwise hold a lock on a name nobody else can see. Local file systems only
(flock on NFS depends on the mount). A symbolic link at the lock's path is refused (a
GlassrlError naming it), never opened: the lock would write its pid into the file it points to.

RL runs lock ``output_dir/.lock``; ``sft``, ``rm`` and ``init-model`` replace their output
directory as a whole (glassrl.run.atomic.StagedDir), so they lock a sibling file,
``.<name>.lock`` beside it (:func:`sibling_lock_path`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from glassrl.errors import GlassrlError
from glassrl.files import refusal


def sibling_lock_path(directory: str | Path) -> Path:
    """``parent/.<name>.lock`` for ``parent/<name>``: the lock of a directory replaced as a whole."""
    directory = Path(directory).absolute()
    return directory.parent / f".{directory.name}.lock"


class RunLock:
    """An exclusive lock on ``path`` (created with its parent directories), held until :meth:`release`
    or the process ends. ``what`` names the guarded thing in the error (``output_dir = runs/x``)."""

    def __init__(self, path: str | Path, what: str) -> None:
        self.path, self.what = Path(path), what
        self.stale: str | None = None  # "pid 123 on host, started …": the dead owner whose lock was taken over
        self._fd: int | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while self._fd is None:
            try:  # never through a link: the lock file would be someone else's file
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise GlassrlError(refusal(self.path)) from None
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                raise GlassrlError(
                    f"{what} is in use by another glassrl run ({owner or 'pid unknown'}; lock {self.path}): "
                    "wait for it to end, or choose another directory"
                ) from None
            if not _same_file(fd, self.path):  # unlinked by its last owner after we opened it: again
                os.close(fd)
                continue
            self.stale = _read_owner(fd) or None
            os.ftruncate(fd, 0)
            owner = f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"
            os.pwrite(fd, f"{owner}\n".encode(), 0)
            os.fsync(fd)
            self._fd = fd

    def release(self) -> None:
        """Unlink the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if _same_file(fd, self.path):
                self.path.unlink()
        finally:
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit the modules it needs may be gone
            pass


def _read_owner(fd: int) -> str:
    return os.pread(fd, 200, 0).decode("utf-8", errors="replace").strip()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)
