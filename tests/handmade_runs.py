"""Hand-made run directories for the diff tests (tests/diagnose, tests/reliability): a few steps of
metrics, ledgers and checkpoints written directly, with a chosen number changed where asked."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from glassrl.ledger import Ledger, ResponseLedger, TokenRow


def token(i: int, text: str, logprob: float) -> TokenRow:
    return TokenRow(i, 100 + i, text, logprob, None, None, None, None, None, None, 0.5, None, None, True, None)


def ledger(step: int, logprob_at: dict[tuple[int, int], float] | None = None) -> Ledger:
    changed = logprob_at or {}
    texts = ["3", "加", "4", "等于", "7"]
    responses = tuple(
        ResponseLedger(
            prompt="3加4?",
            response="".join(texts),
            score=1.0,
            group_id=r,
            length=len(texts),
            finish_reason="stop",
            baseline_reward=None,
            tokens=tuple(token(i, t, changed.get((r, i), -1.25)) for i, t in enumerate(texts)),
        )
        for r in range(3)
    )
    return Ledger("grpo", 1.0, None, 0.0, None, responses=responses, step=step)


def run(path: Path, steps: int = 3, dtype: str = "float32", change: dict | None = None) -> Path:
    """A run directory of ``steps`` steps; ``change``: {step: {(response, token): logprob}} in the ledger,
    {"metric": (step, key, value)}, {"tensor": (step, value)}."""
    change = change or {}
    path.mkdir()
    (path / "config.yaml").write_text(f"output_dir: {path}\nmodel:\n  compute_dtype: {dtype}\nseed: 0\n")
    rows = [
        {"step": s, "reward/mean": 0.5 * s, "actor/loss": 0.25, "perf/step_s": float(len(str(path)))}
        for s in range(steps + 1)
    ]
    if "metric" in change:
        s, key, value = change["metric"]
        rows[s][key] = value
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "ledgers").mkdir()
    for s in range(1, steps + 1):
        ledger(s, change.get(s)).to_jsonl(path / "ledgers" / f"step_{s:06d}.jsonl")
        ckpt = path / "checkpoints" / f"step_{s:08d}"
        (ckpt / "actor").mkdir(parents=True)
        weight = torch.zeros(2, 3, dtype=torch.bfloat16)
        if change.get("tensor", (None,))[0] == s:
            weight[1, 2] = change["tensor"][1]
        save_file({"w": weight, "b": torch.ones(3)}, ckpt / "actor" / "model.safetensors")
        (ckpt / "counters.json").write_text(json.dumps({"step": s}))
        (ckpt / "manifest.json").write_text(json.dumps({"time": str(path)}))
    return path
