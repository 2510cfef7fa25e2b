"""Actor and critic updates: epochs × mini-batches × micro-batches, accumulation, clipping.

Shapes: B responses of the step, T response width. A batch is a dict of tensors
whose first dimension is B (keys in glassrl.workers.base).

One optimiser step per mini-batch (PPO's K epochs over shuffled minibatches:
Schulman et al. 2017, Algorithm 1). A mini-batch runs as micro-batches whose
gradients accumulate. The loss is a sum of weighted :class:`Term`\\ s, each a
per-token quantity aggregated by a named mode (DESIGN §3). Accumulation is exact:
micro-batch k's aggregate is weighted by its share of the mini-batch's units
(valid tokens for "token-mean", non-empty rows for the sequence modes), so the
accumulated gradient equals that of the whole mini-batch in one pass, whatever
the micro-batch size (a fixed 1/accum weight, as in early verl, is only right
when every micro-batch has the same number of tokens).

Terms are selected by config values (a coefficient > 0, a KL placement), never
by algorithm name: :func:`actor_terms` and :func:`critic_terms`.

:func:`run_updates` is the one update loop, in one process and on each rank of a data-parallel
group alike: what differs is its ``ranks`` (glassrl.rl.ranks.Ranks), the collectives it calls at fixed
points (the units of a mini-batch summed over the ranks, the gradient reduced in the last pass,
each step's values summed before the non-finite check), the identity in one process
(glassrl.rl.ranks.OneProcess) and torch.distributed's on a rank (glassrl.workers.data_parallel).

One update, followed from the trainer: Trainer.step (glassrl.rl.loop) runs phase 6 in
Trainer._update, which builds the plan (:func:`minibatch_plan`) and calls
``workers.critic.update(critic_batch(exp), plan)``, then ``workers.actor.update(actor_batch(exp),
plan)`` (or ``update_on_policy``, which also returns phase 3's log-probs and entropy). In one
process that is glassrl.workers.local.LocalActor, which calls the :class:`RoleUpdate` glassrl.rl.build
made for it (:func:`run_updates` with the config's loss: glassrl.rl.build.role_update); on Ray,
glassrl.workers.ray.RayActor splits the batch and plan over the ranks and each rank's
glassrl.workers.data_parallel.DataParallelActor calls the same function, bound by
glassrl.rl.build_ray with its ranks. Here, per mini-batch: the micro-batches' forward and backward
passes, PPO-ptx's term, the clipped gradient norm, the non-finite check, ``optimizer.step()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from glassrl.algos.aggregation import aggregate
from glassrl.algos.masked import masked_sum
from glassrl.models.micro_batches import micro_batches, row_tokens, trim_left
from glassrl.models.shared_prefix import prompt_order
from glassrl.optim import guarded_step
from glassrl.rl.experience import Experience
from glassrl.rl.loss import DIAGNOSTIC_METRICS, Forward, Term
from glassrl.rl.phases import model_batch
from glassrl.rl.ptx import PtxTerm
from glassrl.rl.ranks import Batch, OneProcess, Ranks
from glassrl.supervised.sft import Example


def actor_batch(exp: Experience) -> Batch:
    """What the actor's update reads (keys in glassrl.workers.base). "scores" marks VAPO's
    positive examples: correct answers, judged before any shaping."""
    batch = {**model_batch(exp), "advantages": exp.policy_advantages, "scores": exp.raw_scores}
    if exp.bypass:  # a stale batch without a correction: the clip anchors at μ, the policy that sampled
        batch["old_logprobs"] = exp.rollout.rollout_logprobs
    elif exp.logprobs is not None:  # None: the on-policy update computes them (run_updates' forward_outputs)
        batch["old_logprobs"] = exp.logprobs
    if exp.ref_logprobs is not None:
        batch["ref_logprobs"] = exp.ref_logprobs
    if exp.correction is not None:  # algo.off_policy: each token's weight, and whether it stays in the loss
        batch["is_weights"], batch["is_keep"] = exp.correction.weights, exp.correction.keep
    return batch


def critic_batch(exp: Experience) -> Batch:
    """What the critic's update reads: the values at rollout and the returns R_i, its target."""
    return {**model_batch(exp), "old_values": exp.values, "returns": exp.returns}


def minibatch_plan(rows: int, mini_batch: int, epochs: int, generator: torch.Generator) -> list[torch.Tensor]:
    """epochs × rows/mini_batch index tensors: each epoch a fresh permutation of range(rows), cut in order."""
    plan = []
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator)
        plan.extend(order.split(mini_batch))
    return plan


def select(batch: Batch, index: torch.Tensor) -> Batch:
    """The rows ``index`` of every tensor of ``batch``."""
    return {key: value[index.to(value.device)] for key, value in batch.items()}


