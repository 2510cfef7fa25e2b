"""`glassrl report RUN_DIR [RUN_DIR ...] [--out FILE] [--step N] [--lang en|zh]`: the run report as one HTML file."""

from __future__ import annotations

import argparse

from glassrl.ledger.phrases import LANGUAGES

HELP = "write one self-contained HTML report (learning curves, token view, config) of run directories"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="output_dir of a `glassrl train` run; several are overlaid for comparison",
    )
    parser.add_argument(
        "--out", metavar="FILE", help="HTML file to write (default: RUN_DIR/report.html of the first run)"
    )
    parser.add_argument(
        "--step",
        type=int,
        metavar="N",
        help="ledger step the token view shows first (default: the first run's last ledger step)",
    )
    parser.add_argument("--lang", choices=LANGUAGES, default="en", help="language of the token legend: en, zh")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from glassrl.diagnose.diff import diff_runs
    from glassrl.report.html import write_run_report

    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "report.html"
    # two runs: where they part, as `glassrl diff` says it (its checkpoints left to `glassrl diff`)
    divergence = diff_runs(*args.run_dirs, checkpoints=False).lines() if len(args.run_dirs) == 2 else None
    print(write_run_report(args.run_dirs, out, step=args.step, lang=args.lang, divergence=divergence))
    return 0
