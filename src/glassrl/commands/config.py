"""`glassrl config show [CONFIG] [key=value ...]` and `glassrl config docs`: every option, its type,
default and help, read from the config dataclasses (glassrl.config.describe).

``show`` prints a table for the command CONFIG belongs to (``--command``: train unless CONFIG is
the preset sft, rm, dpo or kto); with CONFIG or overrides, the value each option gets, and the default
beside it where they differ. ``docs`` prints docs/config.md (``--output`` writes it), the
reference of every command's config; a test regenerates it and compares.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

HELP = "list every config option with its type, default and help (show), or write docs/config.md (docs)"

# command -> (module, config class, what the command does)
CONFIGS = {
    "train": ("glassrl.rl.config", "TrainConfig", "RL training: PPO, GRPO and their relatives."),
    "sft": ("glassrl.supervised.sft", "SFTConfig", "Supervised fine-tuning on prompt/response pairs."),
    "rm": ("glassrl.supervised.rm", "RMConfig", "Reward-model training on preference pairs (Bradley–Terry)."),
    "dpo": (
        "glassrl.supervised.preference",
        "PreferenceConfig",
        "Offline preference optimisation: DPO, IPO, SimPO on pairs, KTO on labelled responses.",
    ),
}
# a preset -> the command whose config it is, where that is not train
PRESET_COMMANDS = {"sft": "sft", "rm": "rm", "dpo": "dpo", "kto": "dpo"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print every option of a command's config", description=__doc__)
    show.add_argument(
        "config", nargs="?", help="a preset's name (grpo, ppo, sft, ...) or a YAML file; none = the defaults"
    )
    show.add_argument("overrides", nargs="*", metavar="key=value", help="override a config field, e.g. algo.lam=0.9")
    show.add_argument(
        "--command",
        dest="config_command",  # not "command": that is the CLI's sub-command
        choices=tuple(CONFIGS),
        help="whose config it is (default: sft, rm or dpo for the presets sft, rm, dpo and kto, else train)",
    )
    docs = sub.add_parser("docs", help="print docs/config.md, generated from the config dataclasses")
    docs.add_argument("--output", type=Path, help="write it to this file instead (docs/config.md)")


def run(args: argparse.Namespace) -> int:
    if args.action == "docs":
        text = config_markdown()
        if args.output is None:
            print(text, end="")
        else:
            args.output.write_text(text, encoding="utf-8")
            print(f"wrote {args.output}")
        return 0
    return _show(args)


def config_class(command: str) -> type:
    module, name, _ = CONFIGS[command]
    return getattr(importlib.import_module(module), name)


def _show(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from glassrl import presets
    from glassrl.config import describe, load_config

    command = args.config_command or PRESET_COMMANDS.get(args.config, "train")
    cls = config_class(command)
    given = args.config is not None or bool(args.overrides)
    path = presets.config_file(args.config) if args.config is not None else None
    values = load_config(cls, path, args.overrides) if given else None
    if values is not None and command == "train":  # where π_θ samples, as the run places it
        from glassrl.rl.resolve import with_placement

        values = with_placement(values)
    title = f"glassrl {command}: " + (f"{args.config or 'defaults'} " if given else "") + f"({cls.__name__})"
    table = Table(title=title, title_justify="left")
    table.add_column("key", no_wrap=True)
    table.add_column("type", max_width=24, overflow="fold")
    for column in ("value", "default") if given else ("default",):
        table.add_column(column, max_width=28, overflow="fold")
    table.add_column("help", ratio=1, min_width=30)
    defaults = {row.key: row.value for row in describe(cls)}
    for row in describe(cls, values):
        style = "bold" if row.section else None
        default = [defaults.get(row.key, "") if defaults.get(row.key) != row.value else ""] if given else []
        table.add_row(*map(escape, (row.key, row.type, row.value, *default, row.help)), style=style)
    console = Console()
    if not console.is_terminal:  # piped (grep, a file): one line per option
        console = Console(width=200)
    console.print(table)
    return 0


def config_markdown() -> str:
    """docs/config.md: how a config is read, then one table per section of each command's config."""
    parts = [_INTRO]
    for command in CONFIGS:
        cls = config_class(command)
        parts.append(f"\n## glassrl {command} ({cls.__name__})\n")
        parts.append(f"{CONFIGS[command][2]} Sections: {', '.join(_sections(cls)) or 'none'}.\n")
        parts += _tables(cls)
    return "\n".join(parts)


