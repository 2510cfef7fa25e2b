"""`glassrl diff RUN_A RUN_B [--atol X] [--rtol Y]`: where two runs part, to the token (glassrl.diagnose.diff)."""

from __future__ import annotations

import argparse

HELP = "compare two run directories step by step and name their first divergence (exit 0 same, 1 differ)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="output_dir of a `glassrl train` run")
    parser.add_argument("run_b", metavar="RUN_B", help="the run to compare it with (a resume, another knob, Ray)")
    # read as strings: a value that is not a number is one line naming the flag (argparse adds its usage)
    parser.add_argument(
        "--atol", default="0", metavar="X", help="absolute tolerance: |a − b| <= atol + rtol·|b| (default 0)"
    )
    parser.add_argument("--rtol", default="0", metavar="Y", help="relative tolerance (default 0: exact)")


def run(args: argparse.Namespace) -> int:
    from glassrl.diagnose.diff import diff_runs
    from glassrl.errors import GlassrlError

    tolerances = []
    for flag, value in (("--atol", args.atol), ("--rtol", args.rtol)):
        try:
            tolerances.append(float(value))
        except ValueError:
            raise GlassrlError(f"{flag} {value!r}: expected a finite number >= 0") from None
    result = diff_runs(args.run_a, args.run_b, atol=tolerances[0], rtol=tolerances[1])
    print("\n".join(result.lines()))
    return 1 if result.differs else 0
