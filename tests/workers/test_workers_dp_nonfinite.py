"""Non-finite checks of the update on data-parallel ranks (glassrl.rl.update.run_updates,
glassrl.workers.data_parallel).

2 ranks (torch.multiprocessing spawn, gloo, CPU, DDP) train on a batch one of whose rows is
poisoned with a NaN; each mini-batch's rows are split over the ranks, so at the 2 optimiser
steps (of 4) whose mini-batch holds that row, the NaN is on one rank only. Two poisons:

- "loss": a loss term whose value is NaN while its gradient is 0 (``actor/probe``, reading a
  batch column): only the rank holding the row sees a non-finite value; the summed gradient is
  finite. A check made on each rank's own values would skip the step there and take it on the
  other rank, and the replicas would part;
- "advantage": a NaN advantage, which makes the policy loss NaN on that rank and, once DDP sums
  the gradients, the gradient NaN on every rank.

Under ``skip`` both ranks must drop the same 2 steps and end with bit-equal weights, equal to one
process that skips the same steps within atol 1e-5, but for at most 0.1 % of the weights, which
must agree to 2.5 % of one step (tests/helpers.adam_weights_close): measured max |Δw| = 2.9e-6 on
one element of 23k (a near-zero gradient, where Adam's g/√v amplifies the other order of
summation; 2.4e-5 on an AVX-512 Xeon, 2026-11-28), 1.2e-7 on every other; a step taken or skipped wrongly moves the
weights by ~2e-3 (lr 1e-3, two steps).
Under ``stop`` both ranks raise the same NonFiniteError, naming the rank that holds the NaN,
before any weight changes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from dp_cases import actor_batch, dp_kwargs, loss_kwargs, optimizer_for, plan_for
from spawned import spawn_ranks

from glassrl.models.loading import load_causal_lm
from glassrl.rl.loss import Term
from glassrl.rl.update import run_updates
from glassrl.workers.sharding import shard_plan
from helpers import adam_weights_close

POISONS = ("loss", "advantage")
POLICIES = ("skip", "stop")


def _response_mask(micro):
    return micro["response_mask"]


def _probe(out, micro):
    return micro["probe"], {}  # (B, T) a constant: a value, no gradient


PROBE = Term("actor/probe", 1.0, "token-mean", None, mask=_response_mask, per_token=_probe)


def poisoned(model_dir: Path, poison: str) -> tuple[dict[str, torch.Tensor], int]:
    """The shared actor batch with ``probe`` (zeros) and a NaN at the first token of one row (of the
    first mini-batch): in ``probe`` for "loss", in ``advantages`` for "advantage"; and that row."""
    batch = actor_batch(model_dir)
    row = int(plan_for(8)[0][0])
    batch["probe"] = torch.zeros(batch["response_mask"].shape)
    batch["probe" if poison == "loss" else "advantages"][row, 0] = float("nan")  # token 0: every row has it
    return batch, row


def _with_probe(kwargs: dict) -> dict:
    return {**kwargs, "terms": [*kwargs["terms"], PROBE]}


def _rank(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    from glassrl.optim import NonFiniteError
    from glassrl.workers.data_parallel import DataParallelModel, init_group

    ctx = init_group("actor", rank, world, "127.0.0.1", port)
    results = {}
    for poison in POISONS:
        batch, _ = poisoned(Path(model_dir), poison)
        local_batch, local_plan = shard_plan(batch, plan_for(8), world)[rank]
        for policy in POLICIES:
            dp = DataParallelModel(load_causal_lm(model_dir, dtype="float32", device="cpu"), ctx)
            optimizer, scheduler = optimizer_for(dp.module)
            kwargs = _with_probe(dp_kwargs(dp, policy))
            try:
                outcome = run_updates(dp.module, optimizer, scheduler, local_batch, local_plan, **kwargs)
            except NonFiniteError as err:
                outcome = str(err)
            weights = {k: v.detach().clone() for k, v in dp.module.state_dict().items()}
            results[poison, policy] = (outcome, weights, scheduler.last_epoch)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _spawn(model_dir: Path, out: Path) -> list[dict]:
    """Both ranks' results (a failure naming where they wait when ranks that decided differently
    wait in mismatched collectives: tests/workers/spawned.py)."""
    from glassrl.workers.data_parallel import free_port

    spawn_ranks(_rank, (2, free_port(), str(model_dir), str(out)), 2, out)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory) -> list[dict]:
    return _spawn(tiny_model_dir, tmp_path_factory.mktemp("dp-nonfinite"))


def _holders(batch: dict[str, torch.Tensor], row: int) -> list[list[int]]:
    """Per optimiser step of plan_for(8), the ranks whose part of the mini-batch holds ``row``."""
    ids = {**batch, "row_id": torch.arange(batch["input_ids"].shape[0])}
    parts = shard_plan(ids, plan_for(8), 2)
    steps = len(plan_for(8))
    return [[r for r, (b, p) in enumerate(parts) if row in b["row_id"][p[k]].tolist()] for k in range(steps)]


def _in_process_skip(model_dir: Path, batch) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    model = load_causal_lm(model_dir, dtype="float32", device="cpu")
    optimizer, scheduler = optimizer_for(model)
    metrics = run_updates(
        model, optimizer, scheduler, batch, plan_for(8), **_with_probe(loss_kwargs()), on_nonfinite="skip"
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("poison", POISONS)
def test_a_nan_on_one_rank_skips_the_same_steps_on_every_rank(poison, tiny_model_dir, two_ranks):
    batch, row = poisoned(tiny_model_dir, poison)
    holders = _holders(batch, row)
    poisoned_steps = [k for k, ranks in enumerate(holders) if ranks]
    assert len(poisoned_steps) == 2 and all(len(holders[k]) == 1 for k in poisoned_steps)  # one rank each time

    (m0, w0, steps0), (m1, w1, steps1) = (rank[poison, "skip"] for rank in two_ranks)
    assert m0["actor/skipped_steps"] == m1["actor/skipped_steps"] == 2
    assert m0 == m1
    assert all(torch.equal(w0[k], w1[k]) for k in w0)  # the replicas never part
    assert steps0 == steps1 == 4  # the schedule advanced over the skipped steps

    weights, metrics = _in_process_skip(tiny_model_dir, batch)
    assert metrics["actor/skipped_steps"] == 2
    initial = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu").state_dict()
    assert _max_diff(weights, initial) > 1e-3  # the 2 steps taken moved the weights
    assert adam_weights_close(w0, weights, tight=1e-5, lr=1e-3) is None
    assert set(m0) == set(metrics)
    for key in ("actor/policy_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm", "actor/lr"):
        assert m0[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("poison", POISONS)
def test_stop_names_the_rank_on_every_rank_before_any_weight_changes(poison, tiny_model_dir, two_ranks):
    batch, row = poisoned(tiny_model_dir, poison)
    (holder,) = _holders(batch, row)[0]  # the first optimiser step holds the row
    tensors = "actor/probe = nan" if poison == "loss" else "actor/policy_loss = nan, actor/grad_norm = nan"
    expected = (
        rf"^actor update on rank {holder} of 2, optimiser step 1 of 4: {tensors}; "
        r"the weights were not changed \(on_nonfinite=stop; on_nonfinite=skip drops such steps instead\)$"
    )
    messages = [rank[poison, "stop"][0] for rank in two_ranks]
    assert messages[0] == messages[1]
    assert isinstance(messages[0], str), messages[0]
    assert re.match(expected, messages[0]), messages[0]
    initial = load_causal_lm(tiny_model_dir, dtype="float32", device="cpu").state_dict()
    for rank in two_ranks:
        weights = rank[poison, "stop"][1]
        assert all(torch.equal(weights[k], initial[k]) for k in initial)
