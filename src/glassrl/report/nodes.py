"""The report's scale-out view: which node ran which rank of a Ray run, and what its calls cost there.

A Ray run's directory holds (glassrl.workers.ray_nodes writes them; docs/scale-out.md):

    nodes.jsonl           the driver's rows, one per rank per start of the run (a resume adds its
                          own): role, rank, node id, node address, host name, process id
    nodes/<role>-<rank>.jsonl   the rank's rows, one per call from the driver: method, seconds,
                          peak RSS, the node it ran on
    nodes/<role>-<rank>.log     its output

:func:`node_rows` joins them: one row per (start, node, role, rank) with the calls that rank made
on that node, their seconds and its peak RSS. A run of the in-process backend has none.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

NODES_DIR = "nodes"  # under the run directory
PLACEMENT_FILE = "nodes.jsonl"  # the driver's record: one row per rank per start


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path`` (none when it is missing; a line cut short by a kill is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def node_rows(run: Path) -> list[dict[str, Any]]:
    """One row per (start, role, rank) of ``run`` (nodes.jsonl), in order, each with ``start`` (1 for
    the first start), ``calls``, ``seconds`` and ``peak_rss_mb`` of the rank's calls on its node
    during that start (its rows from then until the next start)."""
    placed = _jsonl(run / PLACEMENT_FILE)
    starts = sorted({row["started"] for row in placed})
    out = []
    for row in placed:
        start = starts.index(row["started"])
        until = starts[start + 1] if start + 1 < len(starts) else float("inf")
        calls = [
            c
            for c in _jsonl(run / NODES_DIR / f"{row['role']}-{row['rank']}.jsonl")
            if c.get("node_id") == row["node_id"] and row["started"] <= c.get("time", 0) < until
        ]
        out.append(
            {
                **row,
                "start": start + 1,
                "calls": len(calls),
                "seconds": sum(c["seconds"] for c in calls),
                "peak_rss_mb": max((c["peak_rss_mb"] for c in calls), default=None),
            }
        )
    return out


def nodes_section(runs: list[tuple[str, Path]]) -> str:
    """The report's "Nodes" section for the (name, directory) runs that have nodes.jsonl ("" if none)."""
    body = []
    for name, path in runs:
        for r in node_rows(path):
            rss = "—" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}"
            cells = (name, r["start"], r["node_id"][:8], r["ip"], r["hostname"], f"{r['role']} {r['rank']}", r["pid"])
            cells += (r["calls"], f"{r['seconds']:.1f}", rss)
            body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    if not body:
        return ""
    head = ("run", "start", "node", "address", "host", "rank", "pid", "calls", "busy s", "peak RSS MiB")
    return (
        '<section id="nodes"><h2>Nodes</h2><p>Where each rank of the Ray backend ran, per start of the run '
        "(a resume is a new start), and its calls there: nodes.jsonl and nodes/ in the run directory, each "
        "rank's log beside them (docs/scale-out.md).</p><table><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr>"
        + "".join(body)
        + "</table></section>"
    )
