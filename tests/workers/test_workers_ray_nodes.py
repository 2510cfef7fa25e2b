"""Where each rank runs, the run directory every node must share, and the report's nodes table
(glassrl.workers.ray_nodes, glassrl.report.nodes; issue 43), without a cluster: a rank's side runs
in this process, the driver's against stand-in groups. On real nodes: tests/rl/test_rl_ray_nodes.py."""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import pytest

from glassrl.errors import GlassrlError
from glassrl.report import nodes as report_nodes
from glassrl.workers import ray_nodes

PLACE = {"node_id": "3eb2b867" + "0" * 48, "ip": "10.0.0.7", "hostname": "gpu-7", "pid": 4242}


@pytest.fixture
def here(monkeypatch):
    """This process stands for a rank on node 3eb2b867 (10.0.0.7); its streams put back after."""
    monkeypatch.setattr(ray_nodes, "where", lambda: dict(PLACE))
    out, err = sys.stdout, sys.stderr
    yield
    sys.stdout, sys.stderr = out, err


def test_a_rank_that_reads_the_token_writes_its_marker_log_and_calls(here, tmp_path):
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "token").write_text("abc\n")
    files, place, problem = ray_nodes.RankFiles.open(str(tmp_path), "abc", "actor", 1)
    assert problem == "" and place == PLACE
    marker = json.loads((tmp_path / "nodes" / "actor-1.json").read_text())
    assert (marker["role"], marker["rank"], marker["node_id"]) == ("actor", 1, PLACE["node_id"])
    print("a line of the rank")
    files.record("actor.update", 1.5)
    assert "a line of the rank" in (tmp_path / "nodes" / "actor-1.log").read_text()
    (row,) = [json.loads(line) for line in (tmp_path / "nodes" / "actor-1.jsonl").read_text().splitlines()]
    assert (row["method"], row["seconds"], row["node_id"]) == ("actor.update", 1.5, PLACE["node_id"])
    assert row["peak_rss_mb"] > 0


def test_a_rank_on_another_disk_says_what_it_sees(here, tmp_path):
    files, _, problem = ray_nodes.RankFiles.open(str(tmp_path / "elsewhere"), "abc", "actor", 0)
    assert files is None and problem.startswith("cannot read the driver's") and "No such file" in problem
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "token").write_text("an old run's\n")
    files, _, problem = ray_nodes.RankFiles.open(str(tmp_path), "abc", "actor", 0)
    assert files is None and problem.startswith("reads another token")
    assert not (tmp_path / "nodes" / "actor-0.json").exists()


class StandIn:
    """A group whose rank r answers ``attach`` as ``answer(r, run_dir, token)`` would."""

    def __init__(self, answers) -> None:
        self.hosts = [
            SimpleNamespace(attach=SimpleNamespace(remote=lambda d, t, r=r: (r, d, t))) for r in range(len(answers))
        ]
        self.answers = answers

    def get(self, futures):
        return [self.answers[r](r, d, t) for r, d, t in futures]


def _shares(rank, run_dir, token):
    return ray_nodes.RankFiles.open(run_dir, token, "actor", rank)[1:][::-1]


