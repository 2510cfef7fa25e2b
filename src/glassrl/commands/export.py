"""`glassrl export RUN_DIR|CHECKPOINT|POLICY_DIR --out DIR`: the trained policy as a plain Hugging Face model.

A LoRA policy's adapters are merged into its base weights (glassrl.models.lora.export_merged);
a full policy is copied. ``from_pretrained(DIR)`` then loads it without glassrl or peft.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write a run's policy (LoRA adapters merged) as a Hugging Face model that from_pretrained loads"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        metavar="RUN_DIR|CHECKPOINT",
        help="a run's output_dir (its latest checkpoint), a checkpoint directory (step_XXXXXXXX), "
        "or a policy directory (adapters or a model)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to write (must be new or empty)")


def policy_dir(source: Path) -> Path:
    """The policy directory that ``source`` names: a run's or a checkpoint's policy
    (glassrl.run.open, its files verified), else ``source`` itself."""
    from glassrl.errors import GlassrlError
    from glassrl.run.open import open_checkpoint

    checkpoint = open_checkpoint(source)
    if checkpoint is not None:
        return checkpoint.actor
    if not source.is_dir():
        raise GlassrlError(f"{source}: no such directory")
    return source


def run(args: argparse.Namespace) -> int:
    from glassrl.models.lora import export_merged
    from glassrl.run.export import export_policy

    # from a verified checkpoint into a staged directory: a run pruning it mid-export costs a retry
    print(export_policy(Path(args.source), Path(args.out), locate=policy_dir, export=export_merged))
    return 0
