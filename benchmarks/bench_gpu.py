"""glassrl against TRL's GRPOTrainer on a GPU, on a model of a size people post-train (issue 30).

    python3 benchmarks/bench_gpu.py --trl-python python3          # one H100: a few minutes
    .venv/bin/python benchmarks/bench_gpu.py --smoke --sides glassrl   # CPU, a tiny config: seconds

The model: Qwen2-0.5B's configuration (24 layers, hidden 896, 14 query / 2 key-value heads, MLP
4864, vocabulary 151,936, tied embeddings: 494 M parameters), **randomly initialised** (seed 0;
nothing is downloaded), saved in float32 with a byte-level tokenizer built here whose vocabulary is
the configuration's (256 byte tokens, two special tokens, and filler tokens up to 151,936 that no
text encodes to but the model may sample). Random weights earn no reward: the figures are
throughput, not learning. ``--smoke``: the same architecture at a tiny size, on the CPU.

The work: benchmarks/bench_vs_trl.py's (the grpo preset's settings, the same arith-verify prompts
and verifier on both sides), bf16 autocast over float32 master weights on both sides, and a fixed
response length: every response is ``--new-tokens`` long (glassrl: no stop token; TRL:
``min_new_tokens``), so both sides generate and train the same number of tokens.

The runs (fresh subprocesses, one after the other; ``--sides`` picks):
- ``glassrl``: its decoding loop (on CUDA each decoding step a CUDA graph: glassrl.rollout.graphed),
  padded forward passes (``model.shared_prefix=false``);
- ``glassrl-shared-prefix``: the same with the packed shared-prefix layout (``model.shared_prefix=true``,
  off by default on CUDA until measured);
- ``trl``: TRL's generation with transformers' ``generate``;
- ``trl-cb``: TRL's generation with transformers' continuous batching (paged cache,
  ``use_transformers_continuous_batching``; TRL casts the model to bf16 for it). A run that fails
  is reported as failed, with the end of its log, and the others go on.

First, generation alone on the same batch (``model.generate``, glassrl's decoding loop, and its
steps replayed from CUDA graphs): tokens/s, and whether the tokens are the decoding loop's.

Reported per run: steps/s and the median step, generated tokens/s (whole step, and within the
generation phase), the step split by phase (generate, score, logprobs, update; glassrl's
PhaseTimer, TRL's methods timed the same way, synchronised on CUDA), peak GPU memory
(``torch.cuda.max_memory_allocated``), peak RSS, and the device's name; first step left out
(warm-up: graph capture, cuBLAS autotuning). ``--json`` writes every figure to a file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import bench_vs_trl as vs  # benchmarks/, beside this file

HERE = Path(__file__).resolve().parent
QWEN2_05B = {
    "vocab_size": 151_936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
SMOKE = {**QWEN2_05B, "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
SMOKE.update(num_attention_heads=4, num_key_value_heads=2)
SPECIAL = ("<|endoftext|>", "<|pad|>")
RUNS = {  # in this order: the main pair first, so a run cut short by a time limit leaves it
    "glassrl": ("glassrl", ["model.shared_prefix=false"]),
    "trl": ("trl", []),
    "glassrl-shared-prefix": ("glassrl", ["model.shared_prefix=true"]),
    "trl-cb": ("trl", []),
}
HEADER = (
    "| run | steps/s | step s | generated tok/s | tok/s in generation | generate | score | logprobs | update "
    "| peak GPU MiB | peak RSS MiB | response tokens |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def byte_level_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer with exactly ``vocab_size`` ids: the two SPECIAL tokens, the 256
    byte tokens (every text encodes to these: no merges), then filler tokens (strings of two or three
    byte characters) so that every id the model can sample decodes."""
    from itertools import product

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate([*SPECIAL, *alphabet])}
    fillers = ("".join(chars) for n in (2, 3) for chars in product(alphabet, repeat=n))
    while len(vocab) < vocab_size:
        vocab[next(fillers)] = len(vocab)
    if len(vocab) != vocab_size:
        raise ValueError(f"byte_level_tokenizer: {vocab_size} ids asked, {len(vocab)} built")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIAL[0], pad_token=SPECIAL[1])


