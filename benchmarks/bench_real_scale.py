"""Every glassrl command at Qwen2.5-0.5B's full architecture on this CPU: wall time, peak RSS per phase,
and the memory estimate's figure beside the measured peak (issue 40).

    .venv/bin/python benchmarks/bench_real_scale.py --layers 2           # the same width and vocabulary, 2 layers
    nice -n 10 .venv/bin/python benchmarks/bench_real_scale.py           # 24 layers, 494 M parameters
    .venv/bin/python benchmarks/bench_real_scale.py --only grpo,dpo --steps 3

The model is ``glassrl init-model --arch qwen2.5-0.5b`` (random weights, bf16 on disk, Qwen's tokenizer and
ChatML template with tools), written into ``--out``. The data are written there too: GSM8K-like word
problems of 150–160 tokens once the template has rendered them (``problems``, also the prompts of
bench_vs_trl.py's ``--models qwen``), preference pairs over them, and calculator questions. Each case runs
``glassrl <command> …`` in a fresh process, one at a time:

- ``init-model``; ``sft`` on calculator questions answered by a Hermes ``<tool_call>`` (the
  model that ``agentic`` samples from: enough steps to learn the call's form, ``--sft-steps``);
- ``grpo`` (full parameters, k3 KL in the loss: the actor × 4 for weights, gradients and Adam's
  moments, π_ref once); ``grpo-checkpointing`` (the same with ``model.gradient_checkpointing=true``: the
  decoder layers' activations recomputed in backward); ``ppo-full`` (a critic that trains too) and
  ``ppo-lora`` (the same run with ``model.lora.r=16`` on actor and critic); ``dpo``; ``eval``; ``generate``;
  ``explain`` (``--model``, ``--sample 2``); ``agentic`` (GRPO with the calculator as a tool, calls in
  the Hermes format through Qwen's template, from the SFT model); ``audit`` (``glassrl audit --script``:
  a scripted episode of Hermes calls through the template, every mask and re-rendering checked).

Measured per case: wall time of the process; peak RSS per phase, exact (``VmHWM`` read and reset through
``/proc/self/clear_refs`` at each phase boundary, Linux ≥ 4.0): ``start`` (imports, model loading,
everything before the first phase), the trainer's own phases (glassrl.rl.metrics.PhaseTimer: generate,
score, logprobs, rewards, advantages, update), the RL step's seventh (log, ledger, evaluation,
checkpoint), sampling (the HF engine's ``generate``), the supervised trainers' reference log-probs,
forward+backward, optimiser step, evaluation and checkpoints, the run's report, and ``other`` (the rest
between phases). The memory estimate is what the command itself computed
before loading (every call of glassrl.models.memory.refuse_if_over is recorded, terms and memory
available); a refusal is that line, with its per-part figures.

A guard kills a case whose RSS passes ``--max-rss-gib`` or when the machine's MemAvailable falls under
1 GiB (the machine is shared), and says so in its row.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = 2**30
NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Ken", "Alexis", "Tina", "Randy", "Joy"]
ITEMS = [
    ("clips", "sold"),
    ("apples", "picked"),
    ("books", "read"),
    ("cupcakes", "baked"),
    ("stamps", "collected"),
    ("marbles", "found"),
    ("pencils", "bought"),
    ("cookies", "packed"),
]
TOOL_SYSTEM = "You are a careful assistant. Use the calculator for every sum."
CASES = ("init-model", "sft", "grpo", "grpo-checkpointing", "ppo-full", "ppo-lora", "dpo", "eval", "generate")
CASES += ("explain", "agentic", "audit")


# ------------------------------------------------------------------ the data


def problems(count: int, seed: int = 0) -> list[dict]:
    """``count`` GSM8K-like word problems (two quantities, a multiple, a loss, a price): prompt and answer;
    137 Qwen tokens each as text, about 160 once ChatML with the default system line renders them."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        name, other = rng.sample(NAMES, 2)
        item, verb = rng.choice(ITEMS)
        a, k, b, price = rng.randint(12, 96), rng.randint(2, 5), rng.randint(3, 40), rng.randint(2, 9)
        text = (
            f"{name} runs a small stall at the weekend market with {other}. In the first week, {name} {verb} {a} "
            f"{item}. In the second week, {name} {verb} {k} times as many {item} as in the first week, because the "
            f"weather was better and more families came to the market. At the end of the second week, {other} "
            f"borrowed {b} of the {item} for a school project and did not return them. Every one of the {item} that "
            f"{name} still has is then sold to a shop in town for ${price} each. How many dollars does {name} "
            f"receive from the shop in total? Think step by step, show each calculation, and write the final "
            f"number after '####'."
        )
        rows.append({"prompt": text, "answer": str((a + a * k - b) * price)})
    return rows


