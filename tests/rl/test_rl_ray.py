"""``trainer.backend: ray`` end to end on a local Ray cluster (2 CPUs), against the in-process backend.

Same data: ``ray.rollout_ranks=1`` makes actor rank 0 sample every prompt from the seed the
in-process rollout uses, so both backends score, train on and log the same responses. Cases: GRPO;
PPO; GRPO with one optimiser step per step (the on-policy update, whose forward gives log π_old:
each rank its rows) and PPO-ptx (the driver's supervised pairs split over the ranks); PPO with
model.shared_prefix (every pass in the shared layout, on the ranks as in process). The ranks run
the in-process update loop (glassrl.rl.update.run_updates) with their collectives.

Tolerance, Ray (2 DDP ranks) against one process, float32 on CPU:
- advantages, returns, values, log-probs, KL (metrics and ledger rows), losses and gradient
  norms: relative 1e-5 or absolute 1e-5 (DDP sums the two ranks' gradients in another order,
  so the step-2 weights differ by ~6e-8 and the step-2 log-probs by ~1e-6; a per-token KL of
  0.011, a difference of two log-probs, then differs by 1.4e-6);
- saved weights after 2 steps of AdamW: absolute 1e-6 (measured: 6e-8); with model.shared_prefix
  1e-5, the tolerance of tests/rl/test_rl_shared_prefix.py (a rank's micro-batches put other rows
  into one layout than one process's: measured 1.7e-6 on the critic, 5e-8 on the actor);
- not compared: the micro-batch-averaged diagnostics (``DIAGNOSTIC_DEPENDENT``): each is a mean
  of per-micro-batch means, and a rank's micro-batches hold other rows than the in-process
  ones, so the average itself differs (by up to 0.02 on ``critic/vf_clip_frac`` here).

Exact resume: a run whose actor rank is killed ends with an error naming the role and the
rank; ``--resume`` then continues from the last checkpoint and logs the same numbers, bit for
bit, as a run that never stopped (same seed, same world sizes, every rank sampling).

Slow: one Ray cluster per module (started by the fixture, shared by the tests); each
Trainer starts its worker processes (tens of seconds on 2 shared cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.ledger import read_jsonl
from glassrl.models import load_causal_lm, load_scalar_model
from glassrl.rl.config import TrainConfig
from glassrl.run.checkpoint import CheckpointManager
from run_helpers import assert_metrics_close, close_enough, logged_metrics

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHARED_PREFIX_WEIGHTS = 1e-5  # saved weights with model.shared_prefix (module docstring)
VARIED_REWARD = "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]"


def _trainer(preset: str, overrides: list[str], **kwargs):
    from glassrl.rl.loop import Trainer

    return Trainer(load_config(TrainConfig, EXAMPLES / f"{preset}.yaml", overrides), progress=False, **kwargs)


def _ray(actor: int, critic: int = 1, cpus: float = 0.25) -> list[str]:
    return [
        "trainer.backend=ray",
        f"ray.actor.world_size={actor}",
        f"ray.critic.world_size={critic}",
        f"ray.actor.resources={{CPU: {cpus}}}",
        f"ray.critic.resources={{CPU: {cpus}}}",
        f"ray.reference.resources={{CPU: {cpus}}}",
    ]


def _assert_same_ledgers(local: Path, remote: Path, step: int) -> None:
    one, two = (read_jsonl(run / "ledgers" / f"step_{step:06d}.jsonl") for run in (local, remote))
    assert [r.response for r in one.responses] == [r.response for r in two.responses]  # the same samples
    fields = ("logprobs", "ref_logprobs", "kl", "token_rewards", "values", "deltas", "advantages", "returns")
    for r1, r2 in zip(one.responses, two.responses):
        for t1, t2 in zip(r1.tokens, r2.tokens):
            for name in fields:
                v1, v2 = getattr(t1, name), getattr(t2, name)
                assert (v1 is None) == (v2 is None) and (v1 is None or close_enough(v1, v2)), (name, v1, v2)


def _assert_same_weights(local: Path, remote: Path, part: str, load, tol: float = 1e-6) -> None:
    name = (local / "checkpoints" / "latest").read_text().strip()
    a = load(local / "checkpoints" / name / part).state_dict()
    b = load(remote / "checkpoints" / name / part).state_dict()
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < tol, f"{part}: weights differ by {worst}"


def _load_actor(path):
    return load_causal_lm(path, dtype="float32", device="cpu")


def _load_critic(path):
    return load_scalar_model(path, head="value-head", dtype="float32", device="cpu")


def _ptx_pairs(path: Path) -> Path:
    rows = [
        {"prompt": f"请问{a}+{b}={a + b}？", "response": f"是的，等于{a + b}！"} for a in range(3) for b in range(3)
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


class Counted:
    """A worker method that counts its calls."""

    def __init__(self, method) -> None:
        self.method, self.calls = method, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.method(*args, **kwargs)


@pytest.mark.parametrize("case", ["grpo", "ppo", "grpo-on-policy-ptx", "ppo-shared-prefix", "grpo-ref-sync"])
def test_two_ranks_train_like_one_process(case, local_ray, fast, tmp_path):
    preset = case.split("-")[0]
    # the same layout on both backends (model.shared_prefix auto is off on Ray)
    shared = case.endswith("shared-prefix")
    common = [*fast, VARIED_REWARD, "logging.report=false", f"model.shared_prefix={str(shared).lower()}"]
    if case == "grpo-on-policy-ptx":
        # one optimiser step per step: the update's forward gives log π_old and H (no actor pass in
        # phase 3), each rank its rows; PPO-ptx: each optimiser step's pairs drawn by the driver, split
        common += [
            "batch.mini_batch_prompts=4",
            "algo.ptx_coef=0.5",
            f"data.ptx={_ptx_pairs(tmp_path / 'pairs.jsonl')}",
        ]
    if case == "grpo-ref-sync":  # π_ref follows π_θ after every update: over the weight sync on Ray
        common += ["algo.kl.ref_sync_every=1", "algo.kl.ref_sync_alpha=0.5"]
    _trainer(preset, [*common, f"output_dir={tmp_path / 'local'}"]).train()
    remote = _trainer(preset, [*common, f"output_dir={tmp_path / 'ray'}", *_ray(2, 2), "ray.rollout_ranks=1"])
    assert type(remote.workers.actor).__name__ == "RayActor" and remote.workers.actor.group.world_size == 2
    if preset == "ppo":
        assert remote.workers.critic.group.world_size == 2
        # the critic's AdamW kernel on the start-up line, from its rank 0, as one process says it
        assert "; critic: AdamW, one tensor at a time (torch's default on CPU: " in remote.paths["optimiser"]
    for role in ("actor", "critic") if shared else ():  # each rank's passes run the layout
        group = getattr(remote.workers, role).group
        forward = group.get([group.hosts[0].call.remote(role, "__getattribute__", "_forward")], ranks=[0])[0]
        assert forward.forward.keywords["shared_prefix"] is True
    remote.workers.actor.compute_logprobs = phase3 = Counted(remote.workers.actor.compute_logprobs)
    remote.train()  # the workers stop at the end

    local, ray_run = tmp_path / "local", tmp_path / "ray"
    assert_metrics_close(local, ray_run)
    for step in (1, 2):
        _assert_same_ledgers(local, ray_run, step)
    tol = SHARED_PREFIX_WEIGHTS if shared else 1e-6
    _assert_same_weights(local, ray_run, "actor", _load_actor, tol)
    if preset == "ppo":
        _assert_same_weights(local, ray_run, "critic", _load_critic, tol)
    manifest = json.loads((ray_run / "checkpoints" / "step_00000002" / "manifest.json").read_text())
    assert {"actor", "actor_state", "rollout_rng"} <= set(manifest["parts"])
    if case == "grpo-on-policy-ptx":
        assert phase3.calls == 0
        assert all(row["actor/ptx_loss"] > 0 for row in logged_metrics(ray_run)[1:])
        assert "ptx_data" in manifest["parts"]
    if case == "grpo-ref-sync":  # the reference's weights, moved twice, as in one process
        one, two = (CheckpointManager(run / "checkpoints", 1) for run in (local, ray_run))
        a, b = (m.load_part(m.latest(), "reference") for m in (one, two))
        assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
        initial = _load_actor(fast[0].partition("=")[2]).state_dict()
        assert max((a[k] - initial[k]).abs().max().item() for k in a) > 1e-6  # it moved


class KillRankAt:
    """A metrics sink that kills one rank of a Ray group right after step ``at`` is logged
    (before that step's checkpoint), as an out-of-memory kill or a lost node would."""

    def __init__(self, trainer, role: str, rank: int, at: int) -> None:
        self.group = getattr(trainer.workers, role).group
        self.rank, self.at = rank, at

    def log(self, step, metrics):
        if step == self.at:
            ray.kill(self.group.hosts[self.rank])

    def close(self):
        pass


def test_a_killed_rank_stops_the_run_and_resume_is_exact(local_ray, fast, tmp_path):
    # Every actor rank samples (its own RNG, saved per rank); the critic has 2 ranks too.
    common = [*fast, VARIED_REWARD, "logging.report=false", "steps=3", "logging.checkpoint_every=1", *_ray(2, 2)]
    _trainer("ppo", [*common, f"output_dir={tmp_path / 'straight'}"]).train()

    run = [*common, f"output_dir={tmp_path / 'resumed'}"]
    victim = _trainer("ppo", run)
    victim.sinks.sinks.append(KillRankAt(victim, "actor", 1, at=2))
    with pytest.raises(GlassrlError, match=r"^actor worker rank 1 of 2 died"):
        victim.train()
    resumed = _trainer("ppo", run, resume=True)
    assert resumed.counters.step == 1  # step 2's checkpoint was never written
    resumed.train()

    one, two = logged_metrics(tmp_path / "straight"), logged_metrics(tmp_path / "resumed")
    assert [r["step"] for r in two] == [0, 1, 2, 3]
    assert one == two  # every logged number, bit for bit
    for part, load in (("actor", _load_actor), ("critic", _load_critic)):
        a = load(tmp_path / "straight" / "checkpoints" / "step_00000003" / part).state_dict()
        b = load(tmp_path / "resumed" / "checkpoints" / "step_00000003" / part).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), part
