"""`glassrl train CONFIG [key=value ...] [--resume] [--profile]`: RL training (PPO, GRPO and relatives)."""

from __future__ import annotations

import argparse

HELP = "train a policy with reinforcement learning (PPO, GRPO, ...) as CONFIG says; --resume continues a run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", help="YAML file of TrainConfig fields, or a preset's name (grpo, ppo, ...; see examples/*.yaml)"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="override a config field, e.g. actor_optim.lr=3e-4"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in output_dir (same config but steps, output_dir, logging; "
        "CONFIG may be the run's own config.yaml: glassrl train RUN/config.yaml --resume steps=120)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print the time per phase at the end, and write a torch profiler trace of the run's second step "
        "to output_dir/profile/ (glassrl.rl.profile)",
    )


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import math

    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from glassrl import presets
    from glassrl.config import load_config, print_resolved
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer
    from glassrl.rl.resolve import resolve

    hf_logging.disable_progress_bar()  # per-shard bars on every checkpoint would drown the progress bar
    cfg = load_config(TrainConfig, presets.config_file(args.config), args.overrides)
    console = Console()
    if args.resume and not any(o.partition("=")[0].strip() == "output_dir" for o in args.overrides):
        from glassrl.run.open import resumed_run_directory

        # a copied run's config.yaml names the original's output_dir: the copy is the run resumed
        out, note = resumed_run_directory(presets.config_file(args.config), cfg.output_dir)
        if note is not None:
            console.print(f"glassrl: {note}", markup=False, soft_wrap=True)
            cfg = dataclasses.replace(cfg, output_dir=str(out))
    print_resolved(resolve(cfg), console)
    trainer = Trainer(cfg, resume=args.resume, console=console)
    profiler = None
    if args.profile:
        from glassrl.rl.profile import StepProfiler

        first = trainer.counters.step + 1  # past 1 when resumed
        profiler = StepProfiler(trainer.out, at=first + 1 if cfg.steps > first else first, start=first)
        trainer.step = profiler.wrap(trainer.step)  # the step itself carries no profiling code
    metrics = trainer.train()
    if profiler is not None:
        console.print(profiler.table())
        if profiler.trace is not None:
            console.print(
                f"profiler trace: {profiler.trace} (open it in https://ui.perfetto.dev)", markup=False, soft_wrap=True
            )
    before = trainer.initial_eval
    after = metrics.get("eval/accuracy", math.nan)
    if trainer.test_records:
        start = f"{before:.3f} -> " if before is not None else ""
        k = cfg.logging.eval_k  # evaluation's k responses per prompt: greedy for 1, else sampled (mean@k)
        how = "greedy" if k == 1 else f"mean@{k}, {k} sampled responses each"
        console.print(f"held-out accuracy ({how}, {len(trainer.test_records)} prompts): {start}{after:.3f}")
    console.print(f"run directory: {cfg.output_dir}", markup=False, soft_wrap=True)
    if cfg.logging.report:
        console.print(f"report: {cfg.output_dir}/report.html (open it in a browser)", markup=False, soft_wrap=True)
    return 0
