"""`glassrl sft CONFIG [key=value ...]`: supervised fine-tuning on prompt/response pairs."""

from __future__ import annotations

import argparse

HELP = "fine-tune a causal LM on prompt/response pairs (loss on response tokens only) and save it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML file of SFTConfig fields (see examples/sft.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config field, e.g. steps=50")


def run(args: argparse.Namespace) -> int:
    import yaml
    from rich.console import Console

    from glassrl.config import load_config, to_dict
    from glassrl.trainer.sft import SFTConfig, train_sft

    cfg = load_config(SFTConfig, args.config, args.overrides)
    console = Console()
    console.print("[bold]glassrl sft[/bold]: resolved config")
    console.print(yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True).rstrip(), markup=False)
    train_sft(cfg, console=console)
    console.print(f"model written to: {cfg.output_dir}", markup=False)
    return 0
