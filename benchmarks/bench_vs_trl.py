"""glassrl against TRL's GRPOTrainer on the same work, side by side, in one invocation (issue 14).

    .venv/bin/python benchmarks/bench_vs_trl.py            # 30 steps, default and large model
    .venv/bin/python benchmarks/bench_vs_trl.py --models large-random --steps 8
    .venv/bin/python benchmarks/bench_vs_trl.py --quick    # 4 steps, default model (make bench)

What it does:

1. the models (``--models``):
   ``default``: the embedded default model (``glassrl init-model``: 1.09 M parameters, SFT on the
   bundled tasks);
   ``large``: about 10× its parameters (hidden 256, 10 layers, 10.6 M), built by the same recipe
   (glassrl.builtin.default_model: tokenizer, SFT mix, held-out evaluation) at that size, with
   the SFT settings of LARGE_SPEC; built once (about 7 min on one thread) into ``<out>/large``,
   rebuilt only when LARGE_SPEC changes; it answers and stops at EOS as the default model does;
   ``large-random``: the same architecture **randomly initialised** over the default model's
   tokenizer: it never emits EOS and earns no reward, so every response is max_new_tokens long;
   its throughput is real, its reward curve is not a learning curve;
2. the shared prompts: 512 arith-verify train prompts, as JSON lines (prompt, answer, metadata);
3. TRL in its own virtual environment (``--trl-venv``, created on first use with
   ``pip install torch==2.13.0 trl==1.16.0 transformers==<glassrl's>``): never a glassrl
   dependency; its side runs benchmarks/trl_worker.py there as a subprocess;
4. per model: glassrl (the grpo preset) and TRL in fresh subprocesses, one after the other, each
   for the same steps; each reports the settings as its library resolved them, which are printed
   side by side and must be equal (16 prompts × 8 samples, 16 new tokens, one optimiser step per
   batch, k3 KL β = 0.001 in the loss, same lr, clip, gradient clip, threads, bf16 off, gradient
   checkpointing off, the same arith-verify verifier as reward);
5. the table: steps/s, generated tokens/s, trained tokens/s (prompt + response tokens of the
   batch), peak RSS, each glassrl/TRL, and the reward per step.

Timing: wall time between the ends of consecutive optimiser steps, the first step left out
(warm-up): each library's whole step (generation, reward, log-probs, update, its own logging); and
"steps/s, first step included", the steps over the whole training call's time (glassrl: from the
first step's start, the Trainer built; TRL: from ``on_train_begin``), what an outsider timing
``train()`` gets; and "steps/s, whole process", the steps over the worker process's wall time
(interpreter start, imports, model and reference loading, prompt preparation, the steps, exit):
what an outsider timing each library's command gets. The three ratios are printed per pair.
Threads: ``--threads 1`` gives both sides one thread, as an outsider's harness did (glassrl's own
choice takes the cores free).
"CPU s per step" is the worker's CPU time (all its threads) per step: steadier than wall time on
a shared machine, and with one thread the work itself. Peak RSS is the worker process's VmHWM
(model, reference model, optimiser, libraries).
glassrl writes no ledger, checkpoint or report here (TRL's run writes none either).
The load average is printed before and after: figures taken on a shared machine are noise
beyond what its load explains.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

from glassrl.models.default_model import DEFAULT_SPEC
from glassrl.rollout.stops import StopSet
from trl_worker import peak_rss_kib  # benchmarks/, beside this file

HERE = Path(__file__).resolve().parent
TRL_VERSION, TORCH_VERSION = "1.16.0", "2.13.0"
QUICK_STEPS, FULL_STEPS = 4, 30
PROMPTS = 512
# The shared work: the grpo preset's settings (examples/grpo.yaml), which TRL is given too.
SETTINGS = {
    "prompts_per_step": 16,
    "samples": 8,
    "max_new_tokens": 16,
    "micro_batch": 32,
    "kl_coef": 0.001,
    "clip": 0.2,
    "lr": 1e-4,
    "warmup_steps": 5,
    "grad_clip": 1.0,
    "temperature": 1.0,
}
# The larger model: the default model's layout, about 10× its parameters.
LARGE = {"hidden_size": 256, "num_layers": 10, "num_heads": 4, "intermediate_size": 1024}
# The trained large model: the default model's recipe (DEFAULT_SPEC: tasks, SFT mix, batch 32,
# weight decay 0.1) at LARGE's sizes, with 600 SFT steps at lr 1e-3 (warm-up 50, cosine). Measured
# here (seed 0, one thread, arith-verify held-out exact; the default model: 0.408 after 800 steps
# at 3e-3, 174 s): 3e-3 is too high at 10x the parameters (400 steps: 0.140, eval loss 0.39 against
# 0.16 at 1e-3); at 1e-3, 400 steps 0.284 (232 s), 600 steps 0.344 (391 s), 800 steps 0.326 (528 s,
# train prompts 0.506: it memorises the train operand pairs); 2e-3 for 600 steps 0.326, and weight
# decay 1.0 0.300. 600 steps at 1e-3 is the best held-out figure and the cheapest near it.
LARGE_SPEC = replace(DEFAULT_SPEC, **LARGE, sft_steps=600, lr=1e-3, warmup_steps=50)
# Qwen2.5-0.5B's architecture (issue 40): ``glassrl init-model --arch qwen2.5-0.5b`` (random weights, Qwen's
# tokenizer and chat template), float32 on disk so that both sides load the same weights in the same dtype
# (transformers 5 loads a checkpoint in its stored dtype). Its work is the issue's: GSM8K-like prompts of
# ~160 tokens once ChatML renders them (bench_real_scale.problems), 8 samples of 128 new tokens, every
# response that long (random weights: EOS is never meant), one prompt per step on a CPU.
QWEN = "qwen2.5-0.5b"
QWEN_SETTINGS = {**SETTINGS, "prompts_per_step": 1, "max_new_tokens": 128, "micro_batch": 8}
MODELS = ("default", "large", "large-random", QWEN)


# ------------------------------------------------------------------ setup


def build_trained_large(out: Path) -> Path:
    """The default model's recipe at LARGE_SPEC (seed 0) into ``out``, unless it is there already."""
    from glassrl.builtin.default_model import build_default_model, ensure_built

    console = Console()
    return ensure_built(
        out,
        0,
        LARGE_SPEC,
        "bench-large (the default model's recipe at LARGE_SPEC)",
        lambda tmp: build_default_model(tmp, seed=0, spec=LARGE_SPEC, console=console),
        False,
        console,
    )


