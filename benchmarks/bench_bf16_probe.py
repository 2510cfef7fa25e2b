"""The sync probe's margin in bfloat16 (glassrl.rollout.vllm_sync.Tolerance): how much of its tolerance
a clean vLLM sync uses, and how far past it a broken one goes. Runs in .venv-vllm (make test-vllm):

    .venv-vllm/bin/python benchmarks/bench_bf16_probe.py                      # every model below, 10 syncs
    .venv-vllm/bin/python benchmarks/bench_bf16_probe.py --models default --syncs 3

Models: the three bundled trained models (default, research, reasoning-gym) and, with random weights,
Qwen2.5-0.5B's width and vocabulary on 2 layers (``glassrl init-model --arch qwen2.5-0.5b --layers 2
--dtype bfloat16``, built into the temporary directory). Each model in its own process (one vLLM
engine per process), loaded in bfloat16 into the actor and a colocated vLLM engine; ``--syncs``
clean syncs through ``sync_weights`` (its own check must pass: a false alarm raises), the first the
checkpoint's weights, then in-place updates of 0.003, 0.01, 0.02, 0.05, then 0.002 × N(0, 1) on every
parameter. After each, 10 sequences are scored by both sides: the vLLM probe sequence (48 tokens,
VLLM_PROBE_LENGTH: what the check scores), the Ray probe's 2 rows, 3 random, 4 sampled by the engine
(likely tokens), 16 tokens each.
After the second sync, faults in one tensor of layer 0, loaded through vLLM's reload (repacked
tensors: only the probe sees them), each scored the same way, then the clean state back.

Per token t: share = |Δ_t| / (1e-3 + 16 · 2^-8 · s_t), s_t the actor's logit spread (1 = at the
tolerance, > 1 caught). Printed: the clean syncs' largest share (the vLLM probe sequence; all
tokens), and per fault the largest share on the probe sequence (caught when > 1) and over all
tokens; beside them the two candidate scales, max |Δ_t| / (u · s_t) and max |Δ_t| / (u · |log p_t|).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MODELS = {
    "default": "default-v2",
    "research": "default-research-v1",
    "reasoning-gym": "default-rg-v1",
    "qwen2.5-0.5b-2l": None,  # built by glassrl init-model
}
SCALES = [0.0, 0.003, 0.01, 0.02, 0.05]  # the clean updates (× N(0, 1) on every parameter), then 0.002
FAULTS = ("one update behind", "0.5 off", "zeroed", "rows permuted", "q_proj transposed")


def model_path(name: str) -> Path:
    if MODELS[name] is not None:
        from glassrl.builtin.shipped import WEIGHTS

        return WEIGHTS / MODELS[name]
    out = Path(tempfile.gettempdir()) / "glassrl-bench-bf16-qwen2.5-0.5b-2l"
    if not (out / "config.json").is_file():
        command = ["init-model", "--arch", "qwen2.5-0.5b", "--layers", "2", "--dtype", "bfloat16", "--out", str(out)]
        from glassrl.cli import main as glassrl

        glassrl(command)
    return out


def one(name: str, syncs: int) -> dict:
    """Clean syncs and faults on one model (module docstring): per sync the tokens' |Δ|, |log p| and spread."""
    import torch
    import vllm
    from vllm.inputs import TokensPrompt

    from glassrl.models import load_causal_lm, load_tokenizer
    from glassrl.rollout.vllm import VLLMRolloutEngine
    from glassrl.rollout.vllm_sync import actor_probe, engine_probe_logprobs, reload_on_worker
    from glassrl.workers.sync_truth import probe_rows, vocab_size

    path = model_path(name)
    model = load_causal_lm(path, dtype="bfloat16", device="cpu")
    engine = VLLMRolloutEngine.colocated(model, load_tokenizer(path), gpu_memory_utilization=0.4, sleep=True, seed=0)
    vocab = vocab_size(model)
    seqs = [engine.probe, *probe_rows(vocab)]
    g = torch.Generator().manual_seed(123)
    seqs += [torch.randint(0, vocab, (16,), generator=g).tolist() for _ in range(3)]
    for i in range(4):  # sampled continuations: likely tokens (small |log p|)
        params = vllm.SamplingParams(max_tokens=13, min_tokens=13, temperature=1.0, seed=i)
        out = engine.llm.generate([TokensPrompt(prompt_token_ids=seqs[i][:3])], params, use_tqdm=False)[0]
        seqs.append(seqs[i][:3] + list(out.outputs[0].token_ids))

    def scored() -> list[list[float]]:  # per token: |Δ|, |log p|, spread (the probe sequence's first)
        rows = []
        for s in seqs:
            actor = actor_probe(model, s)
            diff = (engine_probe_logprobs(engine.llm, s) - actor[0]).abs()
            rows += torch.stack([diff, actor[0].abs(), actor[1]], 1).tolist()
        return rows

    def load(state: dict) -> None:
        [(not_loaded, _)] = engine.llm.collective_rpc(reload_on_worker, args=(list(state.items()),))
        assert not not_loaded, not_loaded

    record: dict = {"model": name, "vocab": vocab, "probe_tokens": len(seqs[0]) - 1, "clean": [], "faults": {}}
    target = next(n for n, _ in model.named_parameters() if "layers.0." in n and "down_proj" in n)
    query = next(n for n, _ in model.named_parameters() if "layers.0." in n and "q_proj.weight" in n)
    for k in range(syncs):
        torch.manual_seed(k)
        before = {n: t.detach().clone() for n, t in model.state_dict().items()}
        scale = SCALES[k] if k < len(SCALES) else 0.002
        with torch.no_grad():
            for p in model.parameters():
                p.add_(scale * torch.randn_like(p))
        engine.sync_weights()  # the check itself: a false alarm raises here
        record["clean"].append(scored())
        if k == 1:
            state = {n: t.detach() for n, t in model.state_dict().items()}
            w, q = state[target], state[query]
            broken = {
                "one update behind": {target: before[target]},
                "0.5 off": {target: w - 0.5},
                "zeroed": {target: torch.zeros_like(w)},
                "rows permuted": {target: w[torch.randperm(w.shape[0])]},
                "q_proj transposed": {query: q.t().contiguous() if q.shape[0] == q.shape[1] else q.flip(0)},
            }
            for fault, change in broken.items():
                load({**state, **change})
                record["faults"][fault] = scored()
            load(state)
    return record


