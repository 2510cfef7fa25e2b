"""Reading a run directory written by ``glassrl train`` (glassrl.rl.loop): what the report shows.

    run = read_run("runs/ppo")
    run.metrics[-1]["reward/mean"]       # metrics.jsonl, one dict per logged step
    run.ledger(10)                        # ledgers/step_000010.jsonl as a Ledger

A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl``
(``{"step": n, key: value, ...}`` per logged step, glassrl.report.sinks),
``ledgers/step_XXXXXX.jsonl`` (a sample of the step's responses, Ledger.to_jsonl)
``watch.jsonl`` (the reward watch's alerts, when one fired: glassrl.diagnose.training_watch)
and, when the trainer wrote it, ``environment.json`` (:func:`collect_environment`
at the start of the run). A ``glassrl dpo`` run (``glassrl.json`` of kind "preference") holds
``<loss>_config.yaml`` instead of ``config.yaml`` and ``ledgers/preference.jsonl``, the
preference ledgers of its first held-out pairs (glassrl.ledger.preference). Without that file the
environment is collected when the report is written, and the report says so. Reads only files: no torch model, so a
run can be inspected offline.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import socket
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from glassrl import __version__
from glassrl.errors import GlassrlError
from glassrl.jsonl import load_json, read_utf8
from glassrl.ledger import Ledger, read_jsonl
from glassrl.ledger.preference import PreferenceLedger

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
LEDGERS = "ledgers"
ENVIRONMENT = "environment.json"
MARKER = "glassrl.json"  # what a supervised trainer's output is (glassrl.supervised)
PREFERENCE_LEDGERS = "preference.jsonl"  # under ledgers/, written by glassrl dpo
WATCH = "watch.jsonl"  # the reward watch's alerts, one JSON object a line (glassrl.diagnose.training_watch)
_LEDGER_NAME = re.compile(r"^step_(\d+)\.jsonl$")


@dataclass
class RunDir:
    """What one run directory holds; ``ledger_paths`` maps a step to its ledger file, in step order."""

    path: Path
    name: str
    config_text: str
    metrics: list[dict[str, Any]]
    ledger_paths: dict[int, Path]
    environment: dict[str, Any]
    environment_source: str  # where ``environment`` comes from, in words
    preference_ledgers: list[PreferenceLedger] = field(default_factory=list)  # glassrl dpo's held-out pairs
    alerts: list[dict[str, Any]] = field(
        default_factory=list
    )  # watch.jsonl: the reward watch's alerts (glassrl.diagnose.training_watch)
    _ledgers: dict[int, Ledger] = field(default_factory=dict, repr=False)

    def ledger(self, step: int) -> Ledger:
        """The ledger sample of ``step`` (read once)."""
        if step not in self.ledger_paths:
            have = ", ".join(map(str, self.ledger_paths)) or "none"
            raise GlassrlError(f"{self.path}: no ledger for step {step} (steps with a ledger: {have})")
        if step not in self._ledgers:
            with reading(self.ledger_paths[step]):
                self._ledgers[step] = read_jsonl(self.ledger_paths[step])
        return self._ledgers[step]


def read_run(path: str | Path, name: str | None = None) -> RunDir:
    """Read a run directory; GlassrlError naming the directory and what is missing when it is not one,
    or the file and line that is not UTF-8."""
    path = Path(path)
    resolved = _resolve(path)
    if not path.is_dir():
        raise GlassrlError(f"run directory {path}: not a directory")
    config = _config_name(path)
    missing = [n for n in (config, METRICS) if not regular_file(path / n)]
    if missing:
        raise GlassrlError(
            f"run directory {path}: missing {' and '.join(missing)} (is it a `glassrl train` output_dir?)"
        )
    env_path = path / ENVIRONMENT
    if regular_file(env_path):
        environment, source = _read_json_object(env_path), f"{env_path}, written by the run"
    else:
        environment = collect_environment()
        source = f"collected when the report was written ({path} has no {ENVIRONMENT})"
    return RunDir(
        path=path,
        name=name or resolved.name,
        config_text=read_text(path / config),
        metrics=read_metrics(path / METRICS),
        ledger_paths=ledger_paths(path),
        environment=environment,
        environment_source=source,
        preference_ledgers=_preference_ledgers(path / LEDGERS / PREFERENCE_LEDGERS),
        alerts=_alerts(path / WATCH),
    )


def _config_name(path: Path) -> str:
    """config.yaml, or a preference run's <loss>_config.yaml."""
    marker = path / MARKER
    if not regular_file(path / CONFIG) and regular_file(marker):
        summary = _read_json_object(marker)
        if summary.get("kind") == "preference":
            return f"{summary.get('loss')}_config.yaml"
    return CONFIG


def _preference_ledgers(path: Path) -> list[PreferenceLedger]:
    """The preference ledgers of ``path`` (one JSON object per line); none when it is absent."""
    if not regular_file(path):
        return []
    ledgers = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        try:
            ledgers.append(PreferenceLedger.from_dict(load_json(line)))
        except (ValueError, TypeError, KeyError) as err:
            raise GlassrlError(f"{path}:{lineno}: not a preference ledger ({err})") from None
    return ledgers


def _alerts(path: Path) -> list[dict[str, Any]]:
    """The alerts of ``path`` ({step, kind, level, message, rows} a line); none when it is absent."""
    if not regular_file(path):
        return []
    alerts = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        try:
            alert = load_json(line)
        except json.JSONDecodeError as err:
            raise GlassrlError(f"{path}:{lineno}: not valid JSON: {err.msg}") from None
        except ValueError as err:  # TooDeep, or an integer past the int-string limit
            raise GlassrlError(f"{path}:{lineno}: {err}") from None
        if not isinstance(alert, dict) or not {"step", "kind", "level", "message", "rows"} <= alert.keys():
            raise GlassrlError(f"{path}:{lineno}: expected an object with step, kind, level, message and rows")
        alerts.append(alert)
    return alerts


