"""`glassrl init-model [--agent] [--out DIR] [--seed N] [--force]`: build the embedded default model,
or its tool-using variant (``--agent``: glassrl.builtin.agent_model)."""

from __future__ import annotations

import argparse

HELP = "build the default model (tokenizer + small Llama trained on the bundled task) and cache it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent", action="store_true", help="the tool-using agent model (default-agent-v1, model.actor: default-agent)"
    )
    parser.add_argument(
        "--out", metavar="DIR", help="where to write it (default: $GLASSRL_HOME/models/default-v2, or default-agent-v1)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the weights' initialisation and the SFT data order (default 0)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete model is already there")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rich.console import Console

    from glassrl.builtin.agent_model import ensure_agent_model
    from glassrl.builtin.default_model import ensure_default_model
    from glassrl.errors import GlassrlError
    from glassrl.files import DISK_FULL, disk_errors
    from glassrl.models.default_model import AGENT_VERSION, MARKER, VERSION, default_model_dir
    from glassrl.run.lock import RunLock, sibling_lock_path

    console = Console()
    out = Path(args.out) if args.out is not None else default_model_dir(AGENT_VERSION if args.agent else VERSION)
    if out.exists() and not out.is_dir():
        raise GlassrlError(f"--out {out}: is a file, not a directory")
    # One build per directory: a second init-model into it is refused while the first runs.
    with disk_errors(f"--out {out}", out, only=DISK_FULL), RunLock(sibling_lock_path(out), f"--out {out}"):
        ensure = ensure_agent_model if args.agent else ensure_default_model
        path = ensure(out_dir=out, seed=args.seed, rebuild=args.force, console=console)
    info = json.loads((path / MARKER).read_text(encoding="utf-8"))
    if args.agent:
        return _agent_summary(path, info, console)
    acc, train = info["heldout_arith_verify"], info["train_arith_verify"]
    console.print(f"default model: {path}", markup=False, soft_wrap=True)
    console.print(
        f"  seed {info['seed']}, {info['parameters']:,} parameters, {info['sft_steps']} SFT steps, "
        f"train loss {info['train_loss']:.4f}, built in {info['build_time_s']}s",
        soft_wrap=True,
    )
    console.print(
        f"  arith-verify test ({acc['n']} prompts, greedy): exact {acc['exact']:.1%}, "
        f"verdict {acc['verdict']:.1%}, format {acc['format']:.1%}",
        soft_wrap=True,
    )
    console.print(
        f"  arith-verify train ({train['n']} prompts, greedy): exact {train['exact']:.1%}, "
        f"verdict {train['verdict']:.1%}, format {train['format']:.1%}",
        soft_wrap=True,
    )
    return 0


def _agent_summary(path, info: dict, console) -> int:
    """What ``--agent`` built: its size, SFT mix and held-out tool use."""
    console.print(f"agent model: {path}", markup=False, soft_wrap=True)
    console.print(
        f"  seed {info['seed']}, {info['parameters']:,} parameters, {info['sft_steps']} SFT steps, "
        f"train loss {info['train_loss']:.4f}, built in {info['build_time_s']}s",
        soft_wrap=True,
    )
    mix = ", ".join(f"{name} {share:.0%}" for name, share in info["sft_behaviours"].items())
    console.print(f"  SFT transcripts: {mix}", soft_wrap=True)
    for how in ("greedy", "sampled"):
        rates = info[f"heldout_tool_add_{how}"]
        console.print(
            f"  tool-add test ({rates['n']} prompts, {how}): valid calls {rates['valid_call']:.1%}, "
            f"correct {rates['correct']:.1%}",
            soft_wrap=True,
        )
    return 0
