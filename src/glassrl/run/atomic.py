"""Files and directories that appear whole or not at all, and write errors as one line.

    write_text(run / "config.yaml", text)          # temp file, fsync, rename, fsync the directory
    with StagedDir(Path("runs/sft")) as stage:      # sft / rm: every output goes to stage.path ...
        ...                                          # ... which replaces runs/sft when the block ends

Single files are written by glassrl.files (never through a link; one-line write errors,
``disk_errors``), on which this module builds.

:class:`StagedDir` writes into a hidden sibling ``.<name>.staging-<random>`` and, on success,
exchanges it with the output directory in one ``renameat2(RENAME_EXCHANGE)`` (Linux ≥ 3.15;
elsewhere two renames, with the old directory set aside first), then deletes the old one.
A run killed at any moment leaves the old outputs or the new ones, never old weights beside
new metrics. Files of the old directory that the new run does not write (a data file kept
there) are carried over; staging directories left by killed runs are removed by the next run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from glassrl.errors import GlassrlError
from glassrl.files import disk_errors, fsync, replaced


def write_durably(tmp: Path, data: bytes, final: Path | None = None) -> None:
    """Write ``data`` to ``tmp`` (never through a link) and fsync it; with ``final``, atomically rename
    it there and fsync the directory."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if final is not None:
        os.replace(tmp, final)
        fsync(final.parent)


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically: a reader sees the old file or the new one,
    and a link at ``path`` is replaced, not written through (glassrl.files.replaced).

    A write error (no space left) is a GlassrlError naming the file; the temp file is removed."""
    path = Path(path)
    with disk_errors(str(path), path.parent), replaced(path) as f:
        f.write(text)


class StagedDir:
    """Outputs written into ``self.path`` (a fresh sibling of ``target``) replace ``target`` as a whole
    when the ``with`` block ends without an exception; after an exception they are deleted."""

    def __init__(self, target: str | Path) -> None:
        self.target = Path(target).absolute()
        self.path = self.target.parent / f".{self.target.name}.staging-{secrets.token_hex(4)}"

    def __enter__(self) -> StagedDir:
        if self.target.exists() and not self.target.is_dir():
            raise GlassrlError(f"output_dir = {self.target}: is a file, not a directory")
        cwd = Path.cwd()
        if self.target.resolve() == cwd or self.target.resolve() in cwd.parents:  # swapped away under our feet
            raise GlassrlError(
                f"output_dir = {self.target}: holds the working directory; give outputs a directory of their own"
            )
        with disk_errors(f"output directory {self.target}", self.target.parent):
            self.target.parent.mkdir(parents=True, exist_ok=True)
            for old in self.target.parent.glob(f".{self.target.name}.staging-*"):  # left by killed runs
                shutil.rmtree(old, ignore_errors=True)
            self.path.mkdir()
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        with disk_errors(f"output directory {self.target}", self.target.parent):
            self.commit()

    def commit(self) -> None:
        """Carry over the old directory's other files (hard links: the old directory stays whole until
        the exchange), fsync, and exchange the two directories."""
        if self.target.is_dir():
            for entry in self.target.iterdir():
                if not (self.path / entry.name).exists():
                    _link_copy(entry, self.path / entry.name)
        for file in self.path.rglob("*"):
            if file.is_file():
                fsync(file)
        fsync(self.path)
        if self.target.exists() and _exchange(self.path, self.target):
            shutil.rmtree(self.path)  # now the old outputs
        else:
            aside = self.target.parent / f".{self.target.name}.old-{secrets.token_hex(4)}"
            if self.target.exists():
                os.rename(self.target, aside)
            os.rename(self.path, self.target)
            shutil.rmtree(aside, ignore_errors=True)
        fsync(self.target.parent)


def _link_copy(source: Path, dest: Path) -> None:
    """A hard-linked copy of a file or a tree (a plain copy where links are refused)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, dest, symlinks=True, copy_function=link)
    elif source.is_symlink():
        os.symlink(os.readlink(source), dest)
    else:
        link(str(source), str(dest))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True) if name else None
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


@contextmanager
def safetensors_os_errors() -> Iterator[None]:
    """A failed write of safetensors (its Rust core says "I/O error: No space left on device (os error
    28)") raised as the OSError it is, for :func:`disk_errors` and the callers' clean-up."""
    try:
        yield
    except SafetensorError as err:
        found = re.search(r"\(os error (\d+)\)", str(err))
        if found is None:
            raise
        code = int(found[1])
        raise OSError(code, os.strerror(code)) from err