def summary(record: dict) -> dict:
    """The shares of the tolerance used (module docstring) and the candidate scales."""
    import torch

    from glassrl.rollout.vllm_sync import tolerance

    tol, u = tolerance(torch.bfloat16), 2.0**-8
    n = record["probe_tokens"]

    def shares(rows: list) -> tuple[float, float]:
        t = torch.tensor(rows)
        share = t[:, 0] / tol.bound(t[:, 2])
        return float(share[:n].max()), float(share.max())

    clean = torch.tensor(record["clean"])  # (syncs, tokens, 3)
    diff, logp, spread = clean.unbind(-1)
    return {
        "model": record["model"],
        "vocab": record["vocab"],
        "syncs": len(record["clean"]),
        "clean_max_diff": float(diff.max()),
        "clean_share": max(shares(rows)[0] for rows in record["clean"]),
        "clean_share_all": max(shares(rows)[1] for rows in record["clean"]),
        "per_u_spread": float((diff / (u * spread)).max()),
        "per_u_logp": float((diff / (u * logp.clamp_min(1e-6))).max()),
        "faults": {f: shares(rows) for f, rows in record["faults"].items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--syncs", type=int, default=10)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process: this model only
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(summary(one(args.one, args.syncs))))
        return
    rows = []
    for name in args.models.split(","):
        command = [sys.executable, __file__, "--syncs", str(args.syncs), "--one", name]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"\nvLLM-CPU bf16 against the actor's bf16 forward; load average {os.getloadavg()[0]:.1f}")
    head = ["model (vocabulary)", "clean syncs", "clean max |Δ|", "max |Δ|/(u·|log p|)", "max |Δ|/(u·s)"]
    print("| " + " | ".join(h.replace("|", "\\|") for h in head) + " | clean share: probe (all) |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        cells = [f"{r['model']} ({r['vocab']:,})", str(r["syncs"]), f"{r['clean_max_diff']:.3f}"]
        cells += [f"{r['per_u_logp']:.1f}", f"{r['per_u_spread']:.1f}"]
        print("| " + " | ".join(cells) + f" | {r['clean_share']:.2f} ({r['clean_share_all']:.2f}) |")
    print("\n| fault: share on the probe (all tokens) | " + " | ".join(r["model"] for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for fault in FAULTS:
        cells = [f"{r['faults'][fault][0]:.2f} ({r['faults'][fault][1]:.2f})" for r in rows]
        print(f"| {fault} | " + " | ".join(cells) + " |")
    clean = max(r["clean_share"] for r in rows)
    caught = min(r["faults"][f][0] for r in rows for f in FAULTS[1:])
    behind = max(r["faults"][FAULTS[0]][0] for r in rows)
    print(f"\nclean syncs: the largest share {clean:.2f}; faults 0.5 off, zeroed, permuted, transposed: the smallest")
    print(f"share {caught:.2f} ({'all caught' if caught > 1 else 'NOT all caught'}), margin {caught / clean:.1f}×;")
    print(f"one update behind: the largest share {behind:.2f} ({'caught' if behind > 1 else 'below the tolerance'})")


if __name__ == "__main__":
    main()
