"""The reference chapter's "Online & Offline RLHF", measured on the bundled task (docs/rlhf.md).

    .venv/bin/python benchmarks/bench_offline_online.py                 # every leg (~15 min, 2 cores, load 10)
    .venv/bin/python benchmarks/bench_offline_online.py --legs dpo,grpo # some of them

From the same SFT policy (the embedded default model) and on the same bundled data, each leg
trains with glassrl's own trainer, then every final policy is measured the same way
(glassrl.commands.pipeline.policy_figures): held-out gold accuracy (greedy answers to the first
200 arith-verify test prompts, judged by the task's verifier, the trainer's own evaluation) and
KL to the SFT policy (mean Σ_i log π/π_ref over 4 responses sampled at temperature 1 to each of
those prompts, nats per response); the gold also by the prompts' language (English, Chinese).

- ``dpo``: offline. ``glassrl dpo examples/dpo.yaml`` on the preference pairs; no sampling.
- ``ipo``: the same with ``loss=ipo`` (Azar et al. 2023), the DPO family's squared loss.
- ``ppo``: online, on a learned reward. ``glassrl demo --pipeline rlhf``'s stages 2–3: the reward
  model on the same pairs (examples/rlhf/rm.yaml), then PPO on it (examples/rlhf/ppo.yaml).
- ``grpo``: online, on the gold verifier. ``glassrl train examples/grpo.yaml``.
- ``distill``: on-policy distillation (examples/distillation/on_policy.yaml): the student samples,
  the teacher — the default model's recipe at 10× its parameters (LARGE_SPEC of
  benchmarks/bench_vs_trl.py, built once into ``--teacher``) — scores every token; the same
  steps and samples as ``grpo``. A second table measures what distillation aims at: KL(π ‖ teacher),
  the same sampled estimate with the teacher in π_ref's place, of the SFT policy, the teacher,
  and the distilled and GRPO policies (where those legs ran), with the gold of each.
- ``distill-grpo``: the same distillation with the ``grpo`` leg's final policy as the teacher (the
  student's size, trained on the verifier; list ``grpo`` first): what distillation gives when the
  teacher is better at the task. Printed with KL(π ‖ that teacher) of the SFT policy and the student.

Wall time is each leg's training (the reward model's and the reference log-probs' included),
measured here; samples are the responses generated for training. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from glassrl import presets
from glassrl.commands.common import fresh_run_dir
from glassrl.commands.pipeline import policy_figures, run_rlhf
from glassrl.config import load_config
from glassrl.models.default_model import default_model_dir
from glassrl.rl.config import TrainConfig
from glassrl.rl.loop import Trainer
from glassrl.run.checkpoint import CheckpointManager
from glassrl.supervised.preference import train_preference
from glassrl.supervised.preference_config import PreferenceConfig

LEGS = ("dpo", "ipo", "ppo", "grpo", "distill", "distill-grpo")


def final_actor(run: Path) -> Path:
    """The actor of a training run's last checkpoint (a Hugging Face directory)."""
    return CheckpointManager(run / "checkpoints", keep=1).latest() / "actor"


