"""The `glassrl` command: one sub-command per module in glassrl.commands.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``; it imports heavy libraries (torch, transformers) inside
``run`` so that ``glassrl --help`` stays fast. A :class:`GlassrlError` raised
anywhere becomes a one-line message and exit code 2, never a traceback; SIGINT (Ctrl-C) and
SIGTERM end a command with one line too, and exit code 128 + the signal (glassrl.run.stop).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from glassrl import __version__
from glassrl.errors import GlassrlError
from glassrl.run import stop

# name on the command line -> module in glassrl.commands
COMMANDS = {
    "demo": "glassrl.commands.demo",
    "explain": "glassrl.commands.explain",
    "init-model": "glassrl.commands.init_model",
    "sft": "glassrl.commands.sft",
    "rm": "glassrl.commands.rm",
    "dpo": "glassrl.commands.dpo",
    "train": "glassrl.commands.train",
    "eval": "glassrl.commands.eval",
    "generate": "glassrl.commands.generate",
    "report": "glassrl.commands.report",
    "diff": "glassrl.commands.diff",
    "audit": "glassrl.commands.audit",
    "export": "glassrl.commands.export",
    "config": "glassrl.commands.config",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; with ``only``, just that command's module is imported."""
    parser = argparse.ArgumentParser(prog="glassrl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"glassrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name)  # listed, not imported: keeps `glassrl explain` fast
            continue
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run, _parser=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=first if first in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    # key=value after an option (`glassrl train RUN/config.yaml --resume steps=120`): argparse
    # has closed the overrides list by then; they are overrides all the same
    if extra and isinstance(getattr(args, "overrides", None), list) and all(_is_override(e) for e in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _quiet_libraries()
    try:
        with stop.handling():  # Ctrl-C and SIGTERM: one line, not a traceback (glassrl.run.stop)
            return int(args._run(args) or 0)
    except GlassrlError as err:
        # one line whatever the message holds (a YAML error, a value with a newline in it)
        message = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"glassrl {args.command}: error: {message}", file=sys.stderr)
        return 2
    except stop.Stopped as stopped:  # a run that stopped between steps, or abandoned one, and says where
        print(f"glassrl {args.command}: {stopped}", file=sys.stderr)
        return stopped.exit_code
    except stop.Interrupted as signal:  # before a run's steps began, or a command without steps
        print(f"glassrl {args.command}: stopped by {stop.name(signal.signum)}", file=sys.stderr)
        return 128 + signal.signum


def _quiet_libraries() -> None:
    """glassrl's own lines are what a user reads: no Hugging Face progress bars ("Loading weights",
    "Writing model shards") unless HF_HUB_DISABLE_PROGRESS_BARS says otherwise. The variable reaches
    transformers when it is imported later and the processes started from here (Ray's workers);
    a transformers already imported is told directly."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _is_override(arg: str) -> bool:
    return not arg.startswith("-") and "=" in arg


if __name__ == "__main__":
    sys.exit(main())