def solution(row: dict) -> str:
    """A worked answer ending in ``#### N``."""
    return f"Both weeks added, the borrowed ones taken away, times the price. #### {row['answer']}"


def tool_call(a: int, b: int) -> str:
    """The Hermes call Qwen2.5's template writes (glassrl.builtin.qwen)."""
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a}+{b}"}}}}\n</tool_call>'


def write_data(work: Path) -> dict[str, Path]:
    """The cases' data files in ``work``."""
    rng = random.Random(1)
    gsm = problems(64)
    pairs = [(rng.randint(100, 9999), rng.randint(100, 9999)) for _ in range(64)]
    files = {
        "gsm": [json.dumps(r) for r in gsm],
        # DPO scores every pair under π_ref before its first step: a few pairs (8 to train on, 4 held out)
        "prefs": [
            json.dumps({"prompt": r["prompt"], "chosen": solution(r), "rejected": f"I do not know. #### {i}"})
            for i, r in enumerate(gsm[:12])
        ],
        "calls": [json.dumps({"prompt": f"What is {a}+{b}?", "response": tool_call(a, b)}) for a, b in pairs],
        "agent": [json.dumps({"prompt": f"What is {a}+{b}?", "answer": str(a + b)}) for a, b in pairs],
    }
    files["prefs-eval"], files["prefs"] = files["prefs"][8:], files["prefs"][:8]
    files["calls-eval"] = files["calls"][:8]
    paths = {}
    for name, lines in files.items():
        paths[name] = work / f"{name}.jsonl"
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    a, b = pairs[0]
    paths["script"] = work / "script.json"
    paths["script"].write_text(json.dumps([tool_call(a, b), f"{a}+{b} = {a + b}."]), encoding="utf-8")
    return paths


# ------------------------------------------------------------------ the cases


