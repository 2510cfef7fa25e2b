"""Several Ray nodes on this machine (issue 43): a run's ranks placed across nodes, a node lost
mid-step, the run directory every node must share.

The cluster is real: ``ray.cluster_utils.Cluster`` starts one raylet per node (its own processes,
object store and resources; its own temporary directory, never another cluster's), and removing a
node kills its raylet and every worker on it, as a machine lost would. Nodes, each 1 CPU:

    head   the driver's node (the reference's rank lands here or anywhere)
    a, b   {trainer: 2} each: the actor's 2 ranks, ``ray.actor.nodes: spread`` → one on each,
           their gloo group formed across the two nodes (rank 0's node address)
    c      {sampler: 1}: the rollout's rank (``ray.rollout.placement: apart``)

Equality with one process: the spread run logs what the in-process backend logs (relative or
absolute 1e-5, the DDP tolerance of tests/rl/test_rl_ray.py) and its weights pass
tests/helpers.adam_weights_close. Node lost: the run ends with one line naming the role, the rank
and the node, and ``--resume`` (on the nodes left: ``spread`` puts both actor ranks on node b; or on
a replacement node) logs the same numbers, bit for bit, as the run that never stopped; with
``rollout.max_staleness`` the lost node's rounds in flight are sampled again, none lost and none
used twice (the same prompts at the same steps). The driver killed (SIGKILL of its process) takes
its ranks with it (Ray ends a job's actors with its driver); the next driver names it (its pid and host,
from the run's lock) and resumes, bit for bit.

Slow: one cluster per module; each Trainer starts its ranks on three nodes.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from rich.console import Console

from glassrl.config import load_config
from glassrl.errors import GlassrlError
from glassrl.ledger import read_jsonl
from glassrl.models import load_causal_lm
from glassrl.rl.config import TrainConfig
from helpers import adam_weights_close, tiny_run_overrides
from run_helpers import assert_metrics_close, logged_metrics

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
NODES = {"a": {"trainer": 2}, "b": {"trainer": 2}, "c": {"sampler": 1}}
VARIED_REWARD = "reward.sources=[{name: arith_verify, weight: 1.0, partial_credit: true}]"


class Nodes:
    """The module's cluster: its head and the named nodes, which a test may remove and put back."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self.temp = tempfile.mkdtemp(prefix="glassrl-nodes-", dir="/tmp")  # short: Ray's socket paths
        # Node deaths noticed within a second or two (Ray's default: 5 missed checks of 3 s).
        health = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
        head = {**NODE, "include_dashboard": False, "temp_dir": self.temp, "_system_config": health}
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.nodes: dict[str, object] = {}
        self.ensure()

    def ensure(self) -> None:
        """Every named node up (a removed one replaced by a new raylet with its resources)."""
        for name, resources in NODES.items():
            if name not in self.nodes:
                self.nodes[name] = self.cluster.add_node(**NODE, resources=resources)
        self.cluster.wait_for_nodes()

    def name_of(self, node_id: str) -> str:
        return next((n for n, node in self.nodes.items() if node.node_id == node_id), "head")

    def remove(self, node_id: str) -> None:
        """The node's raylet and every worker it started killed at once (SIGKILL: no clean-up), as a machine
        lost. Ray's remove_node kills the raylet; its workers would notice only later and could still
        answer a call in flight, which a lost machine cannot."""
        import psutil
        from ray._private import ray_constants

        node = self.nodes.pop(self.name_of(node_id))
        [raylet] = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET]
        workers = psutil.Process(raylet.process.pid).children(recursive=True)
        self.cluster.remove_node(node, allow_graceful=False)
        for worker in workers:
            try:
                worker.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(workers, timeout=30)

    def shutdown(self) -> None:
        self.cluster.shutdown()
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes():
    cluster = Nodes()
    ray.init(address=cluster.cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _overrides(fast: list[str], address: str, *more: str) -> list[str]:
    return [
        *fast,
        VARIED_REWARD,
        "logging.report=false",
        "steps=3",
        "logging.checkpoint_every=1",
        "trainer.backend=ray",
        f"ray.address={address}",
        "ray.placement=separate",
        "ray.actor.world_size=2",
        "ray.actor.resources={CPU: 0.25, trainer: 1}",
        "ray.actor.nodes=spread",
        "ray.reference.resources={CPU: 0.25}",
        "ray.rollout.placement=apart",
        "ray.rollout.resources={CPU: 0.25, sampler: 1}",
        *more,
    ]


def _cluster_at_rest(timeout: float = 60.0) -> None:
    """Wait until the last run's placement groups are gone (Ray frees them asynchronously): Ray's SPREAD is
    best effort, and with a node's resources still held it would place both actor ranks on the other node."""
    deadline = time.monotonic() + timeout
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        held = {k: total[k] - free.get(k, 0) for k in ("trainer", "sampler") if free.get(k, 0) < total.get(k, 0)}
        if not held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the nodes' resources still held {timeout:.0f} s after the last run: {held}")
        time.sleep(0.2)


def _trainer(overrides: list[str], **kwargs):
    from glassrl.rl.loop import Trainer

    _cluster_at_rest()
    return Trainer(load_config(TrainConfig, EXAMPLES / "grpo.yaml", overrides), progress=False, **kwargs)


def _placement(run: Path) -> dict[tuple[str, int], str]:
    """(role, rank) → node id, from the last start's rows of nodes.jsonl."""
    rows = [json.loads(line) for line in (run / "nodes.jsonl").read_text().splitlines()]
    last = max(r["started"] for r in rows)
    return {(r["role"], r["rank"]): r["node_id"] for r in rows if r["started"] == last}


@pytest.fixture(scope="module")
def straight(nodes, tiny_model_dir, prompt_files, tmp_path_factory):
    """The multi-node run that never stops: (its overrides without output_dir, its directory)."""
    out = tmp_path_factory.mktemp("straight")
    common = _overrides(tiny_run_overrides(tiny_model_dir, prompt_files, out / "unused"), nodes.cluster.address)
    _trainer([*common, f"output_dir={out / 'run'}"]).train()
    return common, out / "run"


def test_ranks_spread_over_nodes_train_like_one_process(nodes, straight, tmp_path):
    common, run = straight
    placed = _placement(run)
    actor = {nodes.name_of(placed["actor", r]) for r in (0, 1)}
    assert actor == {"a", "b"}  # spread: one rank a node, the gloo group across them
    assert nodes.name_of(placed["rollout", 0]) == "c"
    for (role, rank), node in placed.items():  # each rank's files, written on its node
        marker = json.loads((run / "nodes" / f"{role}-{rank}.json").read_text())
        assert marker["node_id"] == node and marker["pid"] > 0
        calls = [json.loads(line) for line in (run / "nodes" / f"{role}-{rank}.jsonl").read_text().splitlines()]
        assert calls and all(c["node_id"] == node for c in calls)
    updates = (run / "nodes" / "actor-1.jsonl").read_text()
    assert '"method": "actor.update"' in updates and '"method": "weights.send"' in updates
    environment = json.loads((run / "environment.json").read_text())
    assert int(environment["paths"]["nodes"].split()[0]) >= 3  # the start-up line: how many nodes hold ranks

    from glassrl.report.html import write_run_report

    page = write_run_report([run], tmp_path / "report.html").read_text()  # the nodes table names them
    assert '<a href="#nodes">' in page and all(node[:8] in page for node in placed.values())

    local_overrides = [o for o in common if not o.startswith(("trainer.", "ray."))]
    local = tmp_path / "local"
    _trainer([*local_overrides, f"output_dir={local}"]).train()
    assert_metrics_close(local, run)
    for step in (1, 2, 3):  # the same samples
        one, two = (read_jsonl(r / "ledgers" / f"step_{step:06d}.jsonl") for r in (local, run))
        assert [r.response for r in one.responses] == [r.response for r in two.responses]
    a, b = (
        load_causal_lm(r / "checkpoints" / "step_00000003" / "actor", dtype="float32", device="cpu")
        for r in (local, run)
    )
    assert adam_weights_close(a.state_dict(), b.state_dict(), tight=2e-6, lr=1e-4) is None


def test_pack_puts_the_ranks_on_one_node(nodes):
    """ray.<role>.nodes → the placement group's strategy (RayCluster, ranks that build nothing);
    spread: the trainer test above."""
    from glassrl.workers.ray_cluster import RayCluster, RoleSpec

    nodes.ensure()
    while ray.available_resources().get("trainer", 0) < 4:  # the last run's groups are freed
        time.sleep(0.2)
    spec = RoleSpec("actor", 2, lambda ctx: {}, resources={"CPU": 0.1, "trainer": 1}, nodes="pack")
    cluster = RayCluster([spec], placement="separate")
    try:
        places = cluster["actor"].places
        assert len({p["node_id"] for p in places}) == 1
        assert nodes.name_of(places[0]["node_id"]) in {"a", "b"}
    finally:
        cluster.shutdown()


class LoseNodeOf:
    """Wraps ``trainer.workers.<role>.<method>``: at its call ``at`` (1-based) the node of rank ``rank``
    of ``group`` is removed first (its raylet and workers killed), then the call goes to the ranks."""

    def __init__(self, nodes: Nodes, trainer, role: str, method: str, group, rank: int, at: int) -> None:
        worker = getattr(trainer.workers, role)
        self.nodes, self.real, self.group, self.rank, self.at, self.calls = (
            nodes,
            getattr(worker, method),
            group,
            rank,
            at,
            0,
        )
        setattr(worker, method, self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            self.nodes.remove(self.group.places[self.rank]["node_id"])
        return self.real(*args, **kwargs)


def test_an_actor_node_lost_mid_step_is_named_and_the_resume_is_exact(nodes, straight, tmp_path):
    common, run = straight
    out = tmp_path / "lost"
    victim = _trainer([*common, f"output_dir={out}"])
    group = victim.workers.actor.group
    lost = group.places[1]
    assert lost["node_id"] != group.places[0]["node_id"]  # spread: the node lost holds rank 1 alone
    LoseNodeOf(nodes, victim, "actor", "update", group, rank=1, at=2)  # step 2's update, mid-step
    with pytest.raises(GlassrlError, match=rf"^actor worker rank 1 of 2 died on node {lost['node_id'][:8]} ") as err:
        victim.train()
    assert "\n" not in str(err.value)
    again = _trainer([*common, f"output_dir={out}"], resume=True)  # on the nodes left
    assert again.counters.step == 1
    placed = _placement(out)
    assert placed["actor", 0] == placed["actor", 1]  # spread over what is left: one node
    again.train()
    assert logged_metrics(run) == logged_metrics(out)  # every number, bit for bit
    nodes.ensure()  # a replacement for the next tests


def test_a_rollout_node_lost_loses_no_sample_under_max_staleness(nodes, tiny_model_dir, prompt_files, tmp_path):
    more = ["rollout.max_staleness=1", "steps=4", "logging.checkpoint_every=2", "logging.ledger_samples=16"]
    common = _overrides(tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "u"), nodes.cluster.address, *more)
    straight, out = tmp_path / "straight", tmp_path / "lost"
    _trainer([*common, f"output_dir={straight}"]).train()

    victim = _trainer([*common, f"output_dir={out}"])
    # the actor's update of step 3, while the rollout samples the round of step 4 ahead
    LoseNodeOf(nodes, victim, "actor", "update", victim.workers.rollout.group, rank=0, at=3)
    with pytest.raises(GlassrlError, match=r"rollout worker rank 0 of 1 died on node \w{8} "):
        victim.train()
    nodes.ensure()  # the replacement node c
    again = _trainer([*common, f"output_dir={out}"], resume=True)
    assert again.counters.step == 2
    again.train()
    assert logged_metrics(straight) == logged_metrics(out)  # bit for bit
    assert _prompts(straight) == _prompts(out)  # the same prompts at the same steps: none lost, none twice


def _prompts(run: Path) -> list[list[str]]:
    """Per step, the prompts its responses answer (every response of the ledger, in order)."""
    return [[r.prompt for r in read_jsonl(path).responses] for path in sorted((run / "ledgers").glob("step_*.jsonl"))]


def test_the_driver_killed_and_the_next_resumes_exactly(nodes, straight, tmp_path):
    common, run = straight
    out = tmp_path / "driver"
    command = [sys.executable, "-m", "glassrl.cli", "train", str(EXAMPLES / "grpo.yaml"), *common, f"output_dir={out}"]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        metrics = out / "metrics.jsonl"
        while driver.poll() is None and not (metrics.is_file() and '"step": 2' in metrics.read_text()):
            time.sleep(0.2)
        assert driver.poll() is None, "the driver ended before step 2"
        os.kill(driver.pid, signal.SIGKILL)  # our own child, by its pid
        driver.wait()
    finally:
        if driver.poll() is None:
            os.kill(driver.pid, signal.SIGKILL)
    said = io.StringIO()
    again = _trainer([*common, f"output_dir={out}"], resume=True, console=Console(file=said, width=400))
    # a killed driver says nothing; the next one names it: its pid and machine, from the run's lock
    assert f"took over a stale lock (pid {driver.pid} on {socket.gethostname()}, started " in said.getvalue()
    assert 1 <= again.counters.step <= 2
    again.train()
    assert logged_metrics(run) == logged_metrics(out)