def build_random_large(out: Path, default_dir: Path) -> Path:
    """A randomly initialised Llama of LARGE's size over the default model's tokenizer (seed 0)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from glassrl.models.default_model import llama_config

    marker = out / "bench-large.json"
    if marker.is_file() and json.loads(marker.read_text()) == LARGE:
        return out
    tokenizer = AutoTokenizer.from_pretrained(default_dir)
    spec = replace(DEFAULT_SPEC, **LARGE)
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(spec, tokenizer))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker.write_text(json.dumps(LARGE))
    return out


def built(model_dir: Path) -> str:
    """A trained model's build record (glassrl.json) in a line: build time, SFT loss, held-out accuracy."""
    info = json.loads((model_dir / "glassrl.json").read_text(encoding="utf-8"))
    held, train = info["heldout_arith_verify"], info["train_arith_verify"]
    return (
        f"built in {info['build_time_s']:.0f} s, {info['sft_steps']} SFT steps (loss {info['train_loss']:.3f}, "
        f"eval {info['eval_loss']:.3f}); arith-verify held-out exact/verdict/format "
        f"{held['exact']:.3f}/{held['verdict']:.3f}/{held['format']:.3f} (train {train['exact']:.3f})"
    )


def write_qwen(out: Path, layers: int | None) -> Path:
    """Qwen2.5-0.5B's architecture, ``layers`` of its decoder layers (all 24 by default), random weights
    (seed 0) in float32, into ``out``, unless it is there already."""
    from glassrl.builtin.qwen import write_qwen_model

    marker = out / "glassrl-arch.json"
    if marker.is_file() and json.loads(marker.read_text()).get("layers") == (layers or 24):
        return out
    shutil.rmtree(out, ignore_errors=True)
    return write_qwen_model(QWEN, out, layers=layers, dtype="float32")


def write_gsm_prompts(path: Path) -> Path:
    """64 GSM8K-like word problems (bench_real_scale.problems) as JSON lines: prompt and answer."""
    from bench_real_scale import problems  # benchmarks/, beside this file

    path.write_text("".join(json.dumps(row) + "\n" for row in problems(64)), encoding="utf-8")
    return path


def write_prompts(path: Path) -> Path:
    """512 arith-verify train prompts as JSON lines: prompt, answer and the metadata fields."""
    from glassrl.data.tasks import load_task

    rows = [{"prompt": r.prompt, "answer": r.answer, **r.metadata} for r in load_task("arith-verify", "train")]
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows[:PROMPTS]), encoding="utf-8")
    return path


