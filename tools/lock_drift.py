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

from packaging.requirements import Requirement


def locked(lock: Path) -> dict[str, str]:
    """name -> version of each ``name==version ; marker`` line whose marker holds here (a universal
    lock may hold two versions of a package, for two Pythons)."""
    pins = {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            requirement = Requirement(line.rstrip(" \\"))
            if requirement.marker is None or requirement.marker.evaluate():
                pins[_norm(requirement.name)] = str(requirement.specifier).removeprefix("==")
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock: Path) -> None:
    pins = locked(lock)
    installed = {_norm(d.metadata["Name"]): d.version for d in distributions()}
    changed = [f"  {n} {pins[n]} -> {v}" for n, v in sorted(installed.items()) if n in pins and pins[n] != v]
    outside = ("glassrl", "pip", "torch")  # installed beside the lock: the project, the installer, TORCH_SPEC
    extra = [f"  {n} {v} (not in the lock)" for n, v in sorted(installed.items()) if n not in pins and n not in outside]
    print(f"test-latest: torch {installed.get('torch')}; {len(changed)} packages newer or older than {lock.name}")
    print("\n".join(changed + extra))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
