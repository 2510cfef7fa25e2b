"""`glassrl demo --task research` (``make demo TASK=research``): the reference dialogue's research
agent, trained with PPO and with GRPO, and where the credit went.

The story (dialogue-agentic-rl-rubric-reward.md): asked for a company's results, the agent
searches, opens one page at its decision step t = 4 (the official release, a rumour, a forecast
or a news report), and writes a report the rubric scores (accuracy 1 + temporal 1 + citation 0.5).
What it prints, in order:

1. the research-agent model (glassrl.builtin.research_model), its shipped weights copied on first use;
2. two runs from the same model on the same episodes: the ``research_ppo`` preset (a critic, GAE:
   token-level credit) and ``research_grpo`` (the group-standardised score on every token:
   task-level credit), each with its progress bar, into ``runs/demo-research/{ppo,grpo}``;
3. on held-out episodes (companies no training episode names; 2 samples each at temperature 1):
   the rubric score and each criterion's pass rate before training and after each run;
4. the decision probability, the dialogue's π(a_4 | s_4): at s_4 (the prompt, a careful agent's
   search and the results the environment returned) the probability of the call that opens the
   official page, the product of its tokens' probabilities, averaged over the held-out episodes;
   before and after each run, then token by token for the first held-out episode;
5. where the credit went: from each run's own ledgers (the advantages its updates used), a
   response that opened the official page and one that opened the rumour, turn by turn (Σ A_i,
   mean A_i), the open_page call token by token (PPO: V(s_i), δ_i, A_i; GRPO: A_i), and what V
   does across the page the agent read;
6. the ``glassrl explain --model`` commands that sample episodes of a held-out question with each
   trained policy and print their full ledgers, every turn (and each run's report.html).

Decisions: each run's ``output_dir`` is emptied first unless ``--resume``; one evaluation before
the first step and one after the last (``logging.eval_every = 0`` in the presets), one checkpoint
after the last step; ``--steps`` and ``key=value`` overrides apply to both runs.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path

from glassrl import presets
from glassrl.errors import GlassrlError

RUNS = {"ppo": "research_ppo", "grpo": "research_grpo"}  # name -> preset
OVERRIDES = ["logging.checkpoint_every=0"]
# The held-out figures of the table (eval/ metrics, docs/metrics.md) and their labels.
ROWS = {
    "eval/reward/mean": "rubric score Σ w_i·s_i (of 2.5)",
    "eval/accuracy": "full marks (2.5 of 2.5)",
    "eval/reward/rubric/accuracy/mean": "accuracy (w = 1): the official figure",
    "eval/reward/rubric/temporal/mean": "temporal (w = 1): period named, nothing unreported as fact",
    "eval/reward/rubric/citation/mean": "citation (w = 0.5): \\cite{the official release}",
}
TRAPS = ("rumour", "forecast")  # the trap whose credit is shown beside the official page's, in this preference
EXPLAIN_SAMPLES = 8  # episodes sampled by the explain commands printed last


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.rule import Rule
    from transformers.utils import logging as hf_logging

    from glassrl.commands.common import clock, fresh_run_dir
    from glassrl.config import load_config, print_resolved
    from glassrl.data.tasks import load_task
    from glassrl.rl.build import actor_path
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer
    from glassrl.rl.resolve import resolve

    if args.algo is not None:
        raise GlassrlError("--algo: not with --task research (it trains both research_ppo and research_grpo)")
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    start = time.perf_counter()
    hf_logging.disable_progress_bar()
    base = Path(args.out or "runs/demo-research")

    steps = [f"steps={args.steps}"] if args.steps else []
    configs = {
        name: load_config(
            TrainConfig, presets.path(preset), [f"output_dir={base / name}", *OVERRIDES, *steps, *args.overrides]
        )
        for name, preset in RUNS.items()
    }
    console.print(Rule(f"1. the model ({configs['grpo'].model.actor})"))
    model_dir = actor_path(configs["grpo"], console)  # the research-agent model, installed on first use
    _say_model(model_dir, console)
    model_s = time.perf_counter() - start

    for name, cfg in configs.items():
        resolved = resolve(cfg)
        console.print(Rule(f"2. training: the {RUNS[name]} preset, {cfg.steps} steps → {cfg.output_dir}"))
        if not args.resume:
            fresh_run_dir(Path(cfg.output_dir))
        print_resolved(resolved, console)
        Trainer(cfg, resume=args.resume, console=console).train()
    train_s = time.perf_counter() - start - model_s

    console.print(Rule("3. held-out episodes: the rubric before and after"))
    console.print(heldout_table(base, configs))
    console.print(Rule("4. the decision probability π(open the official page | s_4)"))
    for renderable in decision_tables(model_dir, base, configs["grpo"]):
        console.print(renderable)
    console.print(Rule("5. where the credit went: PPO (critic, GAE) and GRPO (one number per response)"))
    for renderable in credit_tables(base, configs):
        console.print(renderable)
    console.print(Rule("6. the full ledger of sampled episodes, with every turn"))
    prompt = load_task("research", "test", seed=configs["grpo"].seed, size=1)[0].prompt
    for cfg in configs.values():
        command = ["explain", "--model", cfg.output_dir, "--prompt", prompt, "--sample", str(EXPLAIN_SAMPLES)]
        console.print(f"$ glassrl {shlex.join(command)}", style="bold cyan", markup=False, soft_wrap=True)
        console.print(f"report: {Path(cfg.output_dir) / 'report.html'}", markup=False, soft_wrap=True)
    total = time.perf_counter() - start
    console.print(
        f"demo finished in {clock(total)} (model {clock(model_s)}, training {clock(train_s)}, "
        f"measurements {clock(total - model_s - train_s)})"
    )
    return 0


def _say_model(path: Path, console) -> None:
    import json

    from glassrl.models.default_model import MARKER

    info = json.loads((path / MARKER).read_text(encoding="utf-8")) if (path / MARKER).is_file() else {}
    if "sft_behaviours" not in info:  # model.actor names a checkpoint that is not the research agent
        console.print(f"model: {path}", markup=False, soft_wrap=True)
        return
    mix = ", ".join(f"{name} {share:.0%}" for name, share in info["sft_behaviours"].items())
    console.print(
        f"default-research model: {path} ({info['parameters']:,} parameters, built in {info['build_time_s']:g} s; "
        f"rebuild: glassrl init-model --force --agent research); SFT transcripts: {mix}",
        markup=False,
        soft_wrap=True,
    )


# ---------------------------------------------------------------- 3. the rubric before and after


def evaluations(metrics_file: Path) -> tuple[dict, dict]:
    """The metric rows of the evaluation before the first step and of the last one."""
    from glassrl.report.run_dir import read_metrics

    evals = [r for r in read_metrics(metrics_file) if "eval/accuracy" in r]
    if not evals or evals[0]["step"] != 0:
        raise GlassrlError(f"{metrics_file}: no evaluation before the first step (is data.eval_size 0?)")
    return evals[0], evals[-1]


def heldout_table(base: Path, configs: dict):
    """Before (the model), after PPO, after GRPO: ``ROWS`` from each run's metrics.jsonl."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    cfg = configs["grpo"]
    first = {name: evaluations(base / name / "metrics.jsonl") for name in configs}
    what = Text(
        f"{cfg.logging.eval_k} reports sampled at temperature {cfg.rollout.temperature:g} for each of the first "
        f"{cfg.data.eval_size} test episodes (companies no training episode names), judged by the rubric's rules:"
    )
    table = Table()
    table.add_column("held-out reports")
    for column in ("before training", "after PPO", "after GRPO"):
        table.add_column(column, justify="right")
    for key, label in ROWS.items():
        before = first["grpo"][0].get(key, math.nan)
        cells = [_figure(key, before)]
        for name in ("ppo", "grpo"):
            after = first[name][1].get(key, math.nan)
            cells.append(f"{_figure(key, after)} ({_change(key, before, after)})")
        table.add_row(label, *cells)
    return Group(what, table)


