"""Shared pieces of the data-parallel and Ray tests: a synthetic actor batch, the actor's
loss as the trainer binds it, and the in-process reference update.

Kept out of the test modules so that spawned ranks and Ray workers can import (or
receive pickled) the same functions.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from glassrl.algos.losses import PolicyLossParams
from glassrl.models.loading import load_causal_lm
from glassrl.models.logprobs import response_logprobs
from glassrl.rl.loss import actor_forward, actor_terms
from glassrl.rl.ptx import PtxTerm
from glassrl.rl.update import run_updates

MICRO = 2  # responses per micro-batch (per rank)
LR = 1e-3


def actor_batch(model_dir: Path, rows: int = 8, P: int = 5, T: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows of random prompts (left-padded) and responses (right-padded, unequal lengths), with
    old log-probs near the model's, random advantages and reference log-probs (keys of
    glassrl.workers.base)."""
    model = load_causal_lm(model_dir, dtype="float32", device="cpu")
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, P + 1, (rows,), generator=g)
    response_len = torch.randint(1, T + 1, (rows,), generator=g)
    response_len[0] = T  # the widest row fixes T
    ids = torch.randint(3, model.config.vocab_size, (rows, P + T), generator=g)
    pos = torch.arange(P + T)
    attention = (pos >= P - prompt_len[:, None]) & (pos < P + response_len[:, None])  # (B, P+T)
    response_mask = attention[:, P:]  # (B, T)
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, ids, attention, T)
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "response_mask": response_mask,
        "old_logprobs": logprobs + 0.05 * torch.randn(rows, T, generator=g),
        "ref_logprobs": logprobs + 0.1 * torch.randn(rows, T, generator=g),
        "advantages": torch.randn(rows, T, generator=g),
        "scores": torch.randn(rows, generator=g),
    }


def plan_for(rows: int, mini_batch: int = 4, epochs: int = 2) -> list[torch.Tensor]:
    """epochs × rows/mini_batch shuffled index tensors (glassrl.rl.update.minibatch_plan)."""
    g = torch.Generator().manual_seed(1)
    return [idx for _ in range(epochs) for idx in torch.randperm(rows, generator=g).split(mini_batch)]


def loss_kwargs() -> dict:
    """The actor update's bound arguments, as the trainer's build binds them (PPO clip + k3 KL + entropy)."""
    terms = actor_terms(
        policy_loss="ppo_clip",
        params=PolicyLossParams(),
        loss_agg="token-mean",
        norm_length=7,
        kl_in_loss="k3",
        kl_coef=0.1,
        entropy_coef=0.01,
        positive_nll_coef=0.0,
    )
    return dict(
        micro_batch=MICRO, grad_clip=1.0, forward=partial(actor_forward, 1.0, True), terms=terms, prefix="actor"
    )


def optimizer_for(model: torch.nn.Module):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, betas=(0.9, 0.95))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, constant_rate)


def constant_rate(step: int) -> float:
    return 1.0


def dp_kwargs(dp, on_nonfinite: str = "stop") -> dict:
    """The update loop's bound arguments on a rank whose replica is ``dp``, as glassrl.rl.build_ray binds them."""
    return {**loss_kwargs(), "on_nonfinite": on_nonfinite, "ranks": dp}


def in_process_update(model_dir: Path, batch, plan) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One process, glassrl.rl.update.run_updates: (updated weights, metrics)."""
    torch.manual_seed(0)
    model = load_causal_lm(model_dir, dtype="float32", device="cpu")
    optimizer, scheduler = optimizer_for(model)
    metrics = run_updates(model, optimizer, scheduler, batch, plan, **loss_kwargs())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


PTX = PtxTerm(coef=0.5, micro_batch=MICRO, pad_id=0)  # PPO-ptx's term, as glassrl.rl.build_ray hands it to a rank


def ptx_pairs(pairs: int = 5, seed: int = 2) -> list[tuple[list[int], list[int]]]:
    """Supervised (prompt ids, response ids) pairs of unequal lengths: 5 pairs in micro-batches of 2 are
    3 passes in one process and, split over 2 ranks, 2 and 1 (FSDP2 pads the shorter rank)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 6, (pairs, 2), generator=g).tolist()
    return [
        (torch.randint(3, 60, (p,), generator=g).tolist(), torch.randint(3, 60, (r,), generator=g).tolist())
        for p, r in lengths
    ]


def on_policy_batch(model_dir: Path) -> dict[str, torch.Tensor]:
    """The shared actor batch without old_logprobs: the on-policy update computes them (forward_outputs)."""
    return {k: v for k, v in actor_batch(model_dir).items() if k != "old_logprobs"}


def in_process_on_policy(model_dir: Path, batch, pairs) -> tuple[dict[str, torch.Tensor], dict[str, float], dict]:
    """One process, one optimiser step on ``batch`` with PPO-ptx on ``pairs``: (weights, metrics, forward outputs)."""
    torch.manual_seed(0)
    model = load_causal_lm(model_dir, dtype="float32", device="cpu")
    optimizer, scheduler = optimizer_for(model)
    outputs: dict[str, torch.Tensor] = {}
    plan = [torch.arange(batch["input_ids"].shape[0])]
    kwargs = {**loss_kwargs(), "ptx": PTX, "ptx_pairs": [pairs], "forward_outputs": outputs}
    metrics = run_updates(model, optimizer, scheduler, batch, plan, **kwargs)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics, outputs


def build_dp_actor(model_dir: str, ctx) -> dict:
    """What a Ray actor rank builds (glassrl.workers.ray_cluster.RoleSpec.build): a data-parallel actor."""
    from glassrl.workers.data_parallel import DataParallelActor, DataParallelModel

    dp = DataParallelModel(load_causal_lm(model_dir, dtype="float32", device="cpu"), ctx)
    optimizer, scheduler = optimizer_for(dp.module)
    actor = DataParallelActor(
        dp,
        None,
        optimizer,
        scheduler,
        micro_batch=MICRO,
        update=partial(run_updates, **dp_kwargs(dp)),
        forward=partial(actor_forward, 1.0, True),
    )
    return {"actor": actor}


def build_rollout_rank(model_dir: str, ctx) -> dict:
    """A rank that samples with the Hugging Face engine from its own RNG (seeded by its rank)."""
    from glassrl.models.loading import load_tokenizer
    from glassrl.rollout.hf import HFRolloutEngine
    from glassrl.workers.local import LocalRollout

    engine = HFRolloutEngine(load_causal_lm(model_dir, dtype="float32", device="cpu"), load_tokenizer(model_dir))
    return {"rollout": LocalRollout(engine, torch.Generator().manual_seed(1 + ctx.rank))}


def build_reward_rank(ctx) -> dict:
    """A rank that scores with the bundled arithmetic verifier."""
    from glassrl.rewards import build_combined
    from glassrl.workers.local import LocalReward

    return {"reward": LocalReward(build_combined([{"name": "arith_verify"}]))}
