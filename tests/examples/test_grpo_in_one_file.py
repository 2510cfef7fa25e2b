"""examples/grpo_in_one_file.py against glassrl's Trainer: one GRPO step on the same batch.

The trainer runs one step on the tiny model and writes its ledger (prompts, response token ids,
scores, log-probs, advantages); the example then takes that step on the same responses from the
same initial weights. Their samplers draw from different RNG streams, so the responses are fed,
not re-sampled. The settings match the example: token-mean, k3 KL in the loss with the same β,
clip ε, temperature 1, one optimiser step per batch. The reference policy is a perturbed copy
of the actor, so that the KL term is not 0 at the first step.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from glassrl.config import load_config
from glassrl.data.tasks import arith_verify
from glassrl.ledger import read_jsonl
from glassrl.rl.config import TrainConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_in_one_file.py"


@pytest.fixture(scope="module")
def ex():
    spec = importlib.util.spec_from_file_location("grpo_in_one_file", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def perturbed_copy(model_dir: Path, out: Path) -> Path:
    """``model_dir`` with every weight moved by N(0, 0.02²) noise (seeded): a reference ≠ the actor."""
    shutil.copytree(model_dir, out)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    return out


def trainer_config(ex, tiny_model_dir: Path, reference: Path, train: Path, run: Path) -> Path:
    """A GRPO config with the example's settings: 8 prompts × 4 responses, one optimiser step.
    Partial credit and seed 1 make scores differ within groups of unequal lengths, so that
    the policy loss is not 0 at ρ = 1 (token-mean of −Â weighs longer responses more)."""
    text = f"""
seed: 1
steps: 1
output_dir: {run}
model: {{actor: {tiny_model_dir}, reference: {reference}}}
data: {{train: {train}}}
rollout: {{n: 4, temperature: {ex.TEMPERATURE}, max_new_tokens: {ex.MAX_NEW_TOKENS}}}
reward:
  sources: [{{name: arith_verify, weight: 1.0, partial_credit: true}}]
algo:
  advantage: grpo
  policy_loss: ppo_clip
  loss_agg: token-mean
  clip_low: {ex.CLIP_EPS}
  clip_high: {ex.CLIP_EPS}
  kl: {{placement: loss, kind: k3, coef: {ex.BETA}}}
batch: {{prompts_per_step: 8, mini_batch_prompts: 8, micro_batch_responses: 32, epochs: 1}}
actor_optim: {{lr: {ex.LR}, grad_clip: {ex.GRAD_CLIP}}}
logging: {{ledger_every: 1, ledger_samples: 32, report: false}}
"""
    path = run.parent / "grpo.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_one_step_agrees_with_the_trainer(ex, tiny_model_dir, prompt_files, tmp_path):
    from glassrl.rl.loop import Trainer

    reference = perturbed_copy(tiny_model_dir, tmp_path / "reference")
    run = tmp_path / "run"
    Trainer(load_config(TrainConfig, trainer_config(ex, tiny_model_dir, reference, prompt_files[0], run))).train()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    ledger = read_jsonl(run / "ledgers" / "step_000001.jsonl")
    assert len(ledger.responses) == 32

    # The trainer's batch, in the example's layout.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    responses = [[t.token_id for t in r.tokens] for r in ledger.responses]
    assert all(t.response_mask for r in ledger.responses for t in r.tokens)  # no row was filtered out
    batch = ex.pack([tokenizer(r.prompt)["input_ids"] for r in ledger.responses], responses, tokenizer.pad_token_id)
    batch["group_index"] = torch.tensor([r.group_id for r in ledger.responses])
    scores = torch.tensor([r.score for r in ledger.responses])
    assert any(len(set(scores[batch["group_index"] == g].tolist())) > 1 for g in batch["group_index"].unique())
    # The example's reward is the trainer's verifier without partial credit.
    for r, ids in zip(ledger.responses, responses):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        assert ex.reward(text, arith_verify.record_for_prompt(r.prompt)) == float(r.score == 1.0)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ref_model = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval().requires_grad_(False)
    mask = batch["response_mask"]

    def ledger_column(name: str) -> torch.Tensor:
        column = [[getattr(t, name) for t in r.tokens] + [0.0] * (mask.shape[1] - r.length) for r in ledger.responses]
        return torch.tensor(column, dtype=torch.float32)  # (B, T), 0 on padding

    with torch.no_grad():  # phase 3: the same log-probs under π_θ and π_ref
        for m, name in ((model, "logprobs"), (ref_model, "ref_logprobs")):
            lp = torch.where(mask, ex.token_logprobs(m, batch), 0.0)
            torch.testing.assert_close(lp, ledger_column(name), atol=1e-5, rtol=0)

    optimizer = torch.optim.AdamW(model.parameters(), lr=ex.LR, weight_decay=0.0)
    out = ex.grpo_step(model, ref_model, optimizer, batch, scores)
    advantages = torch.where(mask, out["advantages"], 0.0)
    torch.testing.assert_close(advantages, ledger_column("advantages"), atol=1e-5, rtol=0)
    assert metrics["actor/kl_loss"] > 1e-4  # the reference differs: the KL term is really tested
    assert abs(metrics["actor/policy_loss"]) > 1e-3  # so is the policy term
    assert out["policy_loss"] == pytest.approx(metrics["actor/policy_loss"], abs=1e-6)
    assert out["kl_loss"] == pytest.approx(metrics["actor/kl_loss"], abs=1e-6)
    assert out["loss"] == pytest.approx(metrics["actor/policy_loss"] + ex.BETA * metrics["actor/kl_loss"], abs=1e-6)
    assert out["grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-4)


def test_sample_gives_groups_of_responses_ending_at_eos(ex, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    prompts = [r.prompt for r in arith_verify.records("train", 0, 2)]
    batch = ex.sample(model, tokenizer, prompts, group_size=3)
    B, T = batch["response_mask"].shape
    assert B == 6 and T <= ex.MAX_NEW_TOKENS and batch["group_index"].tolist() == [0, 0, 0, 1, 1, 1]
    response_ids = batch["input_ids"][:, -T:]
    for ids, mask, text in zip(response_ids, batch["response_mask"], batch["texts"]):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()  # valid tokens first, then padding
        eos = (ids[:n] == tokenizer.eos_token_id).nonzero().flatten().tolist()
        assert eos in ([], [n - 1])  # at most one EOS: the last valid token
        assert text == tokenizer.decode(ids[:n].tolist(), skip_special_tokens=True)
