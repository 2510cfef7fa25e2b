"""`glassrl dpo CONFIG [key=value ...] [--resume]`: offline preference optimisation (DPO, RPO, IPO, SimPO, CPO, ORPO,
BCO, KTO)."""

from __future__ import annotations

import argparse

HELP = (
    "train a policy on preference data offline (DPO, RPO, IPO, SimPO, CPO, ORPO, BCO; KTO on labelled responses); "
    "--resume continues"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        help="YAML file of PreferenceConfig fields, or a preset: dpo, kto, cpo, orpo, bco (examples/NAME.yaml); "
        "left out: PreferenceConfig's defaults and the key=value given",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config field, e.g. beta=0.2")
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in output_dir from its latest checkpoint"
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from glassrl import presets
    from glassrl.config import load_config, print_resolved
    from glassrl.supervised.preference import train_preference
    from glassrl.supervised.preference_config import PreferenceConfig

    cfg = load_config(PreferenceConfig, *presets.config_and_overrides(args.config, args.overrides))
    console = Console()
    print_resolved(cfg, console)
    if cfg.model == "default":
        from glassrl.builtin.default_model import ensure_default_model

        ensure_default_model(console=console)  # built once, then cached
    metrics = train_preference(cfg, console=console, resume=args.resume)
    if "eval/rewards/accuracies" in metrics:
        console.print(
            f"held-out preference accuracy: {metrics['eval/rewards/accuracies']:.3f} "
            f"({int(metrics['eval_pairs'])} pairs; implicit reward r_chosen > r_rejected, ties count as wrong)"
        )
    else:  # KTO on held-out examples of its own form: no pairs to compare
        console.print(
            f"held-out KTO loss: {metrics['eval/loss']:.4f}, reward margin {metrics['eval/rewards/margins']:.4f} "
            f"({int(metrics['eval_examples'])} labelled examples)"
        )
    console.print(f"policy written to: {cfg.output_dir}", markup=False)
    return 0
