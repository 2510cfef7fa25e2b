"""What a ``glassrl train`` run decides and says at start, before its first step: the prompts it read,
where responses stop, which faster paths run (and why not where one cannot: no faster path turns off
silently), how freed memory is kept, and whether phase 3's log π_old can come from the update's own
forward pass. Trainer (glassrl.rl.loop) calls these once; they hold no state."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from glassrl.models.allocator import keep_freed_memory, memory_path
from glassrl.models.loading import load_tokenizer, resolve_device
from glassrl.rl.build import Workers, prompt_format
from glassrl.rl.config import TrainConfig
from glassrl.rl.prompts import build_prompts
from glassrl.rl.resolve import Resolved, layout_path
from glassrl.rollout.stops import describe as describe_stops
from glassrl.rollout.stops import saved_generation_config
from glassrl.workers.base import OnPolicyActor


def say(console: Console, line: str) -> None:
    console.print(line, markup=False, soft_wrap=True)


def freed_memory_path(cfg: TrainConfig) -> str:
    """glibc keeps freed memory for the next step on CPU (glassrl.models.allocator); the start-up
    line's account of it."""
    if resolve_device(cfg.model.device).type != "cpu":
        return "malloc left as it is: the policy is not on the CPU"
    return memory_path(keep_freed_memory())


def load_prompts(cfg: TrainConfig, path: Path, console: Console):
    """The tokenizer and the run's prompts (prompt sets, chat template, length rule; an agentic run's
    prompts with their tools described), and the start-up lines that say what was read and where
    responses stop."""
    tokenizer = load_tokenizer(path)
    data = build_prompts(cfg, tokenizer, path, prompt_format(cfg, tokenizer))
    stops = describe_stops(tokenizer, saved_generation_config(path), cfg.rollout.stop)
    for line in [*data.summary(), stops]:
        say(console, line)
    return tokenizer, data


def say_paths(cfg: TrainConfig, workers: Workers, layout: str, memory: str, console: Console) -> dict[str, str]:
    """Which faster paths run (the rollout, the forward passes' layout, the optimiser, memory)."""
    paths = {**workers.paths, "forward passes": layout_path(cfg.model, layout), "memory": memory}
    for what in ("rollout", "forward passes", "optimiser", "memory", "nodes"):
        if what in paths:  # "nodes": the Ray backend's (glassrl.workers.ray_nodes.placement_line)
            say(console, f"{what}: {paths[what]}")
    return paths


def old_logprobs_from_update(cfg: TrainConfig, resolved: Resolved, workers: Workers, teacher) -> bool:
    """π_old = π_θ when the batch makes exactly one optimiser step and nothing before the update
    reads log π_old (a KL in the reward does, and an off-policy correction's weights): then the
    update's forward gives it (phase 3). A stale batch without a correction still gets it there:
    its clip anchors at the log μ it brings (glassrl.rl.update.actor_batch)."""
    return (
        resolved.optimizer_steps_per_step == 1
        and cfg.algo.kl.placement != "reward"
        and resolved.correction is None
        and teacher is None  # the teacher's reward reads log π_old in phase 4
        and isinstance(workers.actor, OnPolicyActor)
    )