def _figure(key: str, x: float) -> str:
    if math.isnan(x):
        return "—"
    return f"{x:.2f}" if key == "eval/reward/mean" else f"{100 * x:.1f}%"


def _change(key: str, before: float, after: float) -> str:
    if math.isnan(before) or math.isnan(after):
        return "—"
    return f"{after - before:+.2f}" if key == "eval/reward/mean" else f"{100 * (after - before):+.1f} points"


# ---------------------------------------------------------------- 4. the decision probability


def final_actor(run_dir: Path) -> Path:
    """The actor of a run's latest checkpoint (a Hugging Face directory)."""
    from glassrl.run.checkpoint import CheckpointManager, read_manifest

    manager = CheckpointManager(run_dir / "checkpoints", keep=1)
    checkpoint = manager.latest()
    if checkpoint is None:
        raise GlassrlError(f"{run_dir}: no checkpoint (the run did not finish)")
    return Path(manager.load(checkpoint, set(read_manifest(checkpoint)["parts"]))["actor"])


def decision_tables(model_dir: Path, base: Path, cfg) -> list:
    """The mean π(open the page of each kind | s_4) over the held-out episodes for the model and each
    run's final policy, then the official call's tokens for the first episode."""
    from rich.table import Table
    from rich.text import Text

    from glassrl.builtin.research_model import decision_probability, decision_summary
    from glassrl.data.tasks import load_task
    from glassrl.models import load_causal_lm, load_tokenizer

    records = load_task("research", "test", seed=cfg.seed, size=cfg.data.eval_size)
    policies = {"before training": model_dir, **{f"after {n.upper()}": final_actor(base / n) for n in RUNS}}
    tokenizer = load_tokenizer(model_dir)
    models = {label: load_causal_lm(path, device="cpu") for label, path in policies.items()}
    summary = {label: decision_summary(model, tokenizer, records) for label, model in models.items()}
    mean = Table(title=f"π(a | s_4), the mean over the {len(records)} held-out episodes (product of the call's tokens)")
    mean.add_column("the call at s_4 opens")
    for label in policies:
        mean.add_column(label, justify="right")
    for kind in ("official", "rumour", "forecast", "news"):
        mean.add_row(f"the {kind} page", *(f"{summary[label][kind]:.3f}" for label in policies))
    first = records[0]
    tokens, _ = decision_probability(models["before training"], tokenizer, first)
    per_token = {label: decision_probability(model, tokenizer, first)[1] for label, model in models.items()}
    table = Table(title="the official call at s_4 of the first held-out episode, token by token: π(a_j | s_4, a_<j)")
    table.add_column("j", justify="right")
    table.add_column("a_j")
    for label in policies:
        table.add_column(label, justify="right")
    for j, token in enumerate(tokens):
        table.add_row(str(j), repr(token), *(f"{per_token[label][j]:.3f}" for label in policies))
    table.add_row("", "product", *(f"{math.prod(per_token[label]):.3f}" for label in policies))
    note = Text(f"prompt: {first.prompt}", overflow="fold")
    return [mean, note, table]


