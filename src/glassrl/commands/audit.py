"""`glassrl audit CONFIG [key=value ...] [--episodes N] [--script FILE] [--chat-template FILE]`: check a
multi-turn environment, its call format and chat template against the token convention (glassrl.rl.audit).

`glassrl audit --reward CONFIG [key=value ...] [--samples N] [--run DIR [--top N]]`: red-team the run's reward:
what it pays for responses that do not do the task (glassrl.diagnose.reward_redteam), mutations of reference
answers and, with --run, of the policy's own best-paid responses; exit 1 when one earns."""

from __future__ import annotations

import argparse

HELP = "run episodes of an environment (tools, chat template) and check its masks and re-rendering; exit 1 on a failure"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        help="YAML file of TrainConfig fields or a preset's name; its rollout.agent (environment, tools) or "
        "agentic data.train task is audited",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="override a config field, e.g. rollout.agent.tools=[calculator]",
    )
    parser.add_argument("--episodes", type=int, default=4, metavar="N", help="episodes to run (default 4)")
    parser.add_argument(
        "--script",
        metavar="FILE",
        help="JSON list of turn texts a scripted policy writes in every episode, instead of the model sampling",
    )
    parser.add_argument("--chat-template", metavar="FILE", help="Jinja chat template to use instead of the tokenizer's")
    parser.add_argument("--html", metavar="FILE", help="also write the table as an HTML page")
    parser.add_argument(
        "--reward",
        action="store_true",
        help="red-team the reward instead: score mutations of reference answers (empty, format only, the "
        "prompt copied, a wrong answer in the right format, padding, ...) and fail when one earns",
    )
    parser.add_argument(
        "--samples", type=int, default=32, metavar="N", help="with --reward: prompts of data.train mutated (default 32)"
    )
    parser.add_argument(
        "--run",
        metavar="DIR",
        help="with --reward: also the policy's own best-paid responses, from that run's ledgers, judged by the "
        "gold and mutated",
    )
    parser.add_argument(
        "--top", type=int, default=32, metavar="N", help="with --run: the best-paid responses taken (default 32)"
    )


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from glassrl import presets
    from glassrl.config import load_config
    from glassrl.diagnose.episode_audit import summary, table
    from glassrl.errors import GlassrlError
    from glassrl.jsonl import read_utf8
    from glassrl.report.html import write_audit_html
    from glassrl.rl.audit import audit_run
    from glassrl.rl.config import TrainConfig

    script = template = None
    if args.script is not None:
        if not Path(args.script).is_file():
            raise GlassrlError(f"--script: no file {args.script}")
        try:
            script = json.loads(read_utf8(args.script))
        except json.JSONDecodeError as err:
            raise GlassrlError(f"--script: {args.script}: not valid JSON: {err.msg} (line {err.lineno})") from None
        if not isinstance(script, list) or not script or not all(isinstance(t, str) for t in script):
            raise GlassrlError(f"--script: {args.script}: expected a non-empty JSON list of turn texts")
    if args.chat_template is not None:
        if not Path(args.chat_template).is_file():
            raise GlassrlError(f"--chat-template: no file {args.chat_template}")
        template = read_utf8(args.chat_template)
    cfg = load_config(TrainConfig, presets.config_file(args.config), args.overrides)
    if args.reward:
        from rich.console import Console

        from glassrl.rl.audit import red_team_config

        run = None
        if args.run is not None:
            run = Path(args.run)
            if not run.is_dir():
                raise GlassrlError(f"--run: no run directory {args.run}")
        reports = red_team_config(cfg, samples=args.samples, console=Console(stderr=True), run=run, top=args.top)
        print("\n\n".join("\n".join(report.table()) for report in reports))
        return 0 if all(report.ok for report in reports) else 1
    source = f"--chat-template {args.chat_template}"
    audits = audit_run(cfg, episodes=args.episodes, script=script, chat_template=template, template_source=source)
    print("\n".join(table(audits)))
    if args.html:
        print(write_audit_html(f"glassrl audit: {args.config}", *summary(audits), args.html))
    return 0 if all(a.ok for a in audits) else 1