def ensure_trl_venv(venv: Path) -> Path:
    """The TRL environment's python; created (or re-created when its versions differ) with pip."""
    import transformers

    want = {"trl": TRL_VERSION, "torch": TORCH_VERSION, "transformers": transformers.__version__}
    python = venv / "bin" / "python"
    probe = (
        "import json, trl, torch, transformers; "
        "print(json.dumps({m.__name__: m.__version__.split('+')[0] for m in (trl, torch, transformers)}))"
    )
    if python.is_file():
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True)
        if found.returncode == 0 and json.loads(found.stdout.strip().splitlines()[-1]) == want:
            return python
    print(f"creating the TRL environment {venv} (pip install trl=={TRL_VERSION}): a few minutes", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pins = [f"{name}=={version}" for name, version in want.items()]
    subprocess.run([python, "-m", "pip", "install", "--quiet", *pins], check=True)
    return python


def versions(python) -> str:
    """The versions of the libraries that decide the speed, as ``python``'s environment has them."""
    probe = (
        "import importlib.metadata as m\n"
        "names = ('glassrl', 'trl', 'torch', 'transformers', 'tokenizers', 'accelerate')\n"
        "found = []\n"
        "for n in names:\n"
        "    try: found.append(f'{n} {m.version(n)}')\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(', '.join(found))"
    )
    return subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.strip()


def parameters(model_dir: Path) -> int:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min) on {len(os.sched_getaffinity(0))} cores"


# ------------------------------------------------------------------ glassrl's side (a subprocess)


def glassrl_overrides(spec: dict) -> list[str]:
    """The grpo preset's overrides that give glassrl ``spec``'s model, prompts and SETTINGS."""
    s = spec["settings"]
    return [
        f"output_dir={spec['out_dir']}",
        f"model.actor={spec['model']}",
        f"model.device={spec['device']}",
        f"data.train={spec['prompts']}",
        "data.eval_size=0",
        f"seed={spec['seed']}",
        f"steps={spec['steps'] + 1}",  # never the last step: no final checkpoint, evaluation or report
        f"batch.prompts_per_step={s['prompts_per_step']}",
        f"batch.mini_batch_prompts={s['prompts_per_step']}",
        f"batch.micro_batch_responses={s['micro_batch']}",
        "batch.epochs=1",
        f"rollout.n={s['samples']}",
        f"rollout.max_new_tokens={s['max_new_tokens']}",
        f"rollout.temperature={s['temperature']}",
        f"algo.kl.coef={s['kl_coef']}",
        f"algo.clip_low={s['clip']}",
        f"algo.clip_high={s['clip']}",
        f"actor_optim.lr={s['lr']}",
        f"actor_optim.warmup_steps={s['warmup_steps']}",
        f"actor_optim.grad_clip={s['grad_clip']}",
        "actor_optim.weight_decay=0.0",
        "logging.ledger_every=0",
        "logging.checkpoint_every=0",
        "logging.eval_every=0",
        f"model.compute_dtype={'bfloat16' if spec['bf16'] else 'float32'}",
        *(["reward.sources=[{name: numeric, weight: 1.0}]"] if spec.get("reward") == "numeric" else []),
        *spec.get("glassrl_overrides", []),
    ]