def build_model(out: Path, config: dict) -> Path:
    """A randomly initialised Qwen2 of ``config`` (seed 0) and its tokenizer in ``out`` (kept while
    the configuration is unchanged)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    marker = out / "bench-gpu.json"
    if marker.is_file() and json.loads(marker.read_text()) == config:
        return out
    tokenizer = byte_level_tokenizer(config["vocab_size"])
    qwen = Qwen2Config(**config, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(qwen).save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker.write_text(json.dumps(config))
    return out


def summary(result: dict, responses: int) -> dict:
    """bench_vs_trl's figures, and the median seconds of each phase over steps 2..N."""
    out = vs.summarise(result, responses)
    phases = result["phases"][1:]
    names = dict.fromkeys(name for step in phases for name in step)
    out["phases"] = {name: statistics.median(step.get(name, 0.0) for step in phases) for name in names}
    generate = out["phases"].get("generate")
    out["generation tokens/s"] = out["generated tokens/s"] / out["steps/s"] / generate if generate else None
    return out


def report(name: str, s: dict) -> None:
    memory = s.get("peak GPU memory (MiB)")
    print(
        f"| {name} | {s['steps/s']:.3f} | {s['step s (median)']:.2f} | {s['generated tokens/s']:,.0f} | "
        f"{s['generation tokens/s'] or float('nan'):,.0f} | "
        + " | ".join(f"{s['phases'].get(p, float('nan')):.2f}" for p in ("generate", "score", "logprobs", "update"))
        + f" | {memory or float('nan'):,.0f} | {s['peak RSS (MiB)']:,.0f} | {s['response tokens (mean)']:.1f} |"
    )


