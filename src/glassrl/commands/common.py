"""What the demo-like commands share: the explain command run from a list of arguments, a run
directory emptied for a fresh run, and a wall-clock figure as they print it."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from glassrl.errors import GlassrlError


def run_explain(argv: list[str]) -> int:
    """``glassrl explain ARGV…`` in this process (the commands do not import the CLI)."""
    from glassrl.commands import explain

    parser = argparse.ArgumentParser(prog="glassrl explain")
    explain.add_arguments(parser)
    return explain.run(parser.parse_args(argv))


def fresh_run_dir(out: Path) -> None:
    """Empty a previous run in ``out``; refuse to delete anything that is not a run."""
    if not out.exists():
        return
    if any((out / name).exists() for name in ("config.yaml", "metrics.jsonl", "checkpoints")):
        shutil.rmtree(out)
    elif any(out.iterdir()):
        raise GlassrlError(f"--out: {out} is not empty and not a glassrl run directory; choose another --out")


def add_policy_arguments(parser: argparse.ArgumentParser, rest: str, rest_help: str, nargs: str) -> None:
    """``RUN_OR_MODEL`` and the free arguments after it (``overrides``: what cli.main adds stray
    key=value to) of the commands that ask a policy without training it (eval, generate)."""
    parser.add_argument(
        "target", metavar="RUN_OR_MODEL", help="a run directory or checkpoint (its config), or a model (defaults)"
    )
    parser.add_argument("overrides", nargs=nargs, metavar=rest, help=rest_help)


def is_override(arg: str) -> bool:
    """``key.path=value``, told from a prompt that holds "=" ("Is 1+1=2?"): a key is a dotted identifier."""
    key, sep, _ = arg.partition("=")
    return bool(sep) and all(part.isidentifier() for part in key.split("."))


def clock(seconds: float) -> str:
    """``3m05s``."""
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
