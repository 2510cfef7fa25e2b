"""TRL's side of benchmarks/bench_vs_trl.py: GRPOTrainer for N steps, timed; run by the bench in
its own virtual environment (TRL is never a glassrl dependency), never by hand.

    <trl-venv>/bin/python benchmarks/trl_worker.py SPEC.json OUT.json

SPEC (written by the bench): model directory, prompts file, steps, threads, seed, and the shared
settings (prompts per step, samples, new tokens, β, lr, warm-up, clip ε, gradient clip). The reward
is glassrl's own arith-verify verifier, imported from the checkout's src/ (only
``glassrl.data.tasks``, which needs nothing TRL's environment lacks).

OUT: the settings as TRL resolved them (read back from GRPOConfig after its __post_init__), the
wall and CPU time at the end of every optimiser step, the per-step logs (reward, completion length,
token count), and the peak RSS.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def peak_rss_kib() -> int:
    """The peak resident set of this process (VmHWM of /proc/self/status), in KiB.

    Not ``ru_maxrss``: Linux keeps that across fork and execve, so a worker started by the bench
    reports at least the bench's own RSS at the fork (877 MiB for both models, whatever the model).
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/status has no VmHWM (not Linux?)")


# GRPOTrainer's methods timed as a step's phases (TRL 1.16): generation; the rewards; the whole
# rollout (generation, rewards, old and reference log-probs), once per optimiser step here.
TIMED = {
    "_generate_single_turn": "generate",
    "_calculate_rewards": "score",
    "_generate_and_score_completions": "rollout",
}


def timed(method, phase: str, seconds: dict[str, float]):
    """``method`` adding its wall time to ``seconds[phase]`` (the GPU synchronised at both ends, as
    glassrl's PhaseTimer does, so that queued kernels are charged to the phase that launched them)."""
    import torch

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def wrapper(*args, **kwargs):
        sync()
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            sync()
            seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - start

    return wrapper


def split_phases(seconds: dict[str, float], step: float) -> dict[str, float]:
    """One step's phases under glassrl's names: generate, score, logprobs (the rest of the rollout:
    old and reference log-probs), update (the rest of the step: forward, backward, optimiser), step."""
    generate, score, rollout = (seconds.get(k, 0.0) for k in ("generate", "score", "rollout"))
    return {
        "generate": generate,
        "score": score,
        "logprobs": rollout - generate - score,
        "update": step - rollout,
        "step": step,
    }


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    sys.path.insert(0, str(SRC))
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from glassrl.data.answers import extract_last_number
    from glassrl.data.tasks import arith_verify

    hf_logging.set_verbosity_error()
    s = spec["settings"]
    rows = [json.loads(line) for line in Path(spec["prompts"]).read_text(encoding="utf-8").splitlines() if line]

    def arith_verify_reward(prompts, completions, is_true, sum, lang, **kwargs) -> list[float]:  # noqa: A002
        """1.0 when verdict and sum are right in the question's language (glassrl's ArithVerifyVerifier)."""
        grades = [
            arith_verify.grade(c, {"is_true": t, "sum": n, "lang": lg})
            for c, t, n, lg in zip(completions, is_true, sum, lang)
        ]
        return [float(g.verdict_ok and g.sum_ok) for g in grades]

    def numeric_reward(prompts, completions, answer, **kwargs) -> list[float]:
        """1.0 when the completion's last number is the answer's (glassrl's NumericVerifier)."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(extract_last_number(t) == extract_last_number(a)) for t, a in zip(texts, answer)]

    if spec.get("chat"):  # conversational prompts: TRL renders them with the tokenizer's chat template, as glassrl
        rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
    reward = numeric_reward if spec.get("reward") == "numeric" else arith_verify_reward
    responses = s["prompts_per_step"] * s["samples"]
    args = GRPOConfig(
        output_dir=spec["out_dir"],
        max_steps=spec["steps"],
        seed=spec["seed"],
        use_cpu=spec["device"] == "cpu",
        bf16=spec.get("bf16", False),  # accelerate's autocast over fp32 weights, as glassrl's compute_dtype
        gradient_checkpointing=False,
        per_device_train_batch_size=s["micro_batch"],
        gradient_accumulation_steps=responses // s["micro_batch"],
        num_generations=s["samples"],
        max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=1.0,
        top_k=0,
        beta=s["kl_coef"],
        num_iterations=1,
        epsilon=s["clip"],
        loss_type="grpo",
        scale_rewards="group",
        learning_rate=s["lr"],
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=s["warmup_steps"],
        weight_decay=0.0,
        max_grad_norm=s["grad_clip"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
        # bench_gpu.py: every completion max_completion_length long (EOS never sampled); and TRL's
        # generation by transformers' continuous batching (paged cache) instead of generate
        generation_kwargs={"min_new_tokens": s["max_new_tokens"]} if spec.get("fixed_length") else None,
        use_transformers_continuous_batching=spec.get("trl_continuous_batching", False),
    )
    step_ends: list[float] = []
    cpu_ends: list[float] = []
    all_logs: list[dict] = []
    phases: list[dict] = []
    seconds: dict[str, float] = {}

    class Clock(TrainerCallback):
        """Wall time at the start of training and at the end of every optimiser step; every log."""

        def on_train_begin(self, *args, **kwargs):
            step_ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())

        def on_step_end(self, *args, **kwargs):
            step_ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())
            phases.append(split_phases(seconds, step_ends[-1] - step_ends[-2]))
            seconds.clear()

        def on_log(self, _args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                all_logs.append({**logs, "step": state.global_step})

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    for method, phase in TIMED.items():
        setattr(trainer, method, timed(getattr(trainer, method), phase, seconds))
    trainer.train()
    settings = {
        "trainer": "trl.GRPOTrainer",
        "trl": __import__("trl").__version__,
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "prompts per step": args.generation_batch_size // args.num_generations,
        "samples per prompt": args.num_generations,
        "max new tokens": args.max_completion_length,
        "optimiser steps per batch": args.generation_batch_size
        // (args.per_device_train_batch_size * args.gradient_accumulation_steps)
        * args.num_iterations,
        "micro-batch (responses)": args.per_device_train_batch_size,
        "KL": f"k3 in the loss, β = {args.beta:g}",
        "loss aggregation": {"grpo": "seq-mean-token-mean"}.get(args.loss_type, args.loss_type),
        "advantage": f"group mean/std ({args.scale_rewards})",
        "clip ε": f"{args.epsilon:g}/{args.epsilon_high if args.epsilon_high is not None else args.epsilon:g}",
        "lr": f"{args.learning_rate:g}, warm-up {args.warmup_steps}, constant",
        "gradient clip": f"{args.max_grad_norm:g}",
        "temperature / top-p / top-k": f"{args.temperature:g} / {args.top_p:g} / {args.top_k}",
        "bf16": bool(args.bf16),
        "gradient checkpointing": bool(args.gradient_checkpointing),
        "reward": "the last number" if reward is numeric_reward else "glassrl arith-verify verifier",
    }
    out = {
        "settings": settings,
        "step_ends": step_ends,
        "cpu_ends": cpu_ends,
        "logs": all_logs,
        "phases": phases,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "peak_rss_kib": peak_rss_kib(),
        "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
    }
    Path(out_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