def build_teacher(out: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_vs_trl import build_trained_large

    return build_trained_large(out)


def leg_dpo(out: Path, quiet: Console, overrides: list[str]) -> tuple[Path, float, str]:
    cfg = load_config(PreferenceConfig, presets.path("dpo"), [f"output_dir={out}", *overrides])
    start = time.perf_counter()
    metrics = train_preference(cfg, console=quiet)
    seconds = time.perf_counter() - start
    pairs = cfg.steps * cfg.batch_size
    return (
        out,
        seconds,
        f"0 (reads {pairs} pairs; held-out preference accuracy {metrics['eval/rewards/accuracies']:.3f})",
    )


def leg_ppo(out: Path, quiet: Console) -> tuple[Path, float, str]:
    start = time.perf_counter()
    result = run_rlhf(out, console=quiet, progress=False)
    seconds = time.perf_counter() - start
    cfg = load_config(TrainConfig, out / "ppo" / "config.yaml")
    samples = cfg.steps * cfg.batch.prompts_per_step * cfg.rollout.n
    return (
        final_actor(out / "ppo"),
        seconds,
        f"{samples} (reward model: held-out pairwise accuracy {result.rm_accuracy:.3f})",
    )


def leg_rl(preset: Path, out: Path, quiet: Console, overrides: list[str]) -> tuple[Path, float, str]:
    cfg = load_config(TrainConfig, preset, [f"output_dir={out}", "logging.eval_every=0", *overrides])
    start = time.perf_counter()
    Trainer(cfg, console=quiet, progress=False).train()
    seconds = time.perf_counter() - start
    return final_actor(out), seconds, f"{cfg.steps * cfg.batch.prompts_per_step * cfg.rollout.n}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--legs", default=",".join(LEGS), help=f"comma-separated, of {', '.join(LEGS)}")
    parser.add_argument("--out", type=Path, default=Path("runs/offline-online"), help="run directories")
    parser.add_argument("--teacher", type=Path, default=Path("runs/teacher-large"), help="the distillation teacher")
    args = parser.parse_args()
    legs = [leg for leg in args.legs.split(",") if leg]
    unknown = [leg for leg in legs if leg not in LEGS]
    if unknown:
        parser.error(f"unknown leg {unknown[0]!r}; valid: {', '.join(LEGS)}")
    if "distill-grpo" in legs and "grpo" not in legs[: legs.index("distill-grpo")]:
        parser.error("the distill-grpo leg distils the grpo leg's policy: list grpo before it")
    quiet = Console(file=io.StringIO())
    sft = default_model_dir()
    rows = []
    policies = {"SFT policy": sft}
    teacher = build_teacher(args.teacher) if "distill" in legs else None
    before = policy_figures(sft, sft, args.out / "eval-sft")
    print(f"SFT policy {sft}: held-out gold {before['gold']:.3f}", flush=True)
    for leg in legs:
        out = args.out / leg
        for stage in ("rm", "ppo") if leg == "ppo" else ("",):
            fresh_run_dir(out / stage)
        print(f"{leg}: training into {out} (load average {os.getloadavg()[0]:.1f})", flush=True)
        if leg in ("dpo", "ipo"):
            policy, seconds, samples = leg_dpo(out, quiet, [] if leg == "dpo" else ["loss=ipo"])
        elif leg == "ppo":
            policy, seconds, samples = leg_ppo(out, quiet)
        elif leg == "grpo":
            policy, seconds, samples = leg_rl(presets.path("grpo"), out, quiet, [])
        else:
            preset = presets.DIR / "distillation" / "on_policy.yaml"
            source = teacher if leg == "distill" else policies["grpo"]
            policy, seconds, samples = leg_rl(preset, out, quiet, [f"reward.sources.0.path={source}"])
        figures = policy_figures(policy, sft, args.out / f"eval-{leg}")
        rows.append((leg, figures, seconds, samples))
        policies[leg] = policy
        print(
            f"{leg}: gold {figures['gold']:.3f}, KL {figures['kl']:.3f}, {seconds:.0f} s, samples {samples}", flush=True
        )
    print("\n| leg | held-out gold | English / Chinese prompts | KL to the SFT policy | wall time | samples |")
    print("|---|---|---|---|---|---|")
    for leg, figures, seconds, samples in [("SFT policy", before, 0.0, "—"), *rows]:
        print(f"| {leg} | {gold(figures)} | {figures['kl']:.2f} | {seconds / 60:.1f} min | {samples} |")
    if "distill" in legs:
        to_teacher(policies, teacher, args.out)
    if "distill-grpo" in legs:
        for name in ("SFT policy", "distill-grpo"):
            kl = policy_figures(policies[name], policies["grpo"], args.out / f"eval-{name.split()[0]}-grpo")["kl"]
            print(f"{name}: KL(π ‖ the grpo policy) {kl:.3f}", flush=True)


def gold(figures: dict[str, float]) -> str:
    return f"{100 * figures['gold']:.1f} % | {100 * figures['gold/en']:.1f} / {100 * figures['gold/zh']:.1f} %"


def to_teacher(policies: dict[str, Path], teacher: Path, out: Path) -> None:
    """The distillation table: each policy's gold and KL(π ‖ teacher) (policy_figures, the teacher as π_ref)."""
    print("\n| policy | held-out gold | English / Chinese prompts | KL(π ‖ teacher) |")
    print("|---|---|---|---|")
    for name, policy in {**policies, "teacher": teacher}.items():
        if name in ("SFT policy", "teacher", "distill", "grpo"):
            figures = policy_figures(policy, teacher, out / f"eval-{name.split()[0]}-teacher")
            print(f"| {name} | {gold(figures)} | {figures['kl']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