# ---------------------------------------------------------------- 5. the credit


def pick_responses(run_dir: Path) -> dict:
    """{"official": (step, response), "trap": (step, response)}: from the run's ledgers, newest
    first, a response that opened the official page and one that opened a trap (the rumour page,
    else the forecast: a policy that has learnt soon stops opening the rumour), ended by the model
    (finish reason "stop"; of the official openers, the best-scored); from one ledger where one holds
    both. A role no ledger has is left out."""
    from glassrl.builtin.research_model import opened_kind
    from glassrl.data.tasks import research
    from glassrl.ledger import read_jsonl

    found: dict[str, dict[str, tuple]] = {}  # step -> kind -> (step, response), newest step first
    for path in sorted((run_dir / "ledgers").glob("step_*.jsonl"), reverse=True):
        ledger = read_jsonl(path)
        kinds: dict[str, tuple] = {}
        for response in ledger.responses:
            record = research.record_for_prompt(response.prompt)
            if record is None or response.turns is None or response.finish_reason != "stop":
                continue
            kind = opened_kind(response.turns, research.episode_of(record))
            if kind not in kinds or (kind == "official" and response.score > kinds[kind][1].score):
                kinds[kind] = (ledger.step, response)  # the official page: its best-scored report
        found[ledger.step] = kinds
    roles = {"official": ("official",), "trap": TRAPS}
    both = [kinds for kinds in found.values() if "official" in kinds and any(t in kinds for t in TRAPS)]
    pool = [both[0]] if both else list(found.values())
    picked = {}
    for role, wanted in roles.items():
        for kind in wanted:
            hit = next((kinds[kind] for kinds in pool if kind in kinds), None)
            if hit is not None:
                picked[role] = hit
                break
    return picked