def test_the_driver_names_the_node_that_does_not_share_the_run_directory(here, tmp_path):
    blind = lambda rank, run_dir, token: ("cannot read the driver's token", {**PLACE, "node_id": "9f" * 28})  # noqa: E731
    with pytest.raises(GlassrlError) as err:
        ray_nodes.attach_ranks({"actor": StandIn([_shares, blind])}, tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("ray: node 9f9f9f9f (10.0.0.7), actor rank 1, cannot read the driver's token: ")
    assert f"output_dir {tmp_path} must be one filesystem every node mounts at the same path" in message

    mute = lambda rank, run_dir, token: ("", PLACE)  # noqa: E731  (says it wrote, but nothing is there)
    with pytest.raises(GlassrlError, match=r"actor rank 1, wrote a marker the driver cannot read"):
        ray_nodes.attach_ranks({"actor": StandIn([_shares, mute])}, tmp_path)


def test_the_placement_rows_line_and_report_table(here, tmp_path):
    rows = ray_nodes.attach_ranks({"actor": StandIn([_shares, _shares])}, tmp_path)
    assert [(r["role"], r["rank"], r["node_id"]) for r in rows] == [("actor", k, PLACE["node_id"]) for k in (0, 1)]
    assert ray_nodes.placement_line(rows) == "1 (node 3eb2b867 (10.0.0.7): actor 0, actor 1)"
    calls = tmp_path / "nodes" / "actor-0.jsonl"
    calls.write_text(
        json.dumps(
            {
                "time": time.time(),
                "node_id": PLACE["node_id"],
                "method": "actor.update",
                "seconds": 2.0,
                "peak_rss_mb": 300.0,
            }
        )
        + "\n"
    )
    time.sleep(0.01)
    later = {**PLACE, "node_id": "77b52fb3" + "1" * 48}  # a resume: rank 0 on another node
    moved = lambda rank, run_dir, token: _shares(rank, run_dir, token) if rank else ("", later)  # noqa: E731
    (tmp_path / "nodes" / "actor-0.json").write_text("{}")  # its marker, as rank 0 would write it
    ray_nodes.attach_ranks({"actor": StandIn([moved, _shares])}, tmp_path)
    with calls.open("a") as f:
        f.write(
            json.dumps(
                {
                    "time": time.time(),
                    "node_id": later["node_id"],
                    "method": "actor.update",
                    "seconds": 3.0,
                    "peak_rss_mb": 310.0,
                }
            )
            + "\n"
        )
        f.write('{"time": 1, "cut sho')  # a line a kill cut short
    table = report_nodes.node_rows(tmp_path)
    assert [(r["start"], r["rank"], r["node_id"][:8], r["calls"], r["seconds"]) for r in table] == [
        (1, 0, "3eb2b867", 1, 2.0),
        (1, 1, "3eb2b867", 0, 0),
        (2, 0, "77b52fb3", 1, 3.0),
        (2, 1, "3eb2b867", 0, 0),
    ]
    section = report_nodes.nodes_section([("run", tmp_path)])
    assert section.startswith('<section id="nodes">') and "77b52fb3" in section and "gpu-7" in section
    assert report_nodes.nodes_section([("run", tmp_path / "none")]) == ""
    assert (report_nodes.NODES_DIR, report_nodes.PLACEMENT_FILE) == (ray_nodes.NODES_DIR, ray_nodes.PLACEMENT_FILE)


def test_a_dead_rank_is_named_with_its_node(monkeypatch):
    from glassrl.workers.ray_cluster import RankGroup

    group = object.__new__(RankGroup)
    group.places = [{}, PLACE]
    monkeypatch.setattr("glassrl.workers.ray_cluster.node_alive", lambda node_id: False)
    assert group._on_node(1) == " on node 3eb2b867 (10.0.0.7), lost with it"
    monkeypatch.setattr("glassrl.workers.ray_cluster.node_alive", lambda node_id: True)
    assert group._on_node(1) == " on node 3eb2b867 (10.0.0.7)"
    assert group._on_node(0) == ""  # died before it said where


class FakeRay:
    """Ray's calls that RankGroup.get makes, over futures that are done (an error each) or pending."""

    class exceptions:  # noqa: N801 (Ray's name)
        class RayError(Exception):
            pass

        class RayActorError(RayError):
            pass

        class RayTaskError(RayError):
            def __init__(self, cause):
                super().__init__(str(cause))
                self.cause = cause

    def __init__(self, errors: dict) -> None:
        self.errors = errors  # future → its error (None: never done)

    def wait(self, pending, num_returns=1, timeout=None):
        done = [f for f in pending if self.errors[f] is not None][:num_returns]
        return done, [f for f in pending if f not in done]

    def get(self, future):
        raise self.errors[future]


def test_a_collective_cut_off_by_a_lost_node_names_the_dead_rank_not_the_peer(monkeypatch):
    """Rank 0's allreduce fails first ("Connection reset by peer": rank 1's node is gone) while Ray
    has not yet said rank 1 is dead: the error names rank 1 and its node, not rank 0's traceback."""
    from glassrl.workers import ray_cluster

    fake = FakeRay({"f0": None, "f1": None})
    fake.errors["f0"] = fake.exceptions.RayTaskError(RuntimeError("gloo: Read error: Connection reset by peer"))
    monkeypatch.setattr(ray_cluster, "import_ray", lambda: fake)
    checks = []
    monkeypatch.setattr(ray_cluster, "node_alive", lambda node_id: checks.append(node_id) or node_id[0] != "7")
    group = object.__new__(ray_cluster.RankGroup)
    group.role, group.world_size, group.hosts = "actor", 2, []
    group.places = [PLACE, {**PLACE, "node_id": "77b52fb3" + "1" * 48, "ip": "10.0.0.8"}]
    with pytest.raises(GlassrlError) as err:
        group.get(["f0", "f1"])
    assert str(err.value) == (
        "actor worker rank 1 of 2 died on node 77b52fb3 (10.0.0.8), lost with it: "
        "its node stopped answering Ray's health checks"
    )

    # A failure of the rank's own, no rank dead: Ray's error as it is (after the wait).
    monkeypatch.setattr(ray_cluster, "node_alive", lambda node_id: True)
    fake.errors["f1"] = fake.exceptions.RayTaskError(RuntimeError("its own"))
    with pytest.raises(fake.exceptions.RayTaskError):
        group.get(["f0", "f1"])
