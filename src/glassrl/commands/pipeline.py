"""`glassrl demo --pipeline rlhf` (``make demo PIPELINE=rlhf``): the InstructGPT pipeline end to end.

Ouyang et al. 2022 (InstructGPT, §3.5) in three stages, each the project's own trainer, each
stage's output the next one's input:

1. **SFT policy**: the embedded default model, a small Llama fine-tuned on the bundled tasks
   (``glassrl sft``; examples/rlhf/sft.yaml runs this stage by hand on a model of yours). Its
   held-out accuracy is the PPO run's evaluation before its first step (``eval/accuracy`` at
   step 0: greedy answers to the first ``data.eval_size`` test prompts, the task's verifier).
2. **Reward model** (``glassrl rm``, examples/rlhf/rm.yaml): the SFT model with a scalar head,
   trained on the bundled preference pairs with the Bradley–Terry loss; its held-out pairwise
   accuracy.
3. **PPO with four models** (``glassrl train``, examples/rlhf/ppo.yaml): the actor (from the SFT
   policy) and the critic (from the reward model, scalar head included) train; the reward model
   and the reference (the SFT policy, frozen) do not. The reward is the reward model's score on
   the last token minus β·KL on every token. The task's verifier is the *gold* reward the
   reward model stands for (``reward.gold``): never trained on, logged beside the proxy.

It prints what each stage produced, PPO before and after on gold and proxy, the run report
(with gold and proxy against √KL), and the ledger of the reference example on the trained
policy (``glassrl explain --model``): the reward model's score on the last token and −β·kl on
every token before it.

Layout: ``OUT/rm`` (the reward model), ``OUT/ppo`` (the PPO run: metrics.jsonl, report.html,
checkpoints). The configs are the package's presets/rlhf/*.yaml (examples/rlhf/ in a checkout);
the pipeline only points each stage at the previous one's output.
"""

from __future__ import annotations

import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from glassrl import presets
from glassrl.errors import GlassrlError

PIPELINES = ("rlhf",)
CONFIGS = presets.DIR / "rlhf"  # sft.yaml, rm.yaml, ppo.yaml
PROMPT, RESPONSE = "请问1+1=2？", "是的，等于2！"
WINDOW = 5  # training steps averaged for "first" and "last" gold and proxy of the sampled responses


@dataclass
class PipelineResult:
    """What each stage produced (paths and the figures printed)."""

    sft: Path
    sft_accuracy: float
    rm: Path
    rm_accuracy: float
    rm_pairs: int
    ppo: Path
    metrics: dict[str, tuple[float, float]]  # name -> (before, after)


def run_rlhf(
    out: str | Path,
    *,
    actor: str = "default",
    rm_overrides: list[str] | tuple[str, ...] = (),
    ppo_overrides: list[str] | tuple[str, ...] = (),
    console=None,
    progress: bool = True,
) -> PipelineResult:
    """Stages 1–3 of the module docstring into ``out``; returns what they produced.

    ``actor``: the SFT policy ("default" = the embedded default model, built if missing).
    ``rm_overrides``, ``ppo_overrides``: ``key=value`` overrides of presets/rlhf/rm.yaml and
    ppo.yaml, applied after the pipeline's own (model paths, output directories).
    """
    from rich.console import Console
    from rich.rule import Rule

    from glassrl.config import load_config, print_resolved
    from glassrl.rl.config import TrainConfig
    from glassrl.supervised.rm import RMConfig, train_rm

    console = console or Console()
    out = Path(out)
    console.print(Rule("1. the SFT policy"))
    sft = _sft_policy(actor, console)
    console.print(f"SFT policy: {sft} (its held-out accuracy: the PPO run's evaluation before step 1)", markup=False)
    ppo_cfg = load_config(
        TrainConfig, CONFIGS / "ppo.yaml", [f"model.actor={sft}", f"output_dir={out / 'ppo'}", *ppo_overrides]
    )

    console.print(Rule("2. the reward model (glassrl rm)"))
    rm_cfg = load_config(RMConfig, CONFIGS / "rm.yaml", [f"model={sft}", f"output_dir={out / 'rm'}", *rm_overrides])
    print_resolved(rm_cfg, console)
    rm_metrics = train_rm(rm_cfg, console=console)

    console.print(Rule("3. PPO with four models: actor and critic train, reward model and reference frozen"))
    point_at_reward_model(ppo_cfg, out / "rm")
    from glassrl.rl.config import resolve
    from glassrl.rl.loop import Trainer

    print_resolved(resolve(ppo_cfg), console)
    Trainer(ppo_cfg, console=console, progress=progress).train()
    metrics = before_after(out / "ppo" / "metrics.jsonl")
    result = PipelineResult(
        sft=sft,
        sft_accuracy=metrics["held-out gold"][0],
        rm=out / "rm",
        rm_accuracy=rm_metrics["eval/accuracy"],
        rm_pairs=int(rm_metrics["eval_pairs"]),
        ppo=out / "ppo",
        metrics=metrics,
    )
    console.print(Rule("what each stage produced"))
    console.print(summary(result))
    return result


