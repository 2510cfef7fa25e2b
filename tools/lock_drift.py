"""Which installed versions differ from the lock: what `make test-latest` tests beyond CI.

    python tools/lock_drift.py requirements-lock.txt

Prints one line per package whose installed version is not the locked one (and the packages
installed that the lock does not hold), so that a failure of the drift check names its suspects.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import distributions
from pathlib import Path


def locked(lock: Path) -> dict[str, str]:
    """name -> version of each ``name==version`` line (environment markers ignored: where the lock
    holds two versions for two Pythons, the last one read)."""
    pins = {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line)
        if match:
            pins[_norm(match.group(1))] = match.group(2)
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock: Path) -> None:
    pins = locked(lock)
    installed = {_norm(d.metadata["Name"]): d.version for d in distributions()}
    changed = [f"  {n} {pins[n]} -> {v}" for n, v in sorted(installed.items()) if n in pins and pins[n] != v]
    extra = [f"  {n} {v} (not in the lock)" for n, v in sorted(installed.items()) if n not in pins]
    print(f"test-latest: {len(changed)} packages newer or older than {lock.name}" + (":" if changed else ""))
    print("\n".join(changed + extra))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
