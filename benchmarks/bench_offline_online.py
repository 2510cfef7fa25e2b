"""The reference chapter's "Online & Offline RLHF", measured on the bundled task (docs/rlhf.md).

    .venv/bin/python benchmarks/bench_offline_online.py                     # every leg (~40 min on 2 loaded cores)
    .venv/bin/python benchmarks/bench_offline_online.py --legs dpo,grpo     # some of them

From the same SFT policy (the embedded default model) and on the same bundled data, each leg
trains with glassrl's own trainer, then every final policy is measured the same way
(glassrl.commands.pipeline.policy_figures): held-out gold accuracy (greedy answers to the first
200 arith-verify test prompts, judged by the task's verifier, the trainer's own evaluation) and
KL to the SFT policy (mean Σ_i log π/π_ref over 4 responses sampled at temperature 1 to each of
those prompts, nats per response).

- ``dpo``: offline. ``glassrl dpo examples/dpo.yaml`` on the preference pairs; no sampling.
- ``ppo``: online, on a learned reward. ``glassrl demo --pipeline rlhf``'s stages 2–3: the reward
  model on the same pairs (examples/rlhf/rm.yaml), then PPO on it (examples/rlhf/ppo.yaml).
- ``grpo``: online, on the gold verifier. ``glassrl train examples/grpo.yaml``.
- ``distill``: on-policy distillation (examples/distillation/on_policy.yaml): the student samples,
  the teacher — the default model's recipe at 10× its parameters (LARGE_SPEC of
  benchmarks/bench_vs_trl.py, built once into ``--teacher``) — scores every token; the same
  steps and samples as ``grpo``.

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
from glassrl.supervised.preference import PreferenceConfig, train_preference

LEGS = ("dpo", "ppo", "grpo", "distill")


def final_actor(run: Path) -> Path:
    """The actor of a training run's last checkpoint (a Hugging Face directory)."""
    return CheckpointManager(run / "checkpoints", keep=1).latest() / "actor"


def build_teacher(out: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_vs_trl import build_trained_large

    return build_trained_large(out)


def leg_dpo(out: Path, quiet: Console) -> tuple[Path, float, str]:
    cfg = load_config(PreferenceConfig, presets.path("dpo"), [f"output_dir={out}"])
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
    quiet = Console(file=io.StringIO())
    sft = default_model_dir()
    rows = []
    before = policy_figures(sft, sft, args.out / "eval-sft")
    print(f"SFT policy {sft}: held-out gold {before['gold']:.3f}", flush=True)
    for leg in legs:
        out = args.out / leg
        for stage in ("rm", "ppo") if leg == "ppo" else ("",):
            fresh_run_dir(out / stage)
        print(f"{leg}: training into {out} (load average {os.getloadavg()[0]:.1f})", flush=True)
        if leg == "dpo":
            policy, seconds, samples = leg_dpo(out, quiet)
        elif leg == "ppo":
            policy, seconds, samples = leg_ppo(out, quiet)
        elif leg == "grpo":
            policy, seconds, samples = leg_rl(presets.path("grpo"), out, quiet, [])
        else:
            teacher = build_teacher(args.teacher)
            preset = presets.DIR / "distillation" / "on_policy.yaml"
            policy, seconds, samples = leg_rl(preset, out, quiet, [f"reward.sources.0.path={teacher}"])
        figures = policy_figures(policy, sft, args.out / f"eval-{leg}")
        rows.append((leg, figures, seconds, samples))
        print(
            f"{leg}: gold {figures['gold']:.3f}, KL {figures['kl']:.3f}, {seconds:.0f} s, samples {samples}", flush=True
        )
    print(f"\n| leg | held-out gold (SFT {100 * before['gold']:.1f} %) | KL to the SFT policy | wall time | samples |")
    print("|---|---|---|---|---|")
    for leg, figures, seconds, samples in rows:
        print(f"| {leg} | {100 * figures['gold']:.1f} % | {figures['kl']:.2f} | {seconds / 60:.1f} min | {samples} |")


if __name__ == "__main__":
    main()