def case_argv(name: str, model: Path, data: dict[str, Path], run: Path, args) -> list[str]:
    """``glassrl …`` arguments of case ``name``."""
    T, S = args.new_tokens, args.steps
    numeric = "reward.sources=[{name: numeric, weight: 1.0}]"
    sft_model = run.parent / "sft"
    actor = sft_model if name == "agentic" and (sft_model / "config.json").is_file() else model
    rl = [f"model.actor={actor}", f"output_dir={run}", f"steps={S}", "data.eval_size=0", "logging.eval_every=0"]
    rl += ["logging.ledger_every=1", "logging.checkpoint_every=0", f"rollout.max_new_tokens={T}", numeric]
    rl += ["batch.prompts_per_step=1", "batch.mini_batch_prompts=1", f"rollout.n={args.samples}"]
    rl += [f"batch.micro_batch_responses={args.samples}"]
    ppo = ["train", "ppo", *rl, f"data.train={data['gsm']}", "batch.epochs=1"]
    tools = ["rollout.agent.tools=[calculator]", "rollout.agent.call_format=hermes", "rollout.agent.max_turns=2"]
    tools += [f"data.system_prompt={TOOL_SYSTEM}"]
    prompt = problems(1, seed=7)[0]
    return {
        "init-model": ["init-model", "--arch", "qwen2.5-0.5b", "--out", str(model)]
        + ([] if args.layers is None else ["--layers", str(args.layers)]),
        "sft": ["sft", "sft", f"model={model}", f"data={data['calls']}", f"eval_data={data['calls-eval']}"]
        + [f"steps={args.sft_steps}", "batch_size=4", "max_length=96", "optim.lr=3e-4", "optim.warmup_steps=2"]
        + ["optim.decay=constant", f"output_dir={run}", "log_every=5", f"system_prompt={TOOL_SYSTEM}"],
        "grpo": ["train", "grpo", *rl, f"data.train={data['gsm']}"],
        "grpo-checkpointing": ["train", "grpo", *rl, f"data.train={data['gsm']}", "model.gradient_checkpointing=true"],
        "ppo-full": ppo,
        "ppo-lora": [*ppo, "model.lora.r=16"],
        "dpo": ["dpo", "dpo", f"model={model}", f"data={data['prefs']}", f"eval_data={data['prefs-eval']}"]
        + [f"steps={S}", "batch_size=2", f"max_length={args.prompt_tokens + 48}", f"output_dir={run}", "log_every=1"],
        "eval": ["eval", str(model), str(data["gsm"]), "numeric", "data.eval_size=8", f"rollout.max_new_tokens={T}"]
        + ["batch.prompts_per_step=4", "rollout.n=2", "--out", str(run)],
        "generate": ["generate", str(model), prompt["prompt"], "--n", str(args.samples), f"rollout.max_new_tokens={T}"],
        "explain": ["explain", "--model", str(model), "--prompt", prompt["prompt"], "--response", solution(prompt)]
        + ["--answer", prompt["answer"], "--sample", "2", "--format", "csv", "--out", str(run / "ledger.csv")],
        "agentic": ["train", "grpo", *rl, f"data.train={data['agent']}", *tools],
        "audit": ["audit", "grpo", f"model.actor={model}", f"data.train={data['agent']}", *tools]
        + ["--script", str(data["script"]), "--episodes", "2", f"rollout.max_new_tokens={T}"],
    }[name]


# ------------------------------------------------------------------ the worker (a fresh process per case)


def vm(field: str) -> int:
    """/proc/self/status's ``field`` (VmHWM, VmRSS) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class Phases:
    """Peak RSS and seconds per phase: at each outermost phase's start and end the peak since the last
    boundary (VmHWM) is charged to the segment that ends, and reset (``5`` into /proc/self/clear_refs)."""

    def __init__(self) -> None:
        self.name, self.depth, self.t0 = "start", 0, time.perf_counter()
        self.peak: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.order: list[str] = []
        self.lock = threading.Lock()
        self.on_close = lambda: None  # the worker's progress file, rewritten at each boundary

    def _close(self, next_name: str) -> None:
        now, peak = time.perf_counter(), vm("VmHWM")
        if self.name not in self.peak:
            self.order.append(self.name)
        self.peak[self.name] = max(self.peak.get(self.name, 0), peak)
        self.seconds[self.name] = self.seconds.get(self.name, 0.0) + now - self.t0
        Path("/proc/self/clear_refs").write_text("5")
        self.name, self.t0 = next_name, now
        self.on_close()

    @contextlib.contextmanager
    def phase(self, name: str):
        with self.lock:
            outer = self.depth == 0
            if outer:
                self._close(name)
            self.depth += 1
        try:
            yield
        finally:
            with self.lock:
                self.depth -= 1
                if outer:
                    self._close("other")

    def wrap(self, owner, attribute: str, name: str) -> None:
        """``owner.attribute`` (a function or method) timed as phase ``name``."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)

    def so_far(self) -> dict:
        return {"order": self.order, "peak": self.peak, "seconds": self.seconds, "in": self.name}

    def result(self) -> dict:
        self._close(self.name)
        return self.so_far()


