"""`glassrl sft CONFIG [key=value ...]`: supervised fine-tuning on prompt/response pairs."""

from __future__ import annotations

import argparse

HELP = "fine-tune a causal LM on prompt/response pairs (loss on response tokens only) and save it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        help="YAML file of SFTConfig fields, or the preset sft (examples/sft.yaml); "
        "left out: SFTConfig's defaults and the key=value given",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config field, e.g. optim.lr=3e-4")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from glassrl import presets
    from glassrl.config import load_config, print_resolved
    from glassrl.supervised.sft import SFTConfig, train_sft

    cfg = load_config(SFTConfig, *presets.config_and_overrides(args.config, args.overrides))
    console = Console()
    print_resolved(cfg, console)
    if cfg.model == "default":
        from glassrl.builtin.default_model import ensure_default_model

        ensure_default_model(console=console)  # built once, then cached
    train_sft(cfg, console=console)
    console.print(f"model written to: {cfg.output_dir}", markup=False)
    return 0
