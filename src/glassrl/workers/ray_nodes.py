"""Which node each rank of a Ray run lives on, the run directory every node must share, and what
each rank writes there (issue 43; docs/scale-out.md, "On a cluster").

On several machines the ranks write into the run directory themselves (every rank its checkpoint
shards, glassrl.run.sharded; rank 0 the Hugging Face export), and a resume reads them back from
wherever the new ranks land: the run directory must be one filesystem every node mounts at the same
path. At start-up (:func:`attach_ranks`) the driver writes a token into ``<run>/nodes/token``; every
rank reads it back and writes its own marker; the driver then reads every marker. A rank that
cannot read the token, or whose marker the driver cannot read, is one GlassrlError naming its node,
role and rank (before any step: a run would otherwise fail at its first checkpoint, or resume from
shards written on a disk the next ranks cannot see).

What every rank writes afterwards (which node wrote what), under ``<run>/nodes/``:

    <role>-<rank>.json    where the rank runs: node id, address, host name, process id (this life)
    <role>-<rank>.log     its Python stdout and stderr, appended (Ray also forwards them to the driver)
    <role>-<rank>.jsonl   one row per call from the driver: method, seconds, peak RSS, node
and the driver ``nodes.jsonl``: one row per rank per start of the run (a resume adds its rows), read
by the report's nodes table (glassrl.report.nodes).
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from glassrl.errors import GlassrlError

# What glassrl.report.nodes reads (report is below workers: it keeps its own copy of the names)
NODES_DIR = "nodes"  # under the run directory
PLACEMENT_FILE = "nodes.jsonl"  # the driver's record: one row per rank per start


def where() -> dict[str, Any]:
    """This process's place on the cluster: Ray node id, node address, host name, process id."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
    }


def node_name(place: dict[str, Any]) -> str:
    """A node as lines name it: the first 8 hex digits of its id and its address."""
    return f"node {place['node_id'][:8]} ({place['ip']})"


def node_alive(node_id: str) -> bool | None:
    """Whether Ray's control store counts ``node_id`` alive (None when it does not know the node)."""
    import ray

    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return bool(node.get("Alive"))
    return None


class _Tee:
    """A text stream that writes to ``stream`` and to ``copy`` (a rank's log file)."""

    def __init__(self, stream: TextIO, copy: TextIO) -> None:
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        self.copy.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.copy.flush()
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class RankFiles:
    """A rank's files in ``<run>/nodes/`` (module docstring), opened in its process by :meth:`open`."""

    def __init__(self, directory: Path, role: str, rank: int, place: dict[str, Any]) -> None:
        self.stem = directory / f"{role}-{rank}"
        self.role, self.rank, self.place = role, rank, place
        self.calls = open(f"{self.stem}.jsonl", "a", encoding="utf-8")  # noqa: SIM115 (held for the rank's life)
        self.log = open(f"{self.stem}.log", "a", encoding="utf-8")  # noqa: SIM115
        sys.stdout, sys.stderr = _Tee(sys.stdout, self.log), _Tee(sys.stderr, self.log)

    @classmethod
    def open(cls, run_dir: str, token: str, role: str, rank: int) -> tuple[RankFiles | None, dict[str, Any], str]:
        """The rank's files when it reads ``token`` back from the run directory and can write there
        (else None and what failed), and its place."""
        place = where()
        directory = Path(run_dir) / NODES_DIR
        try:
            seen = (directory / "token").read_text(encoding="utf-8").strip()
        except OSError as err:
            return None, place, f"cannot read the driver's {directory / 'token'} ({err.strerror})"
        if seen != token:
            return None, place, f"reads another token in {directory / 'token'} (another disk at that path)"
        try:
            files = cls(directory, role, rank, place)
            stamp = {"role": role, "rank": rank, **place, "started": time.time()}
            (directory / f"{role}-{rank}.json").write_text(json.dumps(stamp) + "\n", encoding="utf-8")
        except OSError as err:
            return None, place, f"cannot write into {directory} ({err.strerror})"
        return files, place, ""

    def record(self, method: str, seconds: float) -> None:
        """One call's row (``ru_maxrss``: kibibytes on Linux)."""
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        row = {"time": time.time(), "node_id": self.place["node_id"], "method": method, "seconds": seconds}
        self.calls.write(json.dumps({**row, "peak_rss_mb": round(rss, 1)}) + "\n")
        self.calls.flush()


def attach_ranks(groups: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """Every rank of ``groups`` (role → glassrl.workers.ray_cluster.RankGroup) checks that it sees
    ``run_dir`` (module docstring) and opens its files there; the driver appends the placement to
    ``nodes.jsonl`` and returns its rows. GlassrlError naming the first rank's node that does not share it."""
    directory = run_dir / NODES_DIR
    directory.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    (directory / "token").write_text(token + "\n", encoding="utf-8")
    started = time.time()
    rows = []
    for role, group in groups.items():
        answers = group.get([h.attach.remote(str(run_dir), token) for h in group.hosts])
        for rank, (problem, place) in enumerate(answers):
            if not problem and not (directory / f"{role}-{rank}.json").is_file():
                problem = f"wrote a marker the driver cannot read at {directory / f'{role}-{rank}.json'}"
            if problem:
                raise GlassrlError(
                    f"ray: {node_name(place)}, {role} rank {rank}, {problem}: output_dir {run_dir} must be one "
                    "filesystem every node mounts at the same path (every rank writes its checkpoint shards "
                    "there; docs/scale-out.md, 'On a cluster')"
                )
            rows.append({"started": started, "role": role, "rank": rank, **place})
    with open(run_dir / PLACEMENT_FILE, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return rows


def placement_line(rows: list[dict[str, Any]]) -> str:
    """The start-up line's account ("nodes: ..."): how many nodes hold the ranks, and which ranks each holds."""
    by_node: dict[str, list[str]] = {}
    for row in rows:
        by_node.setdefault(node_name(row), []).append(f"{row['role']} {row['rank']}")
    held = "; ".join(f"{node}: {', '.join(ranks)}" for node, ranks in by_node.items())
    return f"{len(by_node)} ({held})"