def instrument(phases: Phases, estimates: list[dict], progress) -> None:
    """The phases to time (module docstring) and every memory estimate the command computes."""
    import glassrl.models.memory as memory
    import glassrl.rl.memory as rl_memory
    import glassrl.supervised.loop as supervised
    from glassrl.errors import GlassrlError
    from glassrl.rl import metrics
    from glassrl.rollout.hf import HFRolloutEngine
    from glassrl.supervised.preference import PreferenceObjective
    from glassrl.supervised.sft import SFTObjective

    original_phase = metrics.PhaseTimer.phase

    @contextlib.contextmanager
    def phase(self, name):
        with phases.phase(name), original_phase(self, name):
            yield

    metrics.PhaseTimer.phase = phase
    import glassrl.rl.loop as loop
    from glassrl.run.session import RunCheckpoints

    phases.wrap(HFRolloutEngine, "generate", "generate")
    phases.wrap(loop.Trainer, "_log_and_save", "log, ledger, checkpoint")  # the RL step's seventh phase
    phases.wrap(RunCheckpoints, "save", "checkpoint")  # the supervised trainers' too
    phases.wrap(loop, "write_run_report", "report")
    phases.wrap(PreferenceObjective, "_reference", "reference log-probs")
    phases.wrap(supervised, "accumulate", "forward+backward")
    phases.wrap(supervised, "guarded_step", "optimiser step")
    phases.wrap(PreferenceObjective, "evaluate", "eval")
    phases.wrap(SFTObjective, "evaluate", "eval")
    refuse = memory.refuse_if_over

    def recorded(terms, available, device, what, lower, detail=""):
        row = {"terms": dict(terms), "available": available, "what": what}
        estimates.append(row)
        progress()
        try:
            refuse(terms, available, device, what, lower, detail)
        except GlassrlError as err:
            row["refused"] = str(err)
            raise

    memory.refuse_if_over = recorded
    rl_memory.refuse_if_over = recorded


