"""Helpers of the crash and fault harness (tests/reliability): run a command as a user would and
read what it left behind. Imported as ``harness`` (pytest puts this directory on sys.path)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from glassrl.cli import main

# What `glassrl CMD` prints for a user's mistake: one line, exit code 2 (glassrl.cli).
ERROR_LINE = re.compile(r"^glassrl [a-z-]+: error: \S.*$")


def run_cli(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """(exit code, stdout, stderr lines) of ``glassrl ARGV`` run in this process."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, [line for line in captured.err.splitlines() if line.strip()]


def assert_one_error_line(capsys, argv: list, match: str) -> str:
    """``glassrl ARGV`` fails with exit code 2 and exactly one stderr line that matches ``match``."""
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2, (rc, err)
    errors = [line for line in err if not line.startswith(("Loading weights", "Writing model"))]
    assert len(errors) == 1 and ERROR_LINE.match(errors[0]), errors
    assert re.search(match, errors[0]), errors[0]
    return errors[0]


def strict_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file read as strict JSON (NaN or Infinity in it is an error)."""

    def refuse(token: str):
        raise ValueError(f"{path}: {token} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text(encoding="utf-8").splitlines()]


def without_perf(rows: list[dict]) -> list[dict]:
    """Metric rows without the wall-clock keys (perf/…), which no two runs share."""
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def checkpoint_contents(checkpoint: Path) -> dict[str, list[tuple[str, str]]]:
    """Each part's files and their sha256 (from the manifest, checked against the files by load)."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    return {name: [(f["path"], f["sha256"]) for f in entry["files"]] for name, entry in manifest["parts"].items()}


def in_a_child(path: Path, call: str, timeout_s: float) -> int | None:
    """A hostile-code test's control: ``call`` (``[name]`` or ``[table][name]`` of the file's globals,
    called with no argument) run in a child process of its own; its exit code, None when it still runs
    after ``timeout_s`` (it would have held its caller forever)."""
    code = f"import runpy; runpy.run_path({str(path)!r}){call}()"
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        return None


def glassrl_process(argv: list[str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    """``glassrl ARGV`` as a process of its own (a crash in it cannot end the test), on this sys.path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "glassrl.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