def _sft_policy(actor: str, console) -> Path:
    if actor != "default":
        return Path(actor)
    from glassrl.builtin.default_model import ensure_default_model

    return ensure_default_model(console=console)


def point_at_reward_model(cfg, rm: Path) -> None:
    """The reward_model source of ``cfg.reward.sources`` reads ``rm``; re-checked afterwards."""
    sources = [s for s in cfg.reward.sources if s.get("name") == "reward_model"]
    if not sources:
        raise GlassrlError(f"{CONFIGS / 'ppo.yaml'}: reward.sources has no reward_model source to point at {rm}")
    for source in sources:
        source["path"] = str(rm)
    cfg.validate()


def before_after(metrics_file: Path) -> dict[str, tuple[float, float]]:
    """(before, after) of the PPO run: held-out greedy gold (``eval/accuracy``) and proxy
    (``eval/reward/mean``, the reward model's score of the same answers) at step 0 and the last
    evaluation; and of the sampled responses, ``reward/gold``, ``reward/proxy`` and
    ``kl/sequence`` averaged over the first and the last ``WINDOW`` steps."""
    from glassrl.report.run_dir import read_metrics

    rows = read_metrics(metrics_file)
    evals = [r for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "reward/gold" in r]
    if not evals or evals[0]["step"] != 0 or not steps:
        raise GlassrlError(f"{metrics_file}: needs an evaluation at step 0 and reward/gold (reward.gold) rows")
    out = {}
    for key, label in (("eval/accuracy", "held-out gold"), ("eval/reward/mean", "held-out proxy")):
        if key in evals[0] and key in evals[-1]:
            out[label] = (evals[0][key], evals[-1][key])
    for key, label in (("reward/gold", "sampled gold"), ("reward/proxy", "sampled proxy"), ("kl/sequence", "KL")):
        first, last = steps[:WINDOW], steps[-WINDOW:]
        out[label] = (_mean([r.get(key) for r in first]), _mean([r.get(key) for r in last]))
    return out


def _mean(values: list) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def summary(result: PipelineResult):
    """The stages' figures as a rich table, then PPO before/after."""
    from rich.console import Group
    from rich.table import Table

    stages = Table(title="stages", title_justify="left")
    for name in ("stage", "produced", "figure"):
        stages.add_column(name)
    stages.add_row("1 SFT policy", str(result.sft), f"held-out accuracy {_percent(result.sft_accuracy)} (greedy)")
    stages.add_row(
        "2 reward model",
        str(result.rm),
        f"held-out pairwise accuracy {_percent(result.rm_accuracy)} ({result.rm_pairs} pairs; chance 50%)",
    )
    stages.add_row("3 PPO", str(result.ppo), f"report: {result.ppo / 'report.html'}")
    ppo = Table(
        title=f"PPO before → after (gold = the task's verifier, proxy = the reward model; "
        f"sampled = mean of the first / last {WINDOW} steps' responses)",
        title_justify="left",
    )
    for name in ("quantity", "before", "after"):
        ppo.add_column(name, justify="right" if name != "quantity" else "left")
    for label, (before, after) in result.metrics.items():
        ppo.add_row(label, _number(label, before), _number(label, after))
    return Group(stages, ppo)


def _number(label: str, x: float) -> str:
    if math.isnan(x):
        return "—"
    return _percent(x) if "gold" in label else f"{x:.3f}"


def _percent(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.1f}%"


def run(args) -> int:
    """``glassrl demo --pipeline rlhf``: :func:`run_rlhf` into ``--out`` (default runs/demo-rlhf),
    then the ledger of the reference example on the trained policy."""
    from rich.console import Console
    from rich.rule import Rule
    from transformers.utils import logging as hf_logging

    from glassrl.commands.common import clock, fresh_run_dir, run_explain

    if args.pipeline not in PIPELINES:
        raise GlassrlError(f"--pipeline: unknown {args.pipeline!r}; valid: {', '.join(PIPELINES)}")
    if args.resume:
        raise GlassrlError("--resume: the pipeline runs its three stages afresh; drop --resume")
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    hf_logging.disable_progress_bar()
    start = time.perf_counter()
    out = Path(args.out or f"runs/demo-{args.pipeline}")
    for stage in ("rm", "ppo"):
        fresh_run_dir(out / stage)
    overrides = [*([f"steps={args.steps}"] if args.steps else []), *args.overrides]
    result = run_rlhf(out, ppo_overrides=overrides, console=console)
    console.print(Rule("4. the reference example on the trained policy"))
    command = ["explain", "--model", str(result.ppo), "--prompt", PROMPT, "--response", RESPONSE]
    console.print(f"$ glassrl {shlex.join(command)}", style="bold cyan", markup=False)
    sys.stdout.flush()
    code = run_explain(command[1:])
    console.print(f"pipeline finished in {clock(time.perf_counter() - start)}")
    return code