def worker(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    start = time.perf_counter()
    phases, estimates = Phases(), []
    import torch

    torch.set_num_threads(spec["threads"])
    from glassrl import cli

    def progress() -> None:  # what a case the guard kills leaves: its estimates and the phases it finished
        so_far = {"estimates": estimates, "phases": phases.so_far()}
        Path(out_path + ".progress").write_text(json.dumps(so_far))

    phases.on_close = progress
    instrument(phases, estimates, progress)
    rc = cli.main(spec["argv"])
    out = {"rc": rc, "wall_s": time.perf_counter() - start, "peak": vm("VmHWM"), "estimates": estimates}
    out["phases"] = phases.result()
    out["peak"] = max(out["phases"]["peak"].values())
    Path(out_path).write_text(json.dumps(out, indent=1))


# ------------------------------------------------------------------ the bench


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def run_case(name: str, argv: list[str], work: Path, args) -> dict:
    """Case ``name`` in a fresh process, watched by the guard; its result."""
    import psutil

    spec, out, log = work / f"{name}.spec.json", work / f"{name}.result.json", work / f"{name}.log"
    spec.write_text(json.dumps({"argv": argv, "threads": args.threads}))
    out.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "GLASSRL_THREADS": str(args.threads)}
    env |= {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start, killed = time.perf_counter(), None
    Path(str(out) + ".progress").unlink(missing_ok=True)
    with log.open("w") as f:
        command = [sys.executable, __file__, "--worker", str(spec), str(out)]
        child = subprocess.Popen(command, stdout=f, stderr=f, env=env)
        process = psutil.Process(child.pid)
        while child.poll() is None:
            try:
                rss = sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
            except psutil.NoSuchProcess:
                rss = 0
            if rss > args.max_rss_gib * GIB or mem_available() < GIB:
                killed = f"killed by the guard at {rss / GIB:.1f} GiB (MemAvailable {mem_available() / GIB:.1f} GiB)"
                child.kill()
                child.wait()
                break
            time.sleep(0.5)
    wall = time.perf_counter() - start
    progress = Path(str(out) + ".progress")
    if out.is_file():
        result = json.loads(out.read_text())
    else:  # killed or failed: what it had reached
        result = {"rc": child.returncode, "estimates": []}
        if progress.is_file():
            result |= json.loads(progress.read_text())
            if killed:
                killed += f", in its phase '{result['phases']['in']}'"
    progress.unlink(missing_ok=True)
    result |= {"name": name, "argv": argv, "process_wall_s": wall, "killed": killed}
    lines = log.read_text(errors="replace").splitlines()
    result["error"] = next((line for line in lines if line.startswith("glassrl ") and ": error:" in line), None)
    result["log_tail"] = lines[-6:]
    return result


def gib(x: float | None) -> str:
    return "—" if x is None else f"{x / GIB:.2f}"


def row(r: dict) -> str:
    """A Markdown row: command, wall, peak RSS, per phase, the estimate, outcome."""
    estimate = r["estimates"][-1] if r["estimates"] else None
    if estimate:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in estimate["terms"].items())
        said = f"{sum(estimate['terms'].values()) / GIB:.2f} ({parts}; available {gib(estimate['available'])})"
    else:
        said = "—"
    phases = r.get("phases")
    per_phase = (
        "; ".join(f"{p} {phases['peak'][p] / GIB:.2f} GiB / {phases['seconds'][p]:.1f} s" for p in phases["order"])
        if phases
        else "—"
    )
    if r["killed"]:
        outcome = r["killed"]
    elif estimate and "refused" in estimate:
        outcome = "refused by the estimate: " + estimate["refused"]
    elif r["rc"] == 0:
        outcome = "ok"
    else:
        outcome = f"exit {r['rc']}: {r['error'] or ' / '.join(r['log_tail'])}"
    peak = gib(r.get("peak"))
    return f"| {r['name']} | {r.get('wall_s', r['process_wall_s']):.1f} | {peak} | {said} | {per_phase} | {outcome} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, help="decoder layers (default: the full 24)")
    p.add_argument("--only", help=f"comma-separated cases, of: {', '.join(CASES)} (default: all, in that order)")
    p.add_argument("--out", default=str(Path.home() / ".cache" / "glassrl" / "bench-real-scale"), help="work dir")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of each case (default 2)")
    p.add_argument("--steps", type=int, default=2, help="training steps of grpo, ppo, dpo, agentic (default 2)")
    p.add_argument("--sft-steps", type=int, default=16, help="SFT steps on the tool-call answers (default 16)")
    p.add_argument("--samples", type=int, default=8, help="responses per prompt (default 8)")
    p.add_argument("--new-tokens", type=int, default=64, help="rollout.max_new_tokens (default 64)")
    p.add_argument("--prompt-tokens", type=int, default=160, help="the prompts' rendered length, for DPO's max_length")
    p.add_argument("--max-rss-gib", type=float, default=20.0, help="the guard: a case past this RSS is killed")
    p.add_argument("--keep", action="store_true", help="keep each case's run directory (checkpoints: GBs)")
    p.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(*args.worker)
    names = args.only.split(",") if args.only else list(CASES)
    if unknown := [n for n in names if n not in CASES]:
        p.error(f"--only: unknown {', '.join(unknown)} (choose from {', '.join(CASES)})")
    size = "full" if args.layers is None else f"l{args.layers}"
    work = Path(args.out) / size
    work.mkdir(parents=True, exist_ok=True)
    model, data = work / "model", write_data(work)
    if "init-model" not in names and not (model / "config.json").is_file():
        names.insert(0, "init-model")
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"load average at start: {os.getloadavg()}; MemAvailable {mem_available() / GIB:.1f} GiB", flush=True)
    rows = []
    for name in names:
        run = work / "runs" / name
        shutil.rmtree(run, ignore_errors=True)
        if name == "explain":
            run.mkdir(parents=True)  # where its ledger goes
        if name == "init-model":
            shutil.rmtree(model, ignore_errors=True)
        argv = case_argv(name, model, data, run, args)
        print(f"{name}: glassrl {' '.join(argv)}", flush=True)
        result = run_case(name, argv, work, args)
        rows.append(row(result))
        print(rows[-1], flush=True)
        (work / f"{name}.json").write_text(json.dumps(result, indent=1))
        if not args.keep and name != "sft":
            shutil.rmtree(run, ignore_errors=True)
    print(f"\nload average at end: {os.getloadavg()}\n")
    print("| command | wall s | peak RSS GiB | estimate before loading, GiB | peak RSS / s per phase | result |")
    print("|---|---:|---:|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
