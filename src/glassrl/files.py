"""Writing files where a link may sit: a file replaced whole, a file appended to, and write errors
as one line. A base module (any layer may import it): the trainers, the run directory's parts and
the report all write into run directories.

    with replaced(run / "report.html") as f:     # a fresh temp file beside it, fsync, rename over it
        f.write(page)
    log = open_append(run / "metrics.jsonl")      # a symbolic link there: GlassrlError naming it
    with disk_errors("metrics", run): ...         # ENOSPC and friends -> GlassrlError, one line

A run directory may hold symbolic links that glassrl did not make (a directory copied with
``cp -s``, a mistake, or a hostile neighbour); writing through one would change a file outside
the run. So nothing here follows a link: a file written whole goes to a fresh temp file
(``O_CREAT | O_EXCL | O_NOFOLLOW``) renamed over its name, which replaces a link there rather than
writing where it points (and a reader sees the old file or the new one, never a half-written
one); a file appended to is opened with ``O_NOFOLLOW``, and a link there is refused. The
fsync-then-rename sequence is the one recommended for crash-safe replacement (Pillai et al. 2014,
"All File Systems Are Not Created Equal", OSDI, §2 and §5).
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from glassrl.errors import GlassrlError

# What a full or read-only disk raises from any write: no space, quota, read-only, file too large.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})
# A new file of our own: never an existing one, never through a link.
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@contextmanager
def disk_errors(what: str, where: Path, only: frozenset[int] | None = None) -> Iterator[None]:
    """An OSError while writing (no space left, read-only file system, no permission) as one line;
    with ``only``, just those errno values (around code that also reads)."""
    try:
        yield
    except OSError as err:
        if only is not None and err.errno not in only:
            raise
        raise GlassrlError(f"{what}: cannot write under {where}: {err.strerror or err}") from None


def fsync(path: Path) -> None:
    """fsync(2) a file (its data) or a directory (its entries: new names, renames)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def replaced(path: str | Path) -> Iterator[TextIO]:
    """A text file (UTF-8) that replaces ``path`` when the block ends without an exception: written
    to a temp file beside it, fsynced, renamed over ``path`` (a link there is replaced, not
    followed), the directory fsynced. After an exception the temp file is removed and ``path`` is
    as it was. OSError is the caller's to word (:func:`disk_errors`)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with os.fdopen(os.open(tmp, _NEW, 0o666), "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def open_append(path: str | Path) -> TextIO:
    """``path`` opened to append UTF-8 text (created when missing); a symbolic link at ``path`` is a
    GlassrlError naming it and where it points, since appending would write there."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise GlassrlError(refusal(path)) from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


def refusal(path: Path) -> str:
    """The one line that refuses to write through the link ``path``."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"{path} is a symbolic link (to {target}): glassrl does not write through a link; remove it"


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if missing) for the ``with`` block: another
    process (or thread) asking for it waits. The kernel drops it when the holder dies, so a killed
    process never leaves it held. Not re-entrant: a second ``exclusive`` (or a RunLock) on the same file in
    the same process waits for itself, so each purpose has its own lock file."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