def glassrl_worker(spec_path: str, out_path: str) -> None:
    """Runs in a fresh process: the grpo preset with SETTINGS on spec's model and prompts, timed.
    spec["threads"] = 0: glassrl's own choice (glassrl.models.threads.set_threads)."""
    spec = json.loads(Path(spec_path).read_text())
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    else:
        from glassrl.models.threads import set_threads

        set_threads()
    from glassrl import presets
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer

    shutil.rmtree(spec["out_dir"], ignore_errors=True)
    overrides = glassrl_overrides(spec)
    cfg = load_config(TrainConfig, presets.path("grpo"), overrides)
    trainer = Trainer(cfg, console=Console(file=open(os.devnull, "w")), progress=False)
    tokens: list[tuple[int, int]] = []  # per step: (generated, prompt + response)
    generate = trainer.workers.rollout.generate

    def counted(*args, **kwargs):
        batch = generate(*args, **kwargs)
        generated = int(batch.response_mask.sum())
        tokens.append((generated, generated + int(batch.prompt_mask.sum())))
        return batch

    trainer.workers.rollout.generate = counted
    if spec.get("fixed_length"):  # every response max_new_tokens long (bench_gpu.py): no stop token
        trainer.workers.rollout.engine.stops = StopSet((), ())
    step_ends, cpu_ends, rewards, phases = [time.perf_counter()], [time.process_time()], [], []
    for _ in range(spec["steps"]):
        metrics = trainer.step()
        step_ends.append(time.perf_counter())
        cpu_ends.append(time.process_time())
        rewards.append(metrics["reward/mean"])
        # the step's phases (glassrl.rl.metrics.PhaseTimer: synchronised on CUDA)
        seconds = (k for k in metrics if k.startswith("perf/") and k.endswith("_s") and not k.endswith("_per_s"))
        phases.append({k.removeprefix("perf/").removesuffix("_s"): metrics[k] for k in seconds})
    a, b, r, o = cfg.algo, cfg.batch, cfg.rollout, cfg.actor_optim
    settings = {
        "trainer": "glassrl Trainer (grpo preset)",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "prompts per step": b.prompts_per_step,
        "samples per prompt": r.n,
        "max new tokens": r.max_new_tokens,
        "optimiser steps per batch": b.epochs * (b.prompts_per_step // b.mini_batch_prompts),
        "micro-batch (responses)": b.micro_batch_responses,
        "KL": f"{a.kl.kind} in the {a.kl.placement}, β = {a.kl.coef:g}",
        "loss aggregation": a.loss_agg,
        "advantage": "group mean/std (group)" if a.advantage == "grpo" and not a.whiten_advantages else a.advantage,
        "clip ε": f"{a.clip_low:g}/{a.clip_high:g}",
        "lr": f"{o.lr:g}, warm-up {o.warmup_steps}, {o.decay}",
        "gradient clip": f"{o.grad_clip:g}",
        "temperature / top-p / top-k": f"{r.temperature:g} / {r.top_p:g} / {r.top_k}",
        "bf16": cfg.model.compute_dtype == "bfloat16",
        "gradient checkpointing": cfg.model.gradient_checkpointing,
        "reward": {"arith_verify": "glassrl arith-verify verifier", "numeric": "the last number"}.get(
            "+".join(src["name"] for src in cfg.reward.sources), str(cfg.reward.sources)
        ),
    }
    out = {
        "settings": settings,
        "step_ends": step_ends,
        "cpu_ends": cpu_ends,
        "tokens": tokens,
        "rewards": rewards,
        "phases": phases,
        "rollout path": trainer.paths["rollout"],
        "peak_rss_kib": peak_rss_kib(),
        "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
    }
    Path(out_path).write_text(json.dumps(out, indent=1))


# ------------------------------------------------------------------ the comparison


def run(side: str, command: list, spec: dict, work: Path) -> dict:
    """Run one side's worker in a fresh process with ``spec``; its JSON result."""
    spec_path, out_path = work / f"{side}-spec.json", work / f"{side}-result.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    threads = {"OMP_NUM_THREADS": str(spec["threads"]), "GLASSRL_THREADS": str(spec["threads"])}
    env = {
        **{k: v for k, v in os.environ.items() if k not in threads},
        **(threads if spec["threads"] else {}),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONWARNINGS": "ignore",
    }
    log = work / f"{side}.log"
    start = time.perf_counter()
    with log.open("w") as f:
        done = subprocess.run([*command, str(spec_path), str(out_path)], env=env, stdout=f, stderr=subprocess.STDOUT)
    process_s = time.perf_counter() - start
    if done.returncode != 0 or not out_path.is_file():
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise SystemExit(f"{side} worker failed (exit {done.returncode}); the end of {log}:\n" + "\n".join(tail))
    return {**json.loads(out_path.read_text()), "process_s": process_s}


def summarise(result: dict, responses: int) -> dict:
    """steps/s, tokens/s over steps 2..N; the per-step rewards; peak RSS in MiB."""
    ends = result["step_ends"]
    steps = len(ends) - 1
    seconds = ends[-1] - ends[1]  # steps 2..N
    if "tokens" in result:  # glassrl: counted at the rollout
        generated = [g for g, _ in result["tokens"]]
        trained = [t for _, t in result["tokens"]]
        rewards = result["rewards"]
    else:  # TRL: from its per-step logs
        logs = sorted(result["logs"], key=lambda x: x["step"])
        generated = [round(x["completions/mean_length"] * responses) for x in logs]
        cumulative = [0] + [x["num_tokens"] for x in logs]
        trained = [round(b - a) for a, b in zip(cumulative, cumulative[1:])]
        rewards = [x["reward"] for x in logs]
    return {
        "steps": steps,
        "steps/s": (steps - 1) / seconds,
        # what an outsider timing the whole training call gets: the first step (warm-up) included
        "steps/s, first step included": steps / (ends[-1] - ends[0]),
        # what an outsider timing the whole command gets: interpreter, imports, model loading, steps, exit
        "steps/s, whole process": steps / result["process_s"],
        "generated tokens/s": sum(generated[1:]) / seconds,
        "trained tokens/s": sum(trained[1:]) / seconds,
        "peak RSS (MiB)": result["peak_rss_kib"] / 1024,
        **({"peak GPU memory (MiB)": result["peak_cuda_mib"]} if result.get("peak_cuda_mib") else {}),
        "step s (median)": statistics.median(b - a for a, b in zip(ends[1:], ends[2:])),
        "CPU s per step": (result["cpu_ends"][-1] - result["cpu_ends"][1]) / (steps - 1),
        "response tokens (mean)": sum(generated) / (responses * len(generated)),  # all steps, as the rewards
        "rewards": rewards,
    }


def check_settings(ours: dict, theirs: dict) -> bool:
    """Print the settings side by side; True when every shared one is equal."""
    skip = {"trainer", "trl", "transformers", "torch"}
    keys = [k for k in ours if k not in skip]
    equal = all(str(ours[k]) == str(theirs.get(k)) for k in keys)
    width = max(len(k) for k in keys)
    print(f"\n{'setting':<{width}}  {'glassrl':<30} {'TRL':<30}")
    for k in keys:
        mark = "" if str(ours[k]) == str(theirs.get(k)) else "   <-- differs"
        print(f"{k:<{width}}  {str(ours[k]):<30} {str(theirs.get(k)):<30}{mark}")
    print(
        f"{'versions':<{width}}  torch {ours['torch']:<24} trl {theirs['trl']}, transformers {theirs['transformers']}"
    )
    return equal


def table(name: str, params: int, ours: dict, theirs: dict) -> None:
    rows = ["steps/s", "steps/s, first step included", "steps/s, whole process", "generated tokens/s"]
    rows += ["trained tokens/s", "peak RSS (MiB)"]
    rows += ["step s (median)", "CPU s per step"]
    rows.append("response tokens (mean)")
    if "peak GPU memory (MiB)" in ours and "peak GPU memory (MiB)" in theirs:
        rows.insert(4, "peak GPU memory (MiB)")
    print(f"\n{name} model ({params:,} parameters), {ours['steps']} steps, the first left out but where said:")
    print("| measure | glassrl | TRL | glassrl/TRL |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row} | {_figure(ours[row])} | {_figure(theirs[row])} | {ours[row] / theirs[row]:.2f} |")
    for side, s in (("glassrl", ours), ("TRL", theirs)):
        print(f"reward per step, {side:<7}: " + " ".join(f"{r:.2f}" for r in s["rewards"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps on the default model (make bench)")
    p.add_argument("--steps", type=int, help=f"training steps per side (default {FULL_STEPS}; --quick {QUICK_STEPS})")
    p.add_argument(
        "--models",
        default=None,
        help="comma-separated, of: default (the embedded model), large (10x, trained by the same recipe),\n"
        "large-random (10x, random weights: max-length responses, no reward),\n"
        f"{QWEN} (its architecture, random weights, Qwen's tokenizer: GSM8K-like prompts, 128 tokens)\n"
        "(default: default,large; --quick: default)",
    )
    p.add_argument("--threads", type=int, help="intra-op threads of both sides (default: glassrl's choice)")
    p.add_argument("--pairs", type=int, default=1, help="glassrl/TRL runs per model, alternating; medians reported")
    p.add_argument("--device", default="cpu", help="cpu or cuda (both sides)")
    p.add_argument("--out", default=str(Path.home() / ".cache" / "glassrl" / "bench-vs-trl"), help="work directory")
    p.add_argument("--trl-venv", default=str(Path.home() / ".cache" / "glassrl" / "bench-trl-venv"))
    p.add_argument(
        "--trl-python",
        help="run TRL's side with this interpreter (trl importable there) instead of --trl-venv: "
        "a GPU machine without pip",
    )
    p.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides (fp32 master weights)")
    p.add_argument(
        "--glassrl",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="glassrl-only options that change how, not what, it computes (e.g. model.shared_prefix=true)",
    )
    p.add_argument(
        "--qwen-layers", type=int, help=f"the {QWEN} model with this many of its 24 decoder layers (a quick check)"
    )
    p.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return glassrl_worker(*args.worker)

    from glassrl.builtin.default_model import ensure_default_model
    from glassrl.models.threads import choose_threads

    steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    names = (args.models or ("default" if args.quick else "default,large")).split(",")
    if unknown := [n for n in names if n not in MODELS]:
        p.error(f"--models: unknown {', '.join(unknown)} (choose from {', '.join(MODELS)})")
    threads, why = (args.threads, "--threads") if args.threads else choose_threads()
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"load average at start: {load_average()}; threads: {threads} ({why})")
    if args.glassrl:
        print(f"glassrl options (same work, other execution): {' '.join(args.glassrl)}")
    default_dir = ensure_default_model()
    models = {"default": default_dir}
    if "default" in names:
        print(f"default model: {built(default_dir)}")
    if "large" in names:
        start = time.perf_counter()
        models["large"] = build_trained_large(work / "large")
        print(f"large model ready in {time.perf_counter() - start:.1f} s: {built(models['large'])}", flush=True)
    if "large-random" in names:
        models["large-random"] = build_random_large(work / "large-random", default_dir)
    if QWEN in names:
        layers = f"-{args.qwen_layers}l" if args.qwen_layers else ""
        models[QWEN] = write_qwen(work / f"{QWEN}{layers}", args.qwen_layers)
    prompts = write_prompts(work / "prompts.jsonl")
    gsm_prompts = write_gsm_prompts(work / "gsm-prompts.jsonl")
    trl_python = Path(args.trl_python) if args.trl_python else ensure_trl_venv(Path(args.trl_venv))
    print(f"versions: glassrl side {versions(sys.executable)}; TRL side {versions(trl_python)}")
    ok = True
    for name in names:
        settings = QWEN_SETTINGS if name == QWEN else SETTINGS
        responses = settings["prompts_per_step"] * settings["samples"]
        spec = {
            "model": str(models[name]),
            "prompts": str(gsm_prompts if name == QWEN else prompts),
            "steps": steps,
            "threads": threads,
            "seed": 0,
            "device": args.device,
            "bf16": args.bf16,
            "glassrl_overrides": args.glassrl,
            "settings": settings,
            **({"fixed_length": True, "reward": "numeric", "chat": True} if name == QWEN else {}),
        }
        pairs = []
        for i in range(args.pairs):
            print(f"{name} model, pair {i + 1}/{args.pairs}: glassrl ...", end="", flush=True)
            ours = run(
                "glassrl", [sys.executable, __file__, "--worker"], {**spec, "out_dir": str(work / "glassrl-run")}, work
            )
            print(" TRL ...", end="", flush=True)
            theirs = run(
                "trl", [trl_python, str(HERE / "trl_worker.py")], {**spec, "out_dir": str(work / "trl-run")}, work
            )
            print(" done", flush=True)
            pairs.append((ours, theirs))
        ok &= check_settings(pairs[0][0]["settings"], pairs[0][1]["settings"])
        summaries = [(summarise(o, responses), summarise(t, responses)) for o, t in pairs]
        table(name, parameters(models[name]), _median(s for s, _ in summaries), _median(t for _, t in summaries))
        for measure in ("steps/s", "steps/s, first step included", "steps/s, whole process"):
            ratios = [s[measure] / t[measure] for s, t in summaries]
            each = "  ".join(f"{r:.2f}" for r in ratios)
            print(f"{measure} glassrl/TRL of each pair, in order: {each}; median {statistics.median(ratios):.2f}")
    print(f"\nload average at end: {load_average()}")
    if not ok:
        raise SystemExit("the two sides' settings differ (marked above): the figures do not compare the same work")


def _figure(x: float) -> str:
    """Two decimals, or three significant digits below 1 (0.5 B steps/s on a CPU: 0.00712)."""
    return f"{x:.3g}" if abs(x) < 1 else f"{x:,.2f}"


def _median(summaries) -> dict:
    """Per measure, the median over pairs (the reward curve of the first pair)."""
    summaries = list(summaries)
    out = dict(summaries[0])
    for key, value in out.items():
        if isinstance(value, float):
            out[key] = statistics.median(s[key] for s in summaries)
    return out


if __name__ == "__main__":
    main()
