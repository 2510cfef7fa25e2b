"""`glassrl rm CONFIG [key=value ...]`: train a reward model on preference pairs."""

from __future__ import annotations

import argparse

HELP = "train a reward model on preference pairs (Bradley–Terry loss) and report held-out pairwise accuracy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        help="YAML file of RMConfig fields, or the preset rm (examples/rm.yaml); "
        "left out: RMConfig's defaults and the key=value given",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config field, e.g. steps=50")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from glassrl import presets
    from glassrl.config import load_config, print_resolved
    from glassrl.supervised.rm import RMConfig, train_rm

    cfg = load_config(RMConfig, *presets.config_and_overrides(args.config, args.overrides))
    console = Console()
    print_resolved(cfg, console)
    if cfg.model == "default":
        from glassrl.builtin.default_model import ensure_default_model

        ensure_default_model(console=console)  # built once, then cached
    metrics = train_rm(cfg, console=console)
    console.print(
        f"held-out pairwise accuracy: {metrics['eval/accuracy']:.3f} "
        f"({int(metrics['eval_pairs'])} pairs; r_chosen > r_rejected, ties count as wrong)"
    )
    console.print(f"reward model written to: {cfg.output_dir}", markup=False)
    return 0
