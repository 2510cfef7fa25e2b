"""`glassrl init-model [--agent [tool-add | research | reasoning-gym]] [--out DIR] [--seed N] [--force]`: install
the embedded default model, or a variant: ``--agent`` (or ``--agent tool-add``) the
calculator agent (glassrl.builtin.agent_model), ``--agent research`` the research agent of the
reference dialogue (glassrl.builtin.research_model), ``--agent reasoning-gym`` the model made for
reasoning-gym's chain_sum (glassrl.builtin.reasoning_gym_model; a build needs that extra). Seed 0
installs the package's shipped weights (glassrl.builtin.shipped); ``--force`` (or another seed) builds
the model here, and ``--force`` prints its figures beside the shipped build's.

`glassrl init-model --arch qwen2.5-0.5b | qwen3-0.6b [--layers N] [--dtype D] [--out DIR]`: a real-size
architecture with random weights and Qwen's real tokenizer and chat template (glassrl.builtin.qwen), to
run every command at the size users train, without a download."""

from __future__ import annotations

import argparse

AGENTS = ("tool-add", "research", "reasoning-gym")
ARCHS = ("qwen2.5-0.5b", "qwen3-0.6b")  # glassrl.builtin.qwen.ARCHITECTURES (not imported: start-up time)
HELP = (
    "install the default model (tokenizer + small Llama trained on the bundled tasks: the shipped weights, "
    "or built here with --force) into the cache"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent",
        nargs="?",
        const="tool-add",
        choices=AGENTS,
        help="a tool-using agent model: tool-add (the default; default-agent-v1, model.actor: default-agent) or "
        "research (default-research-v1, model.actor: default-research) or reasoning-gym (default-rg-v2, model.actor: "
        "default-rg)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="where to write it (default: $GLASSRL_HOME/models/default-v2, default-agent-v1, default-research-v1 "
        "or default-rg-v2)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the weights' initialisation and the SFT data order (default 0)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="build it here, even where the model is already there, and print its figures beside the shipped build's",
    )
    parser.add_argument(
        "--arch",
        choices=ARCHS,
        help="instead of a trained bundled model: this real architecture, random weights, Qwen2.5's tokenizer",
    )
    parser.add_argument(
        "--layers", type=int, metavar="N", help="with --arch: N decoder layers (the width and vocabulary kept)"
    )
    parser.add_argument(
        "--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="with --arch: weights' dtype"
    )


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rich.console import Console

    from glassrl.builtin.agent_model import ensure_agent_model
    from glassrl.builtin.default_model import ensure_default_model
    from glassrl.builtin.reasoning_gym_model import RG_VERSION, ensure_reasoning_gym_model
    from glassrl.builtin.research_model import ensure_research_model
    from glassrl.builtin.shipped import compare
    from glassrl.errors import GlassrlError
    from glassrl.files import DISK_FULL, disk_errors
    from glassrl.models.default_model import AGENT_VERSION, MARKER, RESEARCH_VERSION, VERSION, default_model_dir
    from glassrl.run.lock import RunLock, sibling_lock_path

    console = Console()
    if args.arch is not None:
        return _write_arch(args, console)
    if args.layers is not None:
        raise GlassrlError("--layers: only with --arch")
    version, ensure = {
        None: (VERSION, ensure_default_model),
        "tool-add": (AGENT_VERSION, ensure_agent_model),
        "research": (RESEARCH_VERSION, ensure_research_model),
        "reasoning-gym": (RG_VERSION, ensure_reasoning_gym_model),
    }[args.agent]
    out = Path(args.out) if args.out is not None else default_model_dir(version)
    if out.exists() and not out.is_dir():
        raise GlassrlError(f"--out {out}: is a file, not a directory")
    # One build per directory: a second init-model into it is refused while the first runs.
    with disk_errors(f"--out {out}", out, only=DISK_FULL), RunLock(sibling_lock_path(out), f"--out {out}"):
        path = ensure(out_dir=out, seed=args.seed, rebuild=args.force, console=console)
    info = json.loads((path / MARKER).read_text(encoding="utf-8"))
    if args.agent == "research":
        _research_summary(path, info, console)
    elif args.agent == "reasoning-gym":
        _reasoning_gym_summary(path, info, console)
    elif args.agent:
        _agent_summary(path, info, console)
    else:
        _default_summary(path, info, console)
    if args.force:  # built here: its figures beside the shipped build's
        for line in compare(version, info, path):
            console.print(line, markup=False, soft_wrap=True)
    return 0


def _default_summary(path, info: dict, console) -> None:
    """What the default build made: its size, SFT and held-out arith-verify figures."""
    acc, train = info["heldout_arith_verify"], info["train_arith_verify"]
    _built("default model", path, info, console)
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


def _write_arch(args: argparse.Namespace, console) -> int:
    """``--arch``: a random-weight model of a real configuration, Qwen2.5's tokenizer beside it."""
    import json
    from pathlib import Path

    from glassrl.builtin.qwen import write_qwen_model
    from glassrl.errors import GlassrlError
    from glassrl.files import DISK_FULL, disk_errors
    from glassrl.models.default_model import default_model_dir
    from glassrl.run.lock import RunLock, sibling_lock_path

    if args.agent is not None:
        raise GlassrlError("--arch and --agent: choose one")
    name = args.arch + (f"-{args.layers}l" if args.layers is not None else "") + f"-random-{args.dtype}"
    out = Path(args.out) if args.out is not None else default_model_dir(name)
    if (out / "glassrl-arch.json").is_file() and not args.force:
        console.print(f"{args.arch}: {out} (already written; --force writes it again)", markup=False, soft_wrap=True)
        return 0
    if out.exists() and not out.is_dir():
        raise GlassrlError(f"--out {out}: is a file, not a directory")
    with disk_errors(f"--out {out}", out, only=DISK_FULL), RunLock(sibling_lock_path(out), f"--out {out}"):
        path = write_qwen_model(args.arch, out, layers=args.layers, seed=args.seed, dtype=args.dtype)
    info = json.loads((path / "glassrl-arch.json").read_text(encoding="utf-8"))
    console.print(f"{args.arch}: {path}", markup=False, soft_wrap=True)
    console.print(
        f"  {info['layers']} layers, {info['parameters']:,} parameters, {args.dtype}, random weights (seed "
        f"{args.seed}); Qwen2.5's tokenizer (151,665 ids, embedding of 151,936 rows) and chat template with tools. "
        f"Train it with model.actor={path}",
        soft_wrap=True,
        markup=False,
    )
    return 0


def _agent_summary(path, info: dict, console) -> None:
    """What ``--agent`` built: its size, SFT mix and held-out tool use."""
    _built("agent model", path, info, console)
    _mix(info, console)
    for how in ("greedy", "sampled"):
        rates = info[f"heldout_tool_add_{how}"]
        console.print(
            f"  tool-add test ({rates['n']} prompts, {how}): valid calls {rates['valid_call']:.1%}, "
            f"correct {rates['correct']:.1%}",
            soft_wrap=True,
        )


def _reasoning_gym_summary(path, info: dict, console) -> None:
    """What ``--agent reasoning-gym`` built: its size, SFT and held-out chain_sum accuracy (greedy)."""
    _built("reasoning-gym model", path, info, console)
    held_out, train = info["heldout_reasoning_gym"], info["train_reasoning_gym"]
    console.print(
        f"  chain_sum, evaluation seed ({held_out['n']} entries, greedy): {held_out['accuracy']:.1%} "
        f"({held_out['accuracy_unseen']:.1%} on the {held_out['unseen']:.0%} whose question no SFT example asks); "
        f"training seed ({train['n']}): {train['accuracy']:.1%}",
        soft_wrap=True,
    )


def _research_summary(path, info: dict, console) -> None:
    """What ``--agent research`` built: its size, SFT mix, held-out rubric and decision probability."""
    _built("research-agent model", path, info, console)
    _mix(info, console)
    rates = info["heldout_research_sampled"]
    console.print(
        f"  research test ({rates['n']} episodes, sampled): rubric score {rates['score']:.2f} of 2.5, "
        f"accuracy {rates['accuracy']:.1%}, temporal {rates['temporal']:.1%}, citation {rates['citation']:.1%}; "
        "opened " + ", ".join(f"{kind} {share:.0%}" for kind, share in rates["opened"].items() if share),
        soft_wrap=True,
    )
    decision = info["heldout_decision"]
    console.print(
        f"  π(open the official page | s_4), mean over {decision['n']} episodes: {decision['official']:.3f} "
        f"(rumour {decision['rumour']:.3f}, forecast {decision['forecast']:.3f}, news {decision['news']:.3f})",
        soft_wrap=True,
    )


def _built(what: str, path, info: dict, console) -> None:
    """The model's directory, seed, size and SFT; whether its weights are the shipped ones."""
    from glassrl.builtin.shipped import is_shipped

    where = "the shipped weights, built" if is_shipped(info.get("version", ""), path) else "built"
    console.print(f"{what}: {path}", markup=False, soft_wrap=True)
    console.print(
        f"  seed {info['seed']}, {info['parameters']:,} parameters, {info['sft_steps']} SFT steps, "
        f"train loss {info['train_loss']:.4f}, {where} in {info['build_time_s']}s",
        soft_wrap=True,
    )


def _mix(info: dict, console) -> None:
    """An agent model's SFT transcripts: each behaviour's share."""
    mix = ", ".join(f"{name} {share:.0%}" for name, share in info["sft_behaviours"].items())
    console.print(f"  SFT transcripts: {mix}", soft_wrap=True)