def _tables(cls: type) -> list[str]:
    """The top-level options, then one table per section (its sub-sections' keys inside it)."""
    from glassrl.config import describe

    tables: dict[str, list[str]] = {"": []}
    helps: dict[str, str] = {}
    for row in describe(cls):
        top = row.key.split(".")[0] if "." in row.key or row.section else ""
        if row.key == top:
            helps[top] = row.help + (" (null = off; true = the defaults below)" if "null" in row.type else "")
            tables[top] = []
            continue
        cell = [f"`{row.key}`", _code(row.type), _code(row.value) if row.value else "", _cell(row.help)]
        tables[top].append("| " + " | ".join(cell) + " |")
    out = []
    for top, rows in tables.items():
        if top:
            out.append(f"### `{top}`\n\n{_cell(helps[top])}\n")
        out.append("| key | type | default | help |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")
    return out


def _sections(cls: type) -> list[str]:
    from glassrl.config import describe

    return [f"`{row.key}`" for row in describe(cls) if row.section and "." not in row.key]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{_cell(text)}`"


_INTRO = """# Configuration reference

Every option of `glassrl train`, `glassrl sft`, `glassrl rm` and `glassrl dpo`, with its type,
default and help. Generated from the config dataclasses (the help is the comment on each field's line) by
`glassrl config docs --output docs/config.md`; a test regenerates it and fails when this file
differs. `glassrl config show [PRESET] [key=value ...]` prints the same table in the terminal,
with the values a preset and overrides give.

How a config is read (`glassrl.config.load_config`):

- The defaults below, then the YAML file (a path, or a preset's name: `glassrl train grpo`),
  then the `key=value` overrides after it, in order. A value is parsed as YAML (`1e-4`,
  `[1, 2]`, `null`, `{max_length: 32}`) and checked against the option's type.
- Dotted keys reach into sections (`algo.kl.coef=0.01`); a number reaches into a list
  (`reward.sources.0.weight=2`), and the list's length appends an element
  (`reward.sources.1.name=length_penalty`).
- **Paths** (one rule for every command, `glassrl.config_paths`). The files a config travels
  with — data (`data.train`, `data.test`, `data.ptx`, a mixture's paths; the `data` and
  `eval_data` of `glassrl sft`, `rm` and `dpo`), reward functions (`file.py:fn`
  specs), tools and environments (`rollout.agent.tools`, `.environment`) — are read from the
  directory of the config file that names them; a path given on the command line (`key=value`)
  from the working directory, as any path typed in a shell. Where runs live — `output_dir`, and
  the models (`model.*`, a reward model's or teacher's `path`, the SFT/RM/DPO `model`), usually
  an earlier run's `output_dir` — is relative to the working directory. A config file's paths are
  recorded absolute in the run's `config.yaml` (a resume reads the same files from anywhere), and
  a missing file is an error naming the path it looked for.
- A section shown as `section | null` is off when null; `true` turns it on with its defaults
  (`logging.wandb=true`), and setting one of its keys turns it on too.
- An unknown key or a bad value is one error line naming the key and where it came from, the
  file or `command line`, with the nearest valid key (`command line: unknown key algo.lamm (did
  you mean algo.lam?)`).
- A knob the chosen algorithm ignores is an error when you write it (`algo.lam` under GRPO). A
  run's own `config.yaml` holds every key, so there only values other than the default count.
- `glassrl train RUN_DIR/config.yaml --resume steps=120` extends a finished run; a resumed run
  may change `steps`, `output_dir`, `logging.*` and `threads`, and `RUN_DIR/resumes.jsonl` records
  what changed.
- `glassrl dpo CONFIG --resume` continues a preference run from its latest checkpoint the same
  way; it may change `steps`, `output_dir`, `log_every`, `eval_every`, `checkpoint_every`,
  `keep_checkpoints` and `threads`.
- `threads` (every command): intra-op CPU threads. `auto` takes `GLASSRL_THREADS` or
  `OMP_NUM_THREADS` when set, else the cores free now (the cores this process may use minus the
  1-minute load average of other processes, at least 1: `glassrl.models.threads`); a start-up
  line says the count and why. Whatever chose it, a count above the usable cores (the CPU
  affinity, a cgroup quota) is capped at them, and the line says so (`threads=1000000` started a
  million threads and crashed: docs/reliability.md). `glassrl train` records the count in every checkpoint and in
  `environment.json`, and `--resume` under `auto` reuses it instead of choosing again. On one
  machine 1 and 2 threads trained the default model and a 10× one to bit-identical metrics and
  weights, but a sum over 4 M floats or a 512×4096×512 matrix product differs in the last bits
  between them: with larger models the count can change the numbers (BENCHMARKS.md, bench_threads).
- Memory on CPU: `glassrl train` on the CPU sets glibc's malloc to serve blocks up to 32 MiB from
  its heap and to keep up to 1 GiB of freed memory, so that each step reuses the pages the last one
  freed instead of faulting in new ones (`glassrl.models.allocator`; ~4 % of a default-model step).
  `GLASSRL_MALLOC=default` in the environment leaves malloc as it is.
"""
