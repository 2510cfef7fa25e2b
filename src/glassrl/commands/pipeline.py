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

``--offline`` (``make demo PIPELINE=rlhf OFFLINE=1``) runs the chapter's other branch instead of
stages 2–3 (the reference chapter, "Online & Offline RLHF"): **DPO** (``glassrl dpo``, the
package's presets/dpo.yaml) on the same preference pairs, from the same SFT policy, no reward
model and no sampling. It prints the SFT policy and the DPO policy side by side
(:func:`policy_figures`: held-out gold accuracy, KL to the SFT policy per response) with the
held-out preference accuracy, then the preference ledger of a reference pair (``glassrl explain
--model OUT/dpo --prompt … --chosen … --rejected …``). Layout: ``OUT/dpo``.
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
DPO_PRESET = presets.DIR / "dpo.yaml"
CHOSEN, REJECTED = "是的，等于2！", "不是，等于2！"  # the reference pair: right verdict, and the verdict flipped
EVAL_SIZE = 200  # held-out prompts of policy_figures, as examples/rlhf/ppo.yaml evaluates
LANGUAGES = {"en": "English", "zh": "Chinese"}  # the task's prompt languages: policy_figures' gold/<lang>
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
    console.print(
        f"SFT policy: {sft} (its held-out accuracy: the PPO run's evaluation before step 1)",
        markup=False,
        soft_wrap=True,
    )
    ppo_cfg = load_config(
        TrainConfig, CONFIGS / "ppo.yaml", [f"model.actor={sft}", f"output_dir={out / 'ppo'}", *ppo_overrides]
    )

    console.print(Rule("2. the reward model (glassrl rm)"))
    rm_cfg = load_config(RMConfig, CONFIGS / "rm.yaml", [f"model={sft}", f"output_dir={out / 'rm'}", *rm_overrides])
    print_resolved(rm_cfg, console)
    rm_metrics = train_rm(rm_cfg, console=console)

    console.print(Rule("3. PPO with four models: actor and critic train, reward model and reference frozen"))
    point_at_reward_model(ppo_cfg, out / "rm")
    from glassrl.rl.loop import Trainer
    from glassrl.rl.resolve import resolve

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


def policy_figures(policy: str | Path, reference: str | Path, out: str | Path, *, samples: int = 4) -> dict[str, float]:
    """How a policy does on the bundled task, measured the same way whatever trained it: ``gold``,
    the held-out accuracy as a training run evaluates it (greedy answers to the first
    ``EVAL_SIZE`` arith-verify test prompts, judged by the task's verifier: the trainer's
    evaluation, glassrl.rl.evaluation), ``gold/en`` and ``gold/zh``, the same over the English and
    the Chinese prompts (the SFT policy answers most English questions in Chinese, which the
    verifier scores 0: README, "Two commands"), and ``kl``, the mean over ``samples`` responses sampled at
    temperature 1 to each of those prompts of Σ_i (log π(a_i|s_i) − log π_ref(a_i|s_i)) (k1, nats
    per response: ``kl/sequence`` of a training run, on held-out prompts). ``out``: a scratch run
    directory for the evaluation's trainer (presets/grpo.yaml, never stepped)."""
    import io

    from rich.console import Console

    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer
    from glassrl.rl.metrics import sequence_kl
    from glassrl.rollout.base import SamplingParams

    overrides = [f"model.actor={policy}", f"model.reference={reference}", f"output_dir={out}"]
    overrides += [f"data.eval_size={EVAL_SIZE}", "logging.eval_group_by=lang", "logging.report=false"]
    cfg = load_config(TrainConfig, presets.path("grpo"), overrides)
    trainer = Trainer(cfg, console=Console(file=io.StringIO()), progress=False)
    try:
        accuracy = trainer.evaluate()
        gold = {"gold": accuracy["eval/accuracy"]} | {f"gold/{k}": accuracy[f"eval/accuracy/{k}"] for k in LANGUAGES}
        records = trainer.test_records
        params = SamplingParams(cfg.rollout.max_new_tokens, temperature=1.0)
        sampled = trainer.workers.rollout.generate(trainer.data.ids(records), n=samples, params=params, records=records)
        batch = {
            "input_ids": sampled.input_ids,
            "attention_mask": sampled.attention_mask,
            "response_mask": sampled.response_mask,
        }
        logprobs, _ = trainer.workers.actor.compute_logprobs(batch)
        kl = sequence_kl(logprobs - trainer.workers.reference.compute_logprobs(batch), sampled.response_mask)
    finally:
        trainer.close()
    return {**gold, "kl": kl}


@dataclass
class OfflineResult:
    """What the offline leg produced: the DPO run and the figures printed."""

    sft: Path
    dpo: Path
    before: dict[str, float]  # policy_figures of the SFT policy
    after: dict[str, float]  # of the DPO policy
    metrics: dict[str, float]  # glassrl dpo's final metrics (eval/rewards/accuracies, ...)
    time_s: float  # DPO's wall time, its reference log-probs included


def run_dpo(
    out: str | Path,
    *,
    actor: str = "default",
    dpo_overrides: list[str] | tuple[str, ...] = (),
    console=None,
) -> OfflineResult:
    """The SFT policy → DPO on the pipeline's preference pairs → before and after (module docstring)."""
    from rich.console import Console
    from rich.rule import Rule

    from glassrl.config import load_config, print_resolved
    from glassrl.supervised.preference import train_preference
    from glassrl.supervised.preference_config import PreferenceConfig

    console = console or Console()
    out = Path(out)
    console.print(Rule("1. the SFT policy"))
    sft = _sft_policy(actor, console)
    console.print(f"SFT policy: {sft}", markup=False, soft_wrap=True)
    console.print(Rule("2. DPO on the preference pairs (glassrl dpo): offline, no reward model, no sampling"))
    cfg = load_config(PreferenceConfig, DPO_PRESET, [f"model={sft}", f"output_dir={out / 'dpo'}", *dpo_overrides])
    print_resolved(cfg, console)
    start = time.perf_counter()
    metrics = train_preference(cfg, console=console)
    time_s = time.perf_counter() - start
    console.print(Rule(f"3. before and after: greedy answers to {EVAL_SIZE} held-out prompts, samples for the KL"))
    before = policy_figures(sft, sft, out / "eval-sft")
    after = policy_figures(out / "dpo", sft, out / "eval-dpo")
    result = OfflineResult(sft, out / "dpo", before, after, metrics, time_s)
    console.print(offline_summary(result))
    return result


def offline_summary(result: OfflineResult):
    """The DPO leg's before/after as a rich table."""
    from rich.table import Table

    accuracy = result.metrics["eval/rewards/accuracies"]
    pairs = int(result.metrics["eval_pairs"])
    table = Table(title=f"DPO before → after ({result.time_s:.0f} s of training)", title_justify="left")
    for name in ("quantity", "before (SFT policy)", "after (DPO)"):
        table.add_column(name, justify="right" if name != "quantity" else "left")
    table.add_row("held-out gold accuracy (greedy)", _percent(result.before["gold"]), _percent(result.after["gold"]))
    for lang, name in LANGUAGES.items():
        key = f"gold/{lang}"
        table.add_row(f"  on the {name} prompts", _percent(result.before[key]), _percent(result.after[key]))
    table.add_row(
        f"held-out preference accuracy ({pairs} pairs)", "0.0% (π = π_ref: every reward 0, ties)", _percent(accuracy)
    )
    table.add_row("KL to the SFT policy (nats per response)", f"{result.before['kl']:.3f}", f"{result.after['kl']:.3f}")
    return table


def run(args) -> int:
    """``glassrl demo --pipeline rlhf``: :func:`run_rlhf` into ``--out`` (default runs/demo-rlhf),
    then the ledger of the reference example on the trained policy; with ``--offline``,
    :func:`run_dpo` into ``--out`` (default runs/demo-dpo) and the preference ledger."""
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
    if args.offline:
        return _run_offline(args, console, start)
    out = Path(args.out or f"runs/demo-{args.pipeline}")
    for stage in ("rm", "ppo"):
        fresh_run_dir(out / stage)
    overrides = [*([f"steps={args.steps}"] if args.steps else []), *args.overrides]
    result = run_rlhf(out, ppo_overrides=overrides, console=console)
    console.print(Rule("4. the reference example on the trained policy"))
    command = ["explain", "--model", str(result.ppo), "--prompt", PROMPT, "--response", RESPONSE]
    console.print(f"$ glassrl {shlex.join(command)}", style="bold cyan", markup=False, soft_wrap=True)
    sys.stdout.flush()
    code = run_explain(command[1:])
    console.print(f"pipeline finished in {clock(time.perf_counter() - start)}")
    return code


def _run_offline(args, console, start: float) -> int:
    """``--offline``: the DPO leg (:func:`run_dpo`), then the preference ledger of the reference pair."""
    from rich.rule import Rule

    from glassrl.commands.common import clock, fresh_run_dir, run_explain

    out = Path(args.out or "runs/demo-dpo")
    for stage in ("dpo", "eval-sft", "eval-dpo"):
        fresh_run_dir(out / stage)
    overrides = [*([f"steps={args.steps}"] if args.steps else []), *args.overrides]
    result = run_dpo(out, dpo_overrides=overrides, console=console)
    console.print(Rule("4. the reference pair on the trained policy: implicit rewards per token"))
    command = ["explain", "--model", str(result.dpo), "--prompt", PROMPT, "--chosen", CHOSEN, "--rejected", REJECTED]
    console.print(f"$ glassrl {shlex.join(command)}", style="bold cyan", markup=False, soft_wrap=True)
    sys.stdout.flush()
    code = run_explain(command[1:])
    console.print(f"pipeline finished in {clock(time.perf_counter() - start)}")
    return code
