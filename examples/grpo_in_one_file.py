"""GRPO in one file: the whole training loop on glassrl's default model, to read before the library.

    python examples/grpo_in_one_file.py --steps 20

The paper: Shao et al. 2024, DeepSeekMath (arXiv:2402.03300), §4.1. For each prompt q, sample G
responses o_1 … o_G from π_old, score them, and maximise (eq. 3, with k3 of eq. 4)

    J(θ) = 1/G Σ_i 1/|o_i| Σ_t [ min(ρ_it·Â_it, clip(ρ_it, 1−ε, 1+ε)·Â_it) − β·k3_it ]
    ρ_it = π_θ(o_it | q, o_i,<t) / π_old(o_it | q, o_i,<t)
    Â_it = (r_i − mean(r_1..r_G)) / std(r_1..r_G)                     (outcome supervision, §4.1.2)
    k3_it = π_ref/π_θ − log(π_ref/π_θ) − 1                              (per token, ≥ 0)

Decisions, and what is simplified from the paper:
- Reward: 1 when the answer has the right verdict and the right sum in the question's language,
  else 0: arith-verify's rule (glassrl.data.tasks.arith_verify.grade). That module, the bundled
  task's prompts and verifier, is the one glassrl import outside glassrl.algos. No reward model.
- Advantage: group-normalised outcome reward, the same Â_i on every token of o_i; std is the
  unbiased one plus ε = 1e-6, so a group whose rewards are all equal gets Â = 0, not 0/0.
- One optimiser step per batch: π_old is π_θ before the step, so ρ = 1 in value and the clip
  never bites; ρ still carries the gradient ∇log π_θ. (With μ > 1 steps per batch it would.)
- Token-mean aggregation: 1/Σ_i|o_i| Σ_i Σ_t instead of eq. 3's 1/G Σ_i 1/|o_i| Σ_t (DAPO, Yu et
  al. 2025, eq. 12): every token weighs the same, so a long wrong answer is not cheaper per token.
  (glassrl's GRPO preset, examples/grpo.yaml, keeps eq. 3's seq-mean-token-mean.)
- KL in the loss, not in the reward, estimated with k3 against a frozen copy of the initial
  weights (the paper's π_ref is the SFT model too; its iterative reference reset is left out).
- Sampling at temperature 1, no top-k, no top-p: the log-probs in the loss are those of the
  distribution the tokens were drawn from. A response is its tokens up to and including the
  first EOS; the rest is padding, masked out of every sum.
- AdamW at a constant learning rate, gradient norm clipped to 1; no evaluation, no checkpoints
  (`glassrl train examples/grpo.yaml` does those).
"""

from __future__ import annotations

import argparse
import copy
import os
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from glassrl.algos.advantages.group import grpo_outcome
from glassrl.algos.aggregation import aggregate
from glassrl.algos.losses import PolicyLossParams, get_policy_loss, kl_loss_term
from glassrl.data.tasks import arith_verify

G = 8  # responses per prompt (the group)
PROMPTS_PER_STEP = 16
MAX_NEW_TOKENS = 16
TEMPERATURE = 1.0
CLIP_EPS = 0.2  # ε of the clipped ratio
BETA = 0.001  # β of the KL term
LR = 1e-4
GRAD_CLIP = 1.0


def default_model_dir() -> Path:
    """Where `glassrl init-model` caches the default model: $GLASSRL_HOME/models/default-v2."""
    home = os.environ.get("GLASSRL_HOME") or Path.home() / ".cache" / "glassrl"
    return Path(home) / "models" / "default-v2"


def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded prompt ⊕ right-padded response per row: input_ids, attention_mask (B, P+T), response_mask (B, T)."""
    P, T = max(map(len, prompts)), max(map(len, responses))
    ids = [[pad_id] * (P - len(p)) + p + r + [pad_id] * (T - len(r)) for p, r in zip(prompts, responses)]
    mask = [[0] * (P - len(p)) + [1] * (len(p) + len(r)) + [0] * (T - len(r)) for p, r in zip(prompts, responses)]
    attention_mask = torch.tensor(mask, dtype=torch.bool)  # (B, P+T)
    return {"input_ids": torch.tensor(ids), "attention_mask": attention_mask, "response_mask": attention_mask[:, P:]}


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], group_size: int = G) -> dict:
    """G responses per prompt (adjacent rows) with model.generate; the batch of ``pack``, plus
    group_index (B,) and the response texts."""
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts for _ in range(group_size)]  # BOS + text
    batch = pack(prompt_ids, [[] for _ in prompt_ids], tokenizer.pad_token_id)
    model.eval()
    out = model.generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"].long(),
        do_sample=True,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        max_new_tokens=MAX_NEW_TOKENS,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    responses = []
    for row in out[:, batch["input_ids"].shape[1] :].tolist():  # cut after the first EOS, keeping it
        end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        responses.append(row[:end])
    batch = pack(prompt_ids, responses, tokenizer.pad_token_id)
    batch["group_index"] = torch.arange(len(prompts)).repeat_interleave(group_size)  # (B,)
    batch["texts"] = [tokenizer.decode(r, skip_special_tokens=True) for r in responses]
    return batch


def reward(text: str, record) -> float:
    """The outcome reward r_i: 1 for the right verdict and sum in the question's language, else 0."""
    grade = arith_verify.grade(text, record.metadata)
    return float(grade.verdict_ok and grade.sum_ok)


def grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Â_i = (r_i − mean of its group) / (std of its group + 1e-6) (B,) (eq. 3's Â, §4.1.2)."""
    return grpo_outcome(rewards, group_index, normalize_by_std=True, eps=1e-6, name="grpo")


def token_logprobs(model, batch: dict) -> torch.Tensor:
    """log π(y_i | s_i) of every response token (B, T), at the sampling temperature."""
    T = batch["response_mask"].shape[1]
    attention_mask = batch["attention_mask"]
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # left padding: the prompt starts at 0
    logits = model(input_ids=batch["input_ids"], attention_mask=attention_mask.long(), position_ids=position_ids).logits
    logits = logits[:, -T - 1 : -1].float() / TEMPERATURE  # (B, T, V): position P−1+i predicts y_i
    targets = batch["input_ids"][:, -T:, None]  # (B, T, 1)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1)  # (B, T)


def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, response_mask) -> tuple[torch.Tensor, dict]:
    """L = token-mean( −min(ρ·Â, clip(ρ, 1−ε, 1+ε)·Â) ) + β·token-mean( k3 ), all (B, T) inputs."""
    params = PolicyLossParams(clip_low=CLIP_EPS, clip_high=CLIP_EPS)
    policy = get_policy_loss("ppo_clip")(logprobs, old_logprobs, advantages, response_mask, params).loss  # (B, T)
    kl = kl_loss_term(logprobs, ref_logprobs, response_mask, kind="k3")  # (B, T)
    policy_loss = aggregate(policy, response_mask, "token-mean")
    kl_loss = aggregate(kl, response_mask, "token-mean")
    return policy_loss + BETA * kl_loss, {"policy_loss": policy_loss.item(), "kl_loss": kl_loss.item()}


def grpo_step(model, ref_model, optimizer, batch: dict, rewards: torch.Tensor) -> dict:
    """Advantages, log-probs, loss, backward, clip, step; returns the numbers of the step."""
    mask = batch["response_mask"]
    advantages = grpo_advantages(rewards, batch["group_index"])[:, None].expand(mask.shape)  # (B, T): Â_i per token
    with torch.no_grad():
        ref_logprobs = token_logprobs(ref_model, batch)
    model.train()
    logprobs = token_logprobs(model, batch)
    old_logprobs = logprobs.detach()  # π_old = π_θ before this, the only, optimiser step on the batch
    loss, parts = grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)  # the norm before clipping
    optimizer.step()
    return {"loss": loss.item(), "grad_norm": grad_norm.item(), "advantages": advantages, **parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--model", type=Path, default=default_model_dir(), help="a causal LM directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"no model at {args.model}: build the default model with `glassrl init-model`")
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)  # π_ref: the initial weights, frozen
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    records = arith_verify.records("train", args.seed, 8000)
    for step in range(1, args.steps + 1):
        prompts = rng.sample(records, PROMPTS_PER_STEP)
        batch = sample(model, tokenizer, [r.prompt for r in prompts])  # 1. generate G responses per prompt
        rewards = torch.tensor(  # 2. score
            [reward(text, prompts[g]) for text, g in zip(batch["texts"], batch["group_index"].tolist())]
        )
        out = grpo_step(model, ref_model, optimizer, batch, rewards)  # 3–6. advantages, log-probs, loss, update
        print(
            f"step {step:3d}  reward {rewards.mean().item():.3f}  loss {out['loss']:+.4f}  "
            f"kl {out['kl_loss']:.5f}  grad_norm {out['grad_norm']:.3f}"
        )


if __name__ == "__main__":
    main()