def decoding(model_dir: Path, device: str, new_tokens: int, repeats: int) -> dict:
    """Generation alone, the GRPO runs' batch (16 arith-verify prompts × 8 samples, every response
    ``new_tokens`` long), bf16 autocast on CUDA: ``model.generate``, glassrl's decoding loop, and the
    same steps over the static cache replayed from CUDA graphs (on CPU: run eagerly). Tokens/s of
    each (best of ``repeats`` after a warm-up call: bench_generation.timed), and whether its tokens
    are the decoding loop's (under bf16 a near tie may round the other way)."""
    from bench_generation import generated, timed  # benchmarks/, beside this file
    from glassrl.data.formatting import format_prompt
    from glassrl.data.tasks import load_task
    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.models.precision import compute_precision
    from glassrl.rollout.base import SamplingParams
    from glassrl.rollout.graphed import GraphedDecoder
    from glassrl.rollout.hf import decode, generate_with_hf, left_pad
    from glassrl.rollout.stops import StopSet

    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype="float32", device=device).eval()
    model.generation_config.eos_token_id = None  # generate's fallback stop: none (fixed length)
    prompts = [format_prompt(tokenizer, r.prompt) for r in load_task("arith-verify", "train", size=16)]
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    ids, mask = ids.repeat_interleave(8, 0).to(device), mask.repeat_interleave(8, 0).to(device)  # (B, P)
    params, stops = SamplingParams(max_new_tokens=new_tokens), StopSet(ids=())
    samplers = {
        "model.generate": generate_with_hf,
        "decoding loop": decode,
        "CUDA graphs" if device == "cuda" else "static steps, no capture": GraphedDecoder(capture=device == "cuda"),
    }
    out, reference = {}, None
    with compute_precision(device, torch.bfloat16 if device == "cuda" else torch.float32):
        for name, sample in samplers.items():
            tokens, wall, _ = timed(sample, model, ids, mask, params, stops, tokenizer.pad_token_id, 0, repeats)
            reference = tokens if name == "decoding loop" else reference
            out[name] = {"tokens/s": generated(tokens, stops) / wall, "tokens": tokens}
    print(f"\ngeneration alone, B = {len(ids)}, P = {ids.shape[1]}, {new_tokens} new tokens (best of {repeats}):")
    print("| sampler | tokens/s | × generate | rows with the decoding loop's tokens |\n|---|---:|---:|---:|")
    base = out["model.generate"]["tokens/s"]
    for name, figures in out.items():
        same = int((figures.pop("tokens") == reference).all(-1).sum())
        figures["rows identical"] = same
        print(f"| {name} | {figures['tokens/s']:,.0f} | {figures['tokens/s'] / base:.2f} | {same}/{len(ids)} |")
    del model, samplers  # the graphs' memory and the static cache too
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="a tiny Qwen2 on the CPU, 3 steps (checks the script)")
    p.add_argument("--steps", type=int, help="steps per run, the first left out (default 6; --smoke 3)")
    p.add_argument("--new-tokens", type=int, help="every response's length (default 128; --smoke 8)")
    p.add_argument("--sides", default=",".join(RUNS), help=f"comma-separated runs, of: {', '.join(RUNS)}")
    p.add_argument("--device", help="cuda (default) or cpu (--smoke's default)")
    p.add_argument("--threads", type=int, default=4, help="intra-op threads of every run (default 4)")
    p.add_argument("--out", default=str(Path.home() / ".cache" / "glassrl" / "bench-gpu"), help="work directory")
    p.add_argument("--trl-venv", default=str(Path.home() / ".cache" / "glassrl" / "bench-trl-venv"))
    p.add_argument(
        "--trl-python", help="run TRL's side with this interpreter (trl importable there) instead of --trl-venv"
    )
    p.add_argument("--json", help="write every run's figures here")
    args = p.parse_args()

    names = args.sides.split(",")
    if unknown := [n for n in names if n not in RUNS]:
        p.error(f"--sides: unknown {', '.join(unknown)} (choose from {', '.join(RUNS)})")
    device = args.device or ("cpu" if args.smoke else "cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu: no CUDA device visible (run with --smoke, or on a GPU machine)")
    steps = args.steps or (3 if args.smoke else 6)
    new_tokens = args.new_tokens or (8 if args.smoke else 128)
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    config = SMOKE if args.smoke else QWEN2_05B
    model = build_model(work / ("smoke-model" if args.smoke else "qwen2-0.5b-random"), config)
    prompts = vs.write_prompts(work / "prompts.jsonl")
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"device: {name}; load average at start: {vs.load_average()}; threads: {args.threads}")
    print(f"model: Qwen2 architecture, {vs.parameters(model):,} parameters, random weights ({model})")
    trl_python = None
    if any(RUNS[n][0] == "trl" for n in names):
        trl_python = Path(args.trl_python) if args.trl_python else vs.ensure_trl_venv(Path(args.trl_venv))
    print(
        f"versions: glassrl side {vs.versions(sys.executable)}"
        + (f"; TRL side {vs.versions(trl_python)}" if trl_python else "")
    )
    generation = decoding(model, device, new_tokens, repeats=1 if args.smoke else 2)
    settings = {**vs.SETTINGS, "max_new_tokens": new_tokens}
    responses = settings["prompts_per_step"] * settings["samples"]
    results, failed = {}, {}
    for run_name in names:
        side, overrides = RUNS[run_name]
        spec = {
            "model": str(model),
            "prompts": str(prompts),
            "steps": steps,
            "threads": args.threads,
            "seed": 0,
            "device": device,
            "bf16": device == "cuda",
            "fixed_length": True,
            "trl_continuous_batching": run_name == "trl-cb",
            "glassrl_overrides": overrides,
            "settings": settings,
            "out_dir": str(work / f"{run_name}-run"),
        }
        command = (
            [sys.executable, str(HERE / "bench_vs_trl.py"), "--worker"]
            if side == "glassrl"
            else [trl_python, str(HERE / "trl_worker.py")]
        )
        print(f"{run_name} ...", end="", flush=True)
        try:
            results[run_name] = vs.run(run_name, command, spec, work)
            print(f" done\n{HEADER}", flush=True)
            report(run_name, summary(results[run_name], responses))  # now, in case a time limit ends the rest
        except SystemExit as err:  # the worker failed: say so, go on with the others
            failed[run_name] = str(err)
            print(f" FAILED\n{err}", flush=True)
    summaries = {n: summary(r, responses) for n, r in results.items()}
    ours = [n for n in results if RUNS[n][0] == "glassrl"]
    theirs = [n for n in results if RUNS[n][0] == "trl"]
    same = vs.check_settings(results[ours[0]]["settings"], results[theirs[0]]["settings"]) if ours and theirs else True
    for n in ours:
        print(f"{n}: rollout: {results[n]['rollout path']}")
    print(
        f"\n{name}, {steps} steps per run, the first left out; {responses} responses × {new_tokens} tokens "
        "per step; seconds per step:"
    )
    print(HEADER)
    for n, s in summaries.items():
        report(n, s)
    for n in ours:
        for t in theirs:
            print(f"steps/s {n} / {t}: {summaries[n]['steps/s'] / summaries[t]['steps/s']:.2f}")
    print(f"\nload average at end: {vs.load_average()}")
    if args.json:
        record = {"device": name, "steps": steps, "new_tokens": new_tokens, "generation": generation}
        record.update(summaries=summaries, failed=failed)
        Path(args.json).write_text(json.dumps(record, indent=1, default=str))
    if not same:
        raise SystemExit("the two sides' settings differ (marked above): the figures do not compare the same work")
    if failed and not results:
        raise SystemExit(f"every run failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
