"""`glassrl generate RUN_OR_MODEL PROMPT ... [key=value ...] [--n N] [--greedy]`: a few answers of a policy."""

from __future__ import annotations

import argparse

from glassrl.commands.common import add_policy_arguments

HELP = "sample a run's policy or a model on a few prompts, rendered as training renders them"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_policy_arguments(
        parser,
        "PROMPT | key=value",
        "text prompts, then overrides, e.g. rollout.max_new_tokens=256 rollout.temperature=0.7 data.system_prompt=...",
        "+",
    )
    parser.add_argument("--n", type=int, default=1, help="responses per prompt (default 1)")
    parser.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from glassrl.commands.common import is_override
    from glassrl.errors import GlassrlError
    from glassrl.jsonl import check_plain
    from glassrl.rl.eval_only import eval_config, generate

    prompts = [a for a in args.overrides if not is_override(a)]
    if not prompts:
        raise GlassrlError("give at least one PROMPT")
    if args.n < 1:
        raise GlassrlError(f"--n {args.n}: must be >= 1")
    for i, prompt in enumerate(prompts, 1):  # a shell's undecodable bytes arrive as lone surrogates ($'hi\xff')
        check_plain(prompt, "command line", f"PROMPT {i}")
    cfg, policy = eval_config(args.target, overrides=[a for a in args.overrides if is_override(a)])
    console = Console()
    answers = generate(cfg, prompts, args.n, greedy=args.greedy, policy_dir=policy, console=console)
    for prompt, responses in zip(prompts, answers):
        console.print(f"> {prompt}", markup=False, soft_wrap=True)
        for text, reason in responses:
            console.print(f"{text}  [{reason}]", markup=False, soft_wrap=True)
    return 0
