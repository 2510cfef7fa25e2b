"""`glassrl demo [--algo grpo | --task tool-add] [--steps N] [--out DIR] [--resume] [key=value ...]` (``make demo``):
reinforcement learning on a CPU in minutes, then its ledger.

What it does, in order:

1. The embedded default model (glassrl.models.default_model): the package's shipped weights,
   copied on first use (sha256 checked: glassrl.builtin.shipped) into
   ``~/.cache/glassrl/models/default-v2``, then reused.
2. Training with the preset ``--algo`` (glassrl/presets/<algo>.yaml, package data; in a
   checkout also examples/<algo>.yaml) by the code ``glassrl train`` runs
   (glassrl.rl.loop.Trainer), with its progress bar. Before the first step and after
   the last, the trainer answers the first ``data.eval_size`` prompts of the arith-verify
   test split greedily; the task's verifier judges them (verdict and sum both right, in the
   question's language).
3. Held-out accuracy before and after, and the run directory.
4. The ledger of the reference example ("请问1+1=2？" → "是的，等于2！") on the trained
   model: the ``glassrl explain --model`` command, printed, then run in-process. Under a
   group estimator the response is explained within a group: itself and 3 sampled ones.

``--task research`` (``make demo TASK=research``) trains the reference dialogue's research agent
with PPO and with GRPO side by side (glassrl.commands.demo_research).

``--task tool-add`` (``make demo TASK=tool-add``) runs the same four steps on an agentic task
(docs/agentic.md) with the task's preset (``presets.TASKS``: glassrl/presets/tool_add.yaml):

1. the tool-using agent model (glassrl.builtin.agent_model), its shipped weights copied on
   first use into ``~/.cache/glassrl/models/default-agent-v1`` (``glassrl init-model --agent
   --force`` builds it here instead);
2. GRPO on tool-add: each response is several turns, its calculator calls run and their results
   read back as observation tokens (in the context, out of every loss);
3. on held-out prompts, before and after: the rate of valid tool calls (a call that ran), of
   correct final answers, and of calls at all (valid or not);
4. the ledger of sampled responses to the first held-out prompt: every turn, the observation
   tokens marked ``obs``.

``--control random`` (or ``shuffled``; ``make demo CONTROL=random``) trains the same run a second time
on a reward that means nothing (``reward.control``, glassrl.rewards.control) and sets its held-out
accuracy beside the real one: a gain means little until it is shown beside what a meaningless reward
gives (Shao et al. 2025, arXiv:2506.10947).

The token convention on given numbers, without a model (λ = 0.95, 0 and 1, a GRPO group), is
docs/token-convention.md: each of its tables is a ``glassrl explain --input`` command.

Decisions (the demo's own overrides of the preset; ``key=value`` arguments come after them):

- ``output_dir = runs/demo-<algo>``, emptied first unless ``--resume``: every demo starts
  from the same weights, so two runs print the same figures (the preset's seed, CPU,
  deterministic kernels; glassrl.optim.seed_everything).
- ``logging.eval_every = 0``: evaluate only before the first and after the last step; the
  figures are the same, the minutes of the evaluations in between are saved.
- ``logging.checkpoint_every = 0``: one checkpoint, after the last step (what explain reads).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

from glassrl import presets
from glassrl.errors import GlassrlError

HELP = "train a preset (default grpo) on the bundled task in minutes, show accuracy before/after and a ledger"
PROMPT, RESPONSE = "请问1+1=2？", "是的，等于2！"
GROUP_SAMPLES = 3  # sampled companions of the reference response under a group estimator
TASK_SAMPLES = 4  # --task: sampled responses explained, a group of them (GRPO compares them)
DEMO_OVERRIDES = ["logging.eval_every=0", "logging.checkpoint_every=0"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algo", help=f"RL preset (default grpo): {', '.join(presets.rl_names())}")
    p.add_argument(
        "--task", metavar="NAME", help=f"instead of --algo: an agentic task's demo, {', '.join(presets.TASKS)}"
    )
    p.add_argument("--steps", metavar="N", type=int, help="training steps (default: the preset's)")
    p.add_argument("--out", metavar="DIR", help="run directory (default runs/demo-ALGO, runs/demo-TASK)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out instead of starting afresh")
    p.add_argument("--pipeline", metavar="NAME", help="instead of --algo: a whole pipeline, rlhf (SFT → RM → PPO)")
    p.add_argument(
        "--offline",
        action="store_true",
        help="with --pipeline rlhf: the offline branch instead, SFT → DPO on the same pairs "
        "(no reward model, no sampling)",
    )
    p.add_argument(
        "--control",
        choices=["random", "shuffled"],
        help="then train the same run on a meaningless reward (reward.control: random coins, or the real scores "
        "shuffled) and set its held-out accuracy beside the real one (Shao et al. 2025, arXiv:2506.10947)",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="more config overrides, e.g. actor_optim.lr=1e-3")


def run(args: argparse.Namespace) -> int:
    """Model, training, before/after, explain (the module docstring's steps 1–4)."""
    if args.pipeline is not None:  # glassrl.commands.pipeline: SFT → reward model → PPO (or → DPO)
        from glassrl.commands import pipeline

        return pipeline.run(args)
    if args.offline:
        raise GlassrlError("--offline: only with --pipeline rlhf (its offline branch, DPO)")
    if args.control is not None and (args.pipeline is not None or args.task == "research"):
        raise GlassrlError("--control: only with --algo or --task tool-add (one run and its held-out accuracy)")
    if args.task == "research":  # glassrl.commands.demo_research: PPO and GRPO side by side
        from glassrl.commands import demo_research

        return demo_research.run(args)
    from rich.console import Console
    from rich.rule import Rule
    from transformers.utils import logging as hf_logging

    from glassrl.commands.common import clock, fresh_run_dir, run_explain
    from glassrl.config import load_config, print_resolved
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.resolve import resolve

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    start = time.perf_counter()
    hf_logging.disable_progress_bar()  # per-shard bars on every load would drown the progress bar
    preset, name = _preset(args)
    out = Path(args.out or f"runs/demo-{name}")
    overrides = [
        f"output_dir={out}",
        *DEMO_OVERRIDES,
        *([f"steps={args.steps}"] if args.steps else []),
        *args.overrides,
    ]
    cfg = load_config(TrainConfig, presets.path(preset), overrides)
    resolved = resolve(cfg)

    console.print(Rule(f"1. the model ({cfg.model.actor})"))
    _model(cfg, console)
    model_s = time.perf_counter() - start

    console.print(Rule(f"2. training: the {preset} preset, {cfg.steps} steps → {out}"))
    if not args.resume:
        fresh_run_dir(out)
    print_resolved(resolved, console)
    from glassrl.rl.loop import Trainer

    Trainer(cfg, resume=args.resume, console=console).train()
    train_s = time.perf_counter() - start - model_s

    if args.task is None:
        console.print(Rule("3. held-out accuracy"))
        console.print(summary_table(out / "metrics.jsonl", cfg))
    else:
        console.print(Rule("3. held-out tool use and accuracy"))
        console.print(tool_table(out / "metrics.jsonl", cfg))
    console.print(f"run directory: {out}", markup=False, soft_wrap=True)
    if (Path(out) / "report.html").is_file():  # written by the trainer at the end of the run (logging.report)
        console.print(
            f"report: {Path(out) / 'report.html'} (learning curves and token view; open in a browser)",
            markup=False,
            soft_wrap=True,
        )

    control_s = 0.0
    if args.control is not None:  # the same run on a meaningless reward (glassrl.rewards.control)
        control_out = out.with_name(f"{out.name}-control-{args.control}")
        console.print(Rule(f"3b. the control: the same run, trained on a {args.control} reward → {control_out}"))
        if not args.resume:
            fresh_run_dir(control_out)
        control_overrides = [*overrides, f"output_dir={control_out}", f"reward.control={args.control}"]
        control_cfg = load_config(TrainConfig, presets.path(preset), control_overrides)
        Trainer(control_cfg, resume=args.resume, console=console).train()
        control_s = time.perf_counter() - start - model_s - train_s
        console.print(control_table(out / "metrics.jsonl", control_out / "metrics.jsonl", args.control))
        console.print(f"both runs' curves overlaid: glassrl report {out} {control_out}", markup=False, soft_wrap=True)

    from glassrl.algos.advantages import GROUP_ESTIMATORS

    if args.task is None:
        console.print(Rule("4. the reference example on the trained model"))
        command = ["explain", "--model", str(out), "--prompt", PROMPT, "--response", RESPONSE]
        if cfg.algo.advantage in GROUP_ESTIMATORS:
            command += ["--sample", str(GROUP_SAMPLES)]
    else:
        console.print(Rule("4. multi-turn responses to a held-out prompt, on the trained model (obs = observation)"))
        from glassrl.data.tasks import load_task

        prompt = load_task(args.task, "test", seed=cfg.seed, size=1)[0].prompt
        command = ["explain", "--model", str(out), "--prompt", prompt, "--sample", str(TASK_SAMPLES)]
    console.print(f"$ glassrl {shlex.join(command)}", style="bold cyan", markup=False, soft_wrap=True)
    sys.stdout.flush()
    code = run_explain(command[1:])
    total = time.perf_counter() - start
    control = f", control {clock(control_s)}" if args.control is not None else ""
    console.print(
        f"demo finished in {clock(total)} (model {clock(model_s)}, training {clock(train_s)}{control}, "
        f"explain {clock(total - model_s - train_s - control_s)})"
    )
    return code


def _preset(args: argparse.Namespace) -> tuple[str, str]:
    """(the preset to train, the demo's name for its run directory) of ``--algo`` or ``--task``."""
    if args.task is not None:
        if args.algo is not None:
            raise GlassrlError(f"--algo: not with --task (the task's preset {presets.TASKS.get(args.task)} sets it)")
        if args.task not in presets.TASKS:
            raise GlassrlError(f"--task: no demo for task {args.task!r}; valid: {', '.join(presets.TASKS)}")
        return presets.TASKS[args.task], args.task
    algo, valid = args.algo or "grpo", presets.rl_names()
    if algo not in valid:
        raise GlassrlError(f"--algo: unknown preset {algo!r}; valid: {', '.join(valid)}")
    return algo, algo


def _model(cfg, console) -> None:
    """Build (or find) the model and say what it is."""
    from glassrl.builtin.registry import BUILTIN_MODELS, REBUILD

    if cfg.model.actor not in BUILTIN_MODELS:
        console.print(f"model: {cfg.model.actor}", markup=False, soft_wrap=True)
        return
    from glassrl.models.default_model import MARKER

    path = BUILTIN_MODELS[cfg.model.actor](console=console)
    info = json.loads((path / MARKER).read_text(encoding="utf-8"))
    console.print(
        f"{cfg.model.actor} model: {path} ({info['parameters']:,} parameters, built in {info['build_time_s']:g} s; "
        f"rebuild: glassrl init-model {REBUILD[cfg.model.actor]})",
        markup=False,
    )


def accuracies(metrics_file: Path) -> dict[str, tuple[float, float]]:
    """{"all": (eval/accuracy before the first step, after the last), and the same for each
    eval/accuracy/<group> (logging.eval_group_by)} from a run's metrics.jsonl."""
    first, last = _first_and_last_evaluation(metrics_file)
    out = {"all": (first["eval/accuracy"], last["eval/accuracy"])}
    for key in first:
        if key.startswith("eval/accuracy/") and key in last:
            out[key.removeprefix("eval/accuracy/")] = (first[key], last[key])
    return out


def _first_and_last_evaluation(metrics_file: Path) -> tuple[dict, dict]:
    """The metric rows of the evaluation before the first step and of the last one."""
    from glassrl.report.run_dir import read_metrics

    evals = [r for r in read_metrics(metrics_file) if "eval/accuracy" in r]
    if not evals or evals[0]["step"] != 0:
        raise GlassrlError(f"{metrics_file}: no evaluation before the first step (is data.eval_size 0?)")
    return evals[0], evals[-1]


def summary_table(metrics_file: Path, cfg):
    """A line saying what was measured, then a rich table: accuracy before, after, the change in
    points; one row for all prompts, then one per group of ``logging.eval_group_by``."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from glassrl.rl.build import test_spec

    what = Text(
        f"greedy answers to the first {cfg.data.eval_size} prompts of {test_spec(cfg)}, judged by the task's "
        "verifier (verdict and sum both right, in the question's language):"
    )
    table = Table()
    table.add_column("prompts")
    for name in ("before training", "after training", "change"):
        table.add_column(name, justify="right")
    for group, (before, after) in accuracies(metrics_file).items():
        label = "all" if group == "all" else f"{cfg.logging.eval_group_by} = {group}"
        table.add_row(label, _percent(before), _percent(after), _change(before, after))
    return Group(what, table)


def control_table(real_metrics: Path, control_metrics: Path, kind: str):
    """--control: held-out accuracy before, after the real reward, after the control's, and the two gains."""
    from rich.table import Table

    before, after = accuracies(real_metrics)["all"]
    control_before, control_after = accuracies(control_metrics)["all"]
    table = Table(title=f"held-out accuracy: the real reward beside a {kind} one (same model, data, seeds)")
    for name in ("before training", "after, real reward", f"after, {kind} reward", "gain", "gain of the control"):
        table.add_column(name, justify="right")
    table.add_row(
        _percent(before),
        _percent(after),
        _percent(control_after),
        _change(before, after),
        _change(control_before, control_after),
    )
    return table


# --task: the held-out figures of the table (eval/ metrics, docs/metrics.md) and their row labels
TOOL_ROWS = {
    "eval/tool/valid_call_rate": "valid tool calls (a call that ran)",
    "eval/accuracy": "correct answers",
    "eval/tool/call_rate": "tool calls, valid or not",
}


def tool_rates(metrics_file: Path) -> dict[str, tuple[float, float]]:
    """{metric of ``TOOL_ROWS``: (before the first step, after the last)} from a run's metrics.jsonl."""
    first, last = _first_and_last_evaluation(metrics_file)
    return {key: (first[key], last[key]) for key in TOOL_ROWS if key in first and key in last}


def tool_table(metrics_file: Path, cfg):
    """--task: a line saying what was measured, then the rates of ``TOOL_ROWS`` before, after and the change."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from glassrl.rl.build import test_spec

    k = cfg.logging.eval_k
    how = "greedy answers" if k == 1 else f"{k} answers sampled at temperature {cfg.rollout.temperature:g}"
    what = Text(
        f"{how} to each of the first {cfg.data.eval_size} prompts of {test_spec(cfg)}, multi-turn with the "
        "task's tools; correct = the final answer's last number is the reference (the task's verifier):"
    )
    table = Table()
    table.add_column("held-out responses")
    for name in ("before training", "after training", "change"):
        table.add_column(name, justify="right")
    for key, (before, after) in tool_rates(metrics_file).items():
        table.add_row(TOOL_ROWS[key], _percent(before), _percent(after), _change(before, after))
    return Group(what, table)


def _percent(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.1f}%"


def _change(before: float, after: float) -> str:
    change = (after - before) * 100
    return "—" if math.isnan(change) else f"{change:+.1f} points"
