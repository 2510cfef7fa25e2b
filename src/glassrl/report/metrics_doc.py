"""The documented metric keys, read from docs/metrics.md (the single list of keys).

A key is documented when a table row of the page names it in its first cell, in
backticks, under a ``## `namespace/` `` heading. ``<name>`` in a row stands for one
path segment (any characters but ``/``), so ``perf/<phase>_s`` documents
``perf/generate_s``.

    is_documented("reward/arith_verify/mean")   # True
    undocumented(["reward/mean", "foo/bar"])     # ["foo/bar"]
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path

from glassrl.errors import GlassrlError

# The repository's docs/metrics.md (src/glassrl/report/ → three levels up).
DEFAULT_PATH = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"

# A namespace heading: "## `reward/`".
_HEADING = re.compile(r"^##\s+`([a-z0-9_]+)/`\s*$")
# A segment is a run of lowercase letters, digits, '_', '-', ':' and <placeholders>.
_SEGMENT = r"(?:[a-z0-9_\-:]|<[a-z_]+>)+"
KEY_PATTERN = re.compile(rf"^[a-z0-9_]+(?:/{_SEGMENT})+$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def rows(path: Path = DEFAULT_PATH) -> list[tuple[str, str]]:
    """(namespace of the section, key cell) for every key row of the page, in page order.

    Raises GlassrlError when the page is missing or a key row sits outside a namespace section.
    """
    if not Path(path).is_file():
        raise GlassrlError(f"{path}: the metrics documentation is missing")
    found, namespace = [], None
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("## "):
            heading = _HEADING.match(line)
            namespace = heading[1] if heading else None
            continue
        cells = [c.strip() for c in _CELL_SPLIT.split(line)]
        if len(cells) < 3 or cells[0] != "" or not re.fullmatch(r"`[^`]+`", cells[1]):
            continue  # not a table row whose first cell is a key in backticks
        if namespace is None:
            raise GlassrlError(f"{path}:{number}: key row {cells[1]} outside a '## `namespace/`' section")
        found.append((namespace, cells[1].strip("`")))
    return found


def documented_patterns(path: Path = DEFAULT_PATH) -> list[str]:
    """Every documented key pattern, in page order (placeholders kept: ``perf/<phase>_s``)."""
    return [key for _, key in rows(path)]


@functools.lru_cache(maxsize=8)
def _compiled(path: Path, mtime_ns: int) -> re.Pattern:
    """One regex for the page: its patterns as alternatives, each ``<name>`` → ``[^/]+``.

    Cached per (path, modification time): an edited page is read again.
    """
    alternatives = [
        "".join("[^/]+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<[a-z_]+>)", key) if part)
        for key in documented_patterns(path)
    ]
    return re.compile("|".join(f"(?:{a})" for a in alternatives))


def is_documented(key: str, path: Path = DEFAULT_PATH) -> bool:
    """True when a row of the page documents ``key`` (placeholders match one segment)."""
    path = Path(path)
    mtime_ns = path.stat().st_mtime_ns if path.is_file() else 0
    return _compiled(path, mtime_ns).fullmatch(key) is not None


def undocumented(keys: Iterable[str], path: Path = DEFAULT_PATH) -> list[str]:
    """The keys of ``keys`` that no row documents, sorted."""
    return sorted(k for k in set(keys) if not is_documented(k, path))