def credit_tables(base: Path, configs: dict) -> list:
    """Per role (the official page, a trap), the turns' credit under PPO and GRPO side by side, and
    the open_page call token by token; then which ledgers the responses come from."""
    from rich.text import Text

    from glassrl.builtin.research_model import opened_kind
    from glassrl.data.tasks import research

    picked = {name: pick_responses(base / name) for name in configs}
    out = []
    for role in ("official", "trap"):
        responses = {name: found[role] for name, found in picked.items() if role in found}
        if len(responses) < len(configs):
            missing = ", ".join(name.upper() for name in configs if name not in responses)
            out.append(Text(f"no ledger of {missing} holds a response that opened the {role} page"))
            continue
        kinds = {
            name: opened_kind(r.turns, research.episode_of(research.record_for_prompt(r.prompt)))
            for name, (_, r) in responses.items()
        }
        out.append(_turn_table(responses, kinds))
        out.append(_call_table({name: r for name, (_, r) in responses.items()}, kinds))
    lines = [
        f"{name.upper()} {role}: {base / name / 'ledgers' / f'step_{step:06d}.jsonl'}, prompt {r.prompt!r}"
        for name, found in picked.items()
        for role, (step, r) in found.items()
    ]
    return [*out, Text("the ledgers these rows come from (the report's token view shows them):\n" + "\n".join(lines))]


def _turn_table(responses: dict, kinds: dict):
    from rich.table import Table

    from glassrl.ledger.credit import observation_values, turn_credit

    opened = " / ".join(dict.fromkeys(kinds.values()))
    table = Table(title=f"a response that opened the {opened} page: the credit of each turn")
    table.add_column("turn")
    for name, (step, r) in responses.items():
        table.add_column(
            f"{name.upper()} (step {step}, opened {kinds[name]}, score {r.score:g}): Σ A_i", justify="right"
        )
        table.add_column("mean A_i", justify="right")
    responses = {name: r for name, (_, r) in responses.items()}
    credits = {name: turn_credit(r) for name, r in responses.items()}
    for k in range(max(len(c) for c in credits.values())):
        label = ("search", "open_page", "report")[k] if k < 3 else str(k)
        cells = []
        for c in credits.values():
            if k < len(c) and c[k].sum_advantage is not None:
                cells += [f"{c[k].sum_advantage:+.3f} ({c[k].end - c[k].start} tokens)", f"{c[k].mean_advantage:+.3f}"]
            else:
                cells += ["—", "—"]
        table.add_row(f"{k} {label}", *cells)
        if k < 2:  # the observation that answered the call: V across it (a critic's only)
            cells = []
            for name, r in responses.items():
                values, after = observation_values(r, k) if k < len(credits[name]) else ([], None)
                known = [v for v in values if v is not None]
                cells += [
                    f"V {known[0]:+.3f} → {known[-1]:+.3f} over {len(values)} tokens" if known else "no V (no critic)",
                    f"V(s_m) {after:+.3f}" if after is not None else "",
                ]
            table.add_row("  its observation", *cells)
    return table


def _call_table(responses: dict, kinds: dict):
    from rich.table import Table

    from glassrl.ledger.credit import action_rows, turn_credit

    opened = " / ".join(dict.fromkeys(kinds.values()))
    table = Table(title=f"its open_page call ({opened}), token by token")
    rows = {name: action_rows(r, 1) if len(turn_credit(r)) > 1 else [] for name, r in responses.items()}
    peaks = {name: turn_credit(r)[1].peak if len(turn_credit(r)) > 1 else None for name, r in responses.items()}
    table.add_column("j", justify="right")
    table.add_column("PPO a_j")
    for column in ("V(s_j)", "δ_j", "A_j"):
        table.add_column(column, justify="right")
    table.add_column("GRPO a_j")
    table.add_column("A_j", justify="right")
    for j in range(max(len(r) for r in rows.values())):
        cells = [str(j)]
        for name in ("ppo", "grpo"):
            if j >= len(rows[name]):
                cells += ["", "", "", ""] if name == "ppo" else ["", ""]
                continue
            row = rows[name][j]
            mark = " ←" if row.index == peaks[name] else ""
            if name == "ppo":
                cells += [repr(row.token), _num(row.values), _num(row.deltas) + mark, _num(row.advantages)]
            else:
                cells += [repr(row.token), _num(row.advantages)]
        table.add_row(*cells)
    return table


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:+.3f}"
