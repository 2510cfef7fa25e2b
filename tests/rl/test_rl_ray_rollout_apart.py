"""``ray.rollout.placement: apart`` end to end on a local Ray cluster (2 CPUs): sampling on ranks of
its own, each with a copy of π_θ that actor rank 0 updates by broadcast after every actor update
and every load (glassrl.workers.weight_sync, glassrl.workers.ray.RayWeightSync).

Same samples: rollout rank r samples from the seed actor rank r would (``seed + 1 + r``) with
weights equal to the actor's bit for bit, so the apart run with k rollout ranks samples what the
with_actor run with ``ray.rollout_ranks: k`` samples; with the same actor ranks both train on the
same numbers. Tolerance: none, every logged number and ledger value is compared with ==, and the
saved weights with torch.equal (the samples are the same tokens; the rest is the same
computation on the same ranks).

The test can fail: with the sync switched off after the first one, step 1 samples the same
responses and step 2 others (the rollout ranks still hold the step-0 weights; the learning rate
is raised so that one step moves the samples). A resume restores the actor, then syncs, so a
resumed run logs the same numbers, bit for bit, as one that never stopped.

FSDP2 (``ray.fsdp``, fully_shard runs on CPU under gloo): the actor ranks gather each parameter
for the sync. Against DDP replicas on the same 2 ranks: the same samples at steps 1 and 2, and
every logged number within relative or absolute 1e-5 (reduce-scatter and all-reduce sum the
gradients in another order: the weights differ in the last bits after a step).

Slow: one Ray cluster for the module; each Trainer starts its worker processes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.ledger import read_jsonl
from glassrl.models import load_causal_lm
from glassrl.rl.config import TrainConfig
from run_helpers import KillAt, Killed, logged_metrics, metric_rows

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LEDGER_FIELDS = ("logprobs", "ref_logprobs", "kl", "token_rewards", "advantages", "returns")


def _trainer(overrides: list[str], **kwargs):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / "grpo.yaml", overrides), progress=False, **kwargs)


def _common(fast: list[str], actor_ranks: int = 1) -> list[str]:
    return [
        *fast,
        "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]",
        "logging.report=false",
        "actor_optim.lr=0.01",  # one step changes what is sampled next
        "actor_optim.warmup_steps=0",
        "trainer.backend=ray",
        f"ray.actor.world_size={actor_ranks}",
        "ray.actor.resources={CPU: 0.25}",
        "ray.reference.resources={CPU: 0.25}",
    ]


def _apart(rollout_ranks: int) -> list[str]:
    return [
        "ray.rollout.placement=apart",
        f"ray.rollout.world_size={rollout_ranks}",
        "ray.rollout.resources={CPU: 0.25}",
    ]


def _responses(run: Path, step: int) -> list[str]:
    return [r.response for r in read_jsonl(run / "ledgers" / f"step_{step:06d}.jsonl").responses]


def _assert_same_ledgers(one: Path, two: Path, step: int) -> None:
    a, b = (read_jsonl(run / "ledgers" / f"step_{step:06d}.jsonl") for run in (one, two))
    assert [r.response for r in a.responses] == [r.response for r in b.responses], step
    for r1, r2 in zip(a.responses, b.responses):
        for t1, t2 in zip(r1.tokens, r2.tokens):
            assert [getattr(t1, f) for f in LEDGER_FIELDS] == [getattr(t2, f) for f in LEDGER_FIELDS], step


def _assert_same_weights(one: Path, two: Path, step: int) -> None:
    name = f"step_{step:08d}"
    a, b = (load_causal_lm(run / "checkpoints" / name / "actor", dtype="float32", device="cpu") for run in (one, two))
    wa, wb = a.state_dict(), b.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_apart_samples_and_trains_as_with_actor(local_ray, fast, tmp_path):
    steps = ["steps=2", "logging.checkpoint_every=2"]
    runs = {name: tmp_path / name for name in ("with_actor", "apart", "unsynced")}
    _trainer([*_common(fast), *steps, f"output_dir={runs['with_actor']}"]).train()
    apart = _trainer([*_common(fast), *_apart(1), *steps, f"output_dir={runs['apart']}"])
    assert apart.workers.rollout.group.role == "rollout" and apart.workers.actor.weight_sync is not None
    apart.train()

    # every number but perf/ and the sync truth check's (the apart run alone syncs: each sync proven)
    apart_rows = metric_rows(runs["apart"])
    assert all(r["sync/checks"] == 1 and r["sync/breaches"] == 0 for r in apart_rows if r["step"] > 0)
    assert logged_metrics(runs["with_actor"]) == logged_metrics(runs["apart"])
    for step in (1, 2):
        _assert_same_ledgers(runs["with_actor"], runs["apart"], step)
    _assert_same_weights(runs["with_actor"], runs["apart"], 2)
    rows = [json.loads(line) for line in (runs["apart"] / "metrics.jsonl").read_text().splitlines()]
    assert all(row["perf/weight_sync_s"] > 0 for row in rows if row["step"] > 0)  # one sync per actor update

    unsynced = _trainer([*_common(fast), *_apart(1), *steps, f"output_dir={runs['unsynced']}"])
    unsynced.workers.actor.weight_sync = None  # after the first sync: the copies keep the step-0 weights
    unsynced.train()
    assert _responses(runs["unsynced"], 1) == _responses(runs["apart"], 1)
    assert _responses(runs["unsynced"], 2) != _responses(runs["apart"], 2)


def test_a_rollout_rank_that_drops_the_weights_is_caught_at_the_first_update(local_ray, fast, tmp_path):
    """A fault injected into the rollout rank (its load_weights replaced by ``len``: every bucket arrives and
    none is loaded, as a sleep mode that dropped them): the sync after step 1's update is refused, naming
    the rank, the version and the first tensor; the run stops there (exit 2 from the command line)."""
    from glassrl.diagnose.sync_check import SyncBreach

    trainer = _trainer([*_common(fast), *_apart(1), "steps=3", f"output_dir={tmp_path / 'run'}"])
    trainer.workers.rollout.group.call_all("weights", "__setattr__", "load_weights", len)
    with pytest.raises(SyncBreach, match=r"^sync truth check at step 1: rollout rank 0, weights of version 1: "):
        trainer.train()
    rows = metric_rows(tmp_path / "run")
    assert rows[-1]["step"] == 1 and rows[-1]["sync/breaches"] == 1


def test_resume_with_two_rollout_ranks_is_exact(local_ray, fast, tmp_path):
    common = [*_common(fast), *_apart(2), "steps=3", "logging.checkpoint_every=1"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _trainer([*common, f"output_dir={straight}"]).train()

    victim = _trainer([*common, f"output_dir={resumed}"])
    assert victim.workers.rollout.group.world_size == 2
    victim.sinks.sinks.append(KillAt(2))  # after step 2 is logged, before its checkpoint
    with pytest.raises(Killed):
        victim.train()
    again = _trainer([*common, f"output_dir={resumed}"], resume=True)
    assert again.counters.step == 1
    again.train()

    assert logged_metrics(straight) == logged_metrics(resumed)
    for step in (2, 3):  # sampled after the resume: by copies synced from the restored actor
        _assert_same_ledgers(straight, resumed, step)
    _assert_same_weights(straight, resumed, 3)


def test_fsdp_actor_samples_through_the_sync(local_ray, fast, tmp_path):
    common = [*_common(fast, actor_ranks=2), *_apart(1), "steps=2"]
    fsdp, ddp = tmp_path / "fsdp", tmp_path / "ddp"
    _trainer([*common, "ray.fsdp=true", f"output_dir={fsdp}"]).train()
    _trainer([*common, f"output_dir={ddp}"]).train()

    for step in (1, 2):
        assert _responses(fsdp, step) == _responses(ddp, step)
    one, two = logged_metrics(fsdp), logged_metrics(ddp)
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        far = {k: (a[k], b[k]) for k in a if not math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-5)}
        assert not far, (a["step"], far)