def _units(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """What ``mode`` averages over: valid tokens (token-mean) or non-empty rows (sequence modes)."""
    return mask.sum() if mode == "token-mean" else mask.any(-1).sum()


class _Stats:
    """Running sums and counts of metrics over one update, on the device until ``means`` (one sync)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}

    def add(self, key: str, total: torch.Tensor, count: torch.Tensor) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + total.detach().double()
        self.counts[key] = self.counts.get(key, 0) + count

    def means(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """Sum / count per key, sums and counts first summed over the ranks by ``reduce`` when given;
        a key whose count stayed 0 (no valid token) is left out."""
        keys = list(self.sums)
        if not keys:  # every optimiser step skipped as non-finite (on every rank alike)
            return {}
        sums = torch.stack([torch.as_tensor(self.sums[k]).cpu() for k in keys])  # (K,) float64
        counts = torch.stack([torch.as_tensor(self.counts[k]).cpu() for k in keys])  # (K,)
        if reduce is not None:
            sums, counts = reduce(torch.stack([sums, counts.to(sums.dtype)])).unbind()
        return {k: total / count for k, total, count in zip(keys, sums.tolist(), counts.tolist()) if count > 0}


def run_updates(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: Batch,
    plan: list[torch.Tensor],
    *,
    micro_batch: int,
    grad_clip: float | None,
    forward: Callable[[torch.nn.Module, Batch], Forward],
    terms: list[Term],
    prefix: str,
    ptx: PtxTerm | None = None,
    on_nonfinite: str = "stop",
    forward_outputs: Forward | None = None,
    shared_prefix: bool = False,
    ranks: Ranks | None = None,
    ptx_pairs: list[list[Example]] | None = None,
    max_tokens: int | None = None,
    packed: bool = False,
) -> dict[str, float]:
    """One optimiser step per index tensor of ``plan``; returns metrics averaged over them.

    Micro-batches: ``micro_batch`` rows each, or with ``max_tokens`` (batch.max_tokens_per_micro_batch)
    as many rows (at most ``micro_batch``) as keep their real tokens within the budget, longest first
    (glassrl.models.micro_batches); the gradient is the mini-batch's either way (the shares above).
    ``{prefix}/padding_share``: padded positions / all positions of the update's forward passes (rows ×
    width each on the padded layout; 0 with ``packed``, model.padding_free or model.shared_prefix, whose
    forward sees real tokens only), over the optimiser steps taken.

    Metrics: each term's value (its mini-batch aggregate) averaged over optimiser
    steps; each diagnostic's masked mean per micro-batch, averaged over the
    micro-batches that have valid tokens; ``{prefix}/grad_norm`` (global norm before
    clipping, Pascanu et al. 2013) averaged over optimiser steps; ``{prefix}/lr``
    after the last step. With ``ptx`` each optimiser step also takes γ × the SFT loss of a
    supervised batch (PPO-ptx, Ouyang et al. 2022, eq. 2); ``{prefix}/ptx_loss`` averages it.
    The pairs of step k are ``ptx_pairs[k]`` (this rank's part of the batch the driver drew:
    glassrl.workers.ray.RayActor), or, without ``ptx_pairs``, the next batch of ``ptx``'s stream
    (a glassrl.rl.ptx.PtxLoss).

    ``ranks`` (None: glassrl.rl.ranks.OneProcess): this process is one rank of a data-parallel group
    (glassrl.workers.data_parallel.DataParallelModel), ``model`` its replica or shard, and
    ``batch`` and ``plan`` its part of the driver's (glassrl.workers.sharding.shard_plan). What must
    be global is: each micro-batch's weight is its share of the units of the *whole* mini-batch
    (summed over the ranks), so the gradients DDP / FSDP2 average, × W, sum to the one of the
    whole mini-batch; the values checked and logged are summed over the ranks; every rank
    returns the same metrics.

    Before each optimiser step its loss terms and gradient norm are checked, after it the
    weights (glassrl.optim), on the values of every rank: a non-finite one raises NonFiniteError
    naming it (and the ranks whose own share is not finite), or with ``on_nonfinite="skip"`` the
    step is dropped and counted in ``{prefix}/skipped_steps`` (present when > 0); a dropped step
    adds nothing to the other metrics. Every rank decides alike, so none waits alone in a collective.

    ``forward_outputs`` (a dict to fill) asks for the on-policy update of a batch without
    ``old_logprobs``, which takes exactly one optimiser step (Trainer.step): every forward pass
    runs before that step, with the weights that sampled, so π_old = π_θ and log π_old is each
    micro-batch's own log π_θ, detached; the ratio is 1 by construction. The forward's outputs
    ("logprobs", "entropy"), detached, fill ``forward_outputs``, (B, T) in the batch's row order:
    what phase 3 would have computed, without a pass of its own. A batch that brings its
    ``old_logprobs`` keeps them as the clip's anchor (a stale batch's log μ, the policy that sampled
    it: glassrl.rl.phases.off_policy), the ratio then π_θ/μ; the forward's outputs fill
    ``forward_outputs`` all the same (log π_old with the current weights).

    ``shared_prefix`` (model.shared_prefix): each mini-batch's rows are grouped by prompt before
    they are cut into micro-batches, so a micro-batch shares its prompts (glassrl.models.shared_prefix),
    in the order of the whole batch grouped by prompt (that of the log-prob passes).
    The mini-batch's gradient is a sum over its rows, whatever the cut, so the step is the same; only
    the diagnostics, means per micro-batch, may differ when micro_batch < the mini-batch.
    """
    ranks = OneProcess(model) if ranks is None else ranks
    on_policy = forward_outputs is not None
    anchor = None  # on-policy: a stale batch's log μ, set aside so that the forward computes H too
    if on_policy and "old_logprobs" in batch:
        batch = dict(batch)
        anchor = batch.pop("old_logprobs")
    if on_policy and len(plan) != 1:
        raise ValueError(f"run_updates: a batch without old_logprobs takes one optimiser step, not {len(plan)}")
    kept: list[tuple[torch.Tensor, Forward]] = []  # on-policy: (rows, forward outputs) per micro-batch
    stats = _Stats()  # per optimiser step taken, the step's values over all ranks
    diagnostics = _Stats()  # per micro-batch of this rank, summed over the ranks at the end
    model.train()
    skipped = 0
    if shared_prefix:
        # Each row's place in the batch grouped by prompt, as the log-prob passes group it (glassrl.workers.local):
        # a mini-batch of the whole batch is then cut into the very micro-batches (and layouts) of those passes,
        # so at π_θ = π_ref the KL's gradient is exactly 0, as on the padded path, not rounding noise.
        grouped = prompt_order(batch["input_ids"], batch["attention_mask"], batch["response_mask"].shape[1])  # (B,)
        place = torch.empty_like(grouped)
        place[grouped] = torch.arange(len(grouped), device=grouped.device)
    tokens = row_tokens(batch["attention_mask"])  # (B,) real tokens per row, for the token budget
    for k, index in enumerate(plan):
        if shared_prefix:
            index = index[place[index.to(place.device)].argsort().to(index.device)]  # mini-batch rows in that order
        parts = micro_batches(index, tokens, rows=micro_batch, max_tokens=max_tokens, keep_order=shared_prefix)
        micros = [select(batch, part) for part in parts]
        if max_tokens is not None:  # sorted by length: the prompt padding a micro-batch's rows share goes
            micros = [trim_left(micro) for micro in micros]
        units = torch.stack([sum(_units(t.mask(m), t.mode) for m in micros) for t in terms])  # (terms,) this rank's
        totals = dict(zip([t.name for t in terms], ranks.sum(units).clamp(min=1)))  # of the whole mini-batch
        values = {t.name: torch.zeros((), device=batch["response_mask"].device) for t in terms}
        diagnostics_of_step = []  # (key, total, count), added to the metrics only when the step is taken
        pairs = None if ptx is None else ptx.take() if ptx_pairs is None else ptx_pairs[k]  # PPO-ptx's
        optimizer.zero_grad(set_to_none=True)
        passes = ranks.passes(len(micros))
        for j in range(passes):
            real = j < len(micros)  # FSDP2: a rank with fewer micro-batches runs its last again, weighted 0
            part, micro = parts[min(j, len(parts) - 1)], micros[min(j, len(micros) - 1)]
            if real:  # the positions this forward computes, and how many of them are padding
                real_tokens = micro["attention_mask"].sum()
                positions = real_tokens if packed else torch.tensor(micro["attention_mask"].numel())
                diagnostics_of_step.append((f"{prefix}/padding_share", positions - real_tokens, positions))
            with ranks.gradient_sync(j == passes - 1 and pairs is None):  # reduced over the ranks once, last
                out = ranks.forward(forward, micro)
                if on_policy and real:  # π_old = π_θ before the one optimiser step: log π_old is this forward's
                    micro["old_logprobs"] = (
                        out["logprobs"].detach() if anchor is None else anchor[part.to(anchor.device)]
                    )
                    kept.append((part, {key: value.detach() for key, value in out.items()}))
                # The loss, each term aggregated by its own mode and weighted by its share of the
                # mini-batch's units (so the accumulated gradient is the mini-batch's):
                #     actor:  L = L_π + β·KL − c·H + μ·NLL   (actor_terms; a term whose coefficient is 0 is absent)
                #     critic: L = L_V                        (critic_terms)
                # and, once per actor optimiser step below, + γ·L_ptx (PPO-ptx).
                loss = torch.zeros((), device=micro["response_mask"].device)
                for term in terms:
                    mask = term.mask(micro)
                    per_token, diags = term.per_token(out, micro)
                    share = _units(mask, term.mode) / totals[term.name]
                    value = share * aggregate(per_token, mask, term.mode, term.norm_length)
                    loss = loss + term.coef * value
                    if not real:
                        continue
                    values[term.name] = values[term.name] + value.detach()
                    tokens = mask.sum()
                    for key, diag in diags.items():
                        if key in DIAGNOSTIC_METRICS:  # a micro-batch without valid tokens counts 0 times
                            micro_mean = masked_sum(diag.double(), mask) / tokens.clamp(min=1)
                            diagnostics_of_step.append(
                                (f"{prefix}/{DIAGNOSTIC_METRICS[key]}", micro_mean, (tokens > 0).long())
                            )
                # DDP and FSDP2 average the ranks' gradients: × W makes that the sum of their shares.
                (loss * (ranks.world_size if real else 0)).backward()
        device = batch["response_mask"].device
        ptx_loss = ptx.backward(pairs, ranks, device) if pairs is not None else None
        # The terms (and ptx) summed over the ranks; the norm is of the summed gradient already.
        step = guarded_step(
            model,
            optimizer,
            scheduler,
            values,
            max_norm=grad_clip,
            norm_key=f"{prefix}/grad_norm",
            policy=on_nonfinite,
            where=lambda on, k=k: f"{prefix} update{on}, optimiser step {k + 1} of {len(plan)}",
            also=None if ptx_loss is None else {f"{prefix}/ptx_loss": ptx_loss},
            combine=ranks.combine,
            reduce=ranks.sum,
        )
        if not step.taken:
            skipped += 1
            continue
        checked = step.values
        for diagnostic in diagnostics_of_step:
            diagnostics.add(*diagnostic)
        one = torch.ones((), dtype=torch.long, device=device)
        if ptx_loss is not None:
            stats.add(f"{prefix}/ptx_loss", checked[f"{prefix}/ptx_loss"], one.cpu())
        for name in values:  # the mini-batch's aggregate, once per optimiser step
            stats.add(name, checked[name], one)
        stats.add(f"{prefix}/grad_norm", checked[f"{prefix}/grad_norm"], one)
    if on_policy:
        rows = torch.cat([part for part, _ in kept]).to(batch["response_mask"].device)  # a permutation of 0..B−1
        for key in kept[0][1]:
            stacked = torch.cat([out[key] for _, out in kept])  # (B, T) in plan order
            forward_outputs[key] = torch.empty_like(stacked).index_copy(0, rows, stacked)  # (B, T) in row order
    metrics = {**diagnostics.means(ranks.sum), **stats.means()}
    metrics[f"{prefix}/lr"] = scheduler.get_last_lr()[0]
    if skipped:
        metrics[f"{prefix}/skipped_steps"] = skipped
    return metrics


@dataclass(frozen=True)
class RoleUpdate:
    """One role's update: :func:`run_updates` with the settings the build chose for it
    (glassrl.rl.build.role_update: the config's loss terms, micro-batch, clipping, forward layout,
    PPO-ptx term and non-finite policy; ``ranks`` a Ray rank's data-parallel group, None in one
    process). What a worker calls to update (glassrl.workers.local.LocalActor and LocalCritic,
    glassrl.workers.data_parallel.DataParallelActor and DataParallelCritic)."""

    prefix: str  # "actor" or "critic": the metrics' namespace
    forward: Callable[[torch.nn.Module, Batch], Forward]
    terms: list[Term]
    micro_batch: int
    grad_clip: float | None
    on_nonfinite: str = "stop"
    shared_prefix: bool = False
    ptx: PtxTerm | None = None
    ranks: Ranks | None = None
    max_tokens: int | None = None  # batch.max_tokens_per_micro_batch
    packed: bool = False  # the forward sees real tokens only (model.padding_free or model.shared_prefix)

    def __call__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        batch: Batch,
        plan: list[torch.Tensor],
        *,
        forward_outputs: Forward | None = None,
        ptx_pairs: list[list[Example]] | None = None,
    ) -> dict[str, float]:
        return run_updates(
            model,
            optimizer,
            scheduler,
            batch,
            plan,
            micro_batch=self.micro_batch,
            grad_clip=self.grad_clip,
            forward=self.forward,
            terms=self.terms,
            prefix=self.prefix,
            ptx=self.ptx,
            on_nonfinite=self.on_nonfinite,
            forward_outputs=forward_outputs,
            shared_prefix=self.shared_prefix,
            ranks=self.ranks,
            max_tokens=self.max_tokens,
            packed=self.packed,
            ptx_pairs=ptx_pairs,
        )
