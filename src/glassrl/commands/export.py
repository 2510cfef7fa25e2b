"""`glassrl export RUN_DIR|CHECKPOINT|POLICY_DIR --out DIR`: the trained policy as a plain Hugging Face model.

A LoRA policy's adapters are merged into its base weights (glassrl.models.lora.export_merged);
a full policy is copied. ``from_pretrained(DIR)`` then loads it without glassrl or peft.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write a run's policy (LoRA adapters merged) as a Hugging Face model that from_pretrained loads"

POLICY_PART = "actor"  # the checkpoint part holding the policy (glassrl.workers: the actor's "hf" part)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        metavar="RUN_DIR|CHECKPOINT",
        help="a run's output_dir (its latest checkpoint), a checkpoint directory (step_XXXXXXXX), "
        "or a policy directory (adapters or a model)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to write (must be new or empty)")


def policy_dir(source: Path) -> Path:
    """The policy directory that ``source`` names (see ``add_arguments``)."""
    from glassrl.errors import GlassrlError
    from glassrl.run.checkpoint import MANIFEST, CheckpointManager

    if (source / "checkpoints").is_dir():
        latest = CheckpointManager(source / "checkpoints", keep=1).latest()
        if latest is None:
            raise GlassrlError(f"{source}: the run has no checkpoint yet ({source / 'checkpoints'} has no 'latest')")
        source = latest
    if (source / MANIFEST).is_file():
        if not (source / POLICY_PART).is_dir():
            raise GlassrlError(f"{source}: checkpoint without a {POLICY_PART!r} part")
        return source / POLICY_PART
    if not source.is_dir():
        raise GlassrlError(f"{source}: no such directory")
    return source


def run(args: argparse.Namespace) -> int:
    from glassrl.models.lora import export_merged

    print(export_merged(policy_dir(Path(args.source)), Path(args.out)))
    return 0