def _resolve(path: Path) -> Path:
    """The absolute path without links; a link loop is a GlassrlError (Python raises RuntimeError
    before 3.13, OSError ELOOP after)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        raise GlassrlError(f"run directory {path}: a symbolic link loop") from None


def read_runs(paths: list[str | Path]) -> list[RunDir]:
    """Several runs, named by their directory; the path as given where two names would clash."""
    names = [_resolve(Path(p)).name for p in paths]
    return [read_run(p, name if names.count(name) == 1 else str(p)) for p, name in zip(paths, names)]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl in file order; a last line cut short by a killed run is skipped.
    A row is an object with an integer ``step``; a number beyond a float's range (an integer of 400
    digits) or a value nested deeper than glassrl.jsonl.MAX_NESTING is a GlassrlError naming the line."""
    lines = read_text(path).split("\n")
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = load_json(line)
        except json.JSONDecodeError as err:
            if lineno == len(lines):  # no newline after it: written as the run was killed
                continue
            raise GlassrlError(f"{path}:{lineno}: not valid JSON: {err.msg}") from None
        except ValueError as err:  # TooDeep, or an integer past the int-string limit
            raise GlassrlError(f"{path}:{lineno}: {err}") from None
        if not isinstance(row, dict) or type(row.get("step")) is not int:
            raise GlassrlError(f"{path}:{lineno}: expected an object with an integer 'step'")
        for key, value in row.items():
            if type(value) is int and not -(2**1023) < value < 2**1023:
                raise GlassrlError(
                    f"{path}:{lineno}: {key}: an integer of {len(str(abs(value)))} digits, beyond a float's range"
                )
        rows.append(row)
    return rows


def ledger_paths(path: Path) -> dict[int, Path]:
    """{step: ledgers/step_XXXXXX.jsonl} in step order; empty when the run wrote no ledger. An entry
    of that name that is not a regular file (a FIFO, a link loop, a directory) is a GlassrlError:
    never left out in silence, never opened (a FIFO would block)."""
    found = {}
    if regular_file(path / LEDGERS, directory=True):
        with reading(path / LEDGERS):
            entries = list((path / LEDGERS).iterdir())
        for file in entries:
            match = _LEDGER_NAME.match(file.name)
            if match and regular_file(file):
                found[int(match[1])] = file
    return dict(sorted(found.items()))


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFREG: "a regular file",
}


def regular_file(path: Path, directory: bool = False) -> bool:
    """Whether ``path`` is a regular file (with ``directory``: a directory), links followed; False
    when nothing is there (a dangling link included). Anything else there is a GlassrlError naming
    it: a FIFO, socket or device (checked by its type, so it is never opened), a symbolic link loop,
    a directory where a file belongs, a path that cannot be looked at."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # nothing there, or a dangling link (to nothing): absent
        return False
    except OSError as err:
        why = "a symbolic link loop" if err.errno == errno.ELOOP else err.strerror or str(err)
        raise GlassrlError(f"{path}: cannot be read: {why}") from None
    want = stat.S_IFDIR if directory else stat.S_IFREG
    if stat.S_IFMT(mode) != want:
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise GlassrlError(f"{path}: {kind}, not {_KINDS[want]}: cannot be read as part of a run")
    return True


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """An OSError while reading ``path`` (permission, I/O) as a GlassrlError naming it."""
    try:
        yield
    except OSError as err:
        raise GlassrlError(f"{path}: cannot be read: {err.strerror or err}") from None


def read_text(path: Path) -> str:
    """glassrl.jsonl.read_utf8, an OSError a GlassrlError naming the file."""
    with reading(path):
        return read_utf8(path)


def collect_environment() -> dict[str, Any]:
    """Versions and machine of this process: what ``environment.json`` holds.

    Keys: python, platform, glassrl, torch, transformers, plotly (versions; None when
    not installed), device (the CUDA device's name, or "cpu"), cuda (torch's CUDA
    version or None), cpu_count, hostname.
    """
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "glassrl": __version__,
    }
    for module in ("torch", "transformers", "plotly"):
        env[module] = _version(module)
    env["device"], env["cuda"], torch_build = _device()
    env["torch"] = (
        torch_build or env["torch"]
    )  # torch.__version__ names the build (2.14.1+cu130), its wheel's metadata may not
    env["cpu_count"] = os.cpu_count()
    env["hostname"] = socket.gethostname()
    return env


def _version(module: str) -> str | None:
    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def _device() -> tuple[str, str | None, str | None]:
    """(device name, torch's CUDA version, torch.__version__); torch's None when it cannot be imported."""
    try:
        import torch  # here, not at the top: reading runs needs no torch (and may run where it is absent)
    except ImportError:
        return "cpu", None, None
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return name, torch.version.cuda, torch.__version__


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        obj = load_json(read_text(path))
    except json.JSONDecodeError as err:
        raise GlassrlError(f"{path}: not valid JSON: {err.msg} (line {err.lineno})") from None
    except ValueError as err:  # TooDeep, or an integer past the int-string limit
        raise GlassrlError(f"{path}: {err}") from None
    if not isinstance(obj, dict):
        raise GlassrlError(f"{path}: expected a JSON object of environment fields")
    return obj
