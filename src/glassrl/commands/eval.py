"""`glassrl eval RUN_OR_MODEL [DATA] [REWARD] [key=value ...] [--out DIR]`: evaluation without training."""

from __future__ import annotations

import argparse

from glassrl.commands.common import add_policy_arguments

HELP = "evaluate a run's policy or a model on prompts, as a training run evaluates: mean@k, pass@k, per group"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_policy_arguments(
        parser,
        "[DATA] [REWARD] [key=value]",
        "DATA: prompts to evaluate (data.test: a file or task:NAME/test); REWARD: file.py:function or "
        "module:function (a user reward), or a reward source's name; then overrides, e.g. logging.eval_k=8 "
        "(mean@8 and pass@k on 8 samples), data.eval_size=500, logging.eval_group_by=level",
        "*",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="where metrics.json and samples.jsonl go (output_dir=DIR says the same; default: runs/eval/NAME, "
        "NAME the run's or model's directory name, so that evaluations of different policies do not "
        "overwrite each other)",
    )


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rich.console import Console

    from glassrl.commands.common import is_override
    from glassrl.errors import GlassrlError
    from glassrl.rl.eval_only import eval_config, evaluate_policy
    from glassrl.run.atomic import write_text

    positional = [a for a in args.overrides if not is_override(a)]
    if len(positional) > 2:
        raise GlassrlError(f"at most DATA and REWARD before the key=value overrides; got {positional}")
    data, reward = (positional + [None, None])[:2]
    overrides = [a for a in args.overrides if is_override(a)]
    cfg, policy = eval_config(args.target, data, reward, overrides)
    console = Console()
    samples: list[dict] = []
    metrics = evaluate_policy(cfg, policy, console, samples)
    out = Path(args.out) if args.out is not None else default_out(args.target, overrides)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "metrics.json", json.dumps(metrics, indent=2, allow_nan=True) + "\n")
    rows = "".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in samples)
    write_text(out / "samples.jsonl", rows)
    k = cfg.logging.eval_k
    how = "greedy" if k == 1 else f"mean@{k}, {k} sampled responses each"
    prompts = len({row["prompt_index"] for row in samples})
    console.print(f"accuracy ({how}, {prompts} prompts): {metrics['eval/accuracy']:.3f}", markup=False)
    for key, value in metrics.items():
        if key != "eval/accuracy":
            console.print(f"  {key}: {value:.4g}", markup=False)
    console.print(
        f"samples: {out / 'samples.jsonl'} ({len(samples)} responses); metrics: {out / 'metrics.json'}",
        markup=False,
        soft_wrap=True,
    )
    return 0


def default_out(target: str, overrides: list[str]):
    """Where an evaluation goes without --out: output_dir=DIR when given (TRL's word for it), else
    runs/eval/NAME: the run's or model's directory name (a checkpoint's: RUN-step_N), so that a
    second policy's evaluation does not overwrite the first's (issue 44: always runs/eval)."""
    from pathlib import Path

    given = [a.partition("=")[2] for a in overrides if a.partition("=")[0].strip() == "output_dir"]
    if given:
        return Path(given[-1])
    path = Path(target).resolve() if Path(target).exists() else Path(target)
    name = f"{path.parent.parent.name}-{path.name}" if path.parent.name == "checkpoints" else path.name
    return Path("runs") / "eval" / (name or "model")
