"""Helpers shared by the trainer tests that kill a run and compare it with an uninterrupted one."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from glassrl.ledger import read_jsonl


class Killed(Exception):
    """Stands for SIGKILL: raised from inside the run, after step ``at`` was logged."""


class KillAt:
    """A metrics sink that kills the run right after logging step ``at`` (before any checkpoint of it)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def log(self, step, metrics):
        if step == self.at:
            raise Killed

    def close(self):
        pass


def logged_metrics(run: Path) -> list[dict]:
    """metrics.jsonl of a run directory without the wall-clock keys (perf/…), which no two runs share, and
    the sync truth check's counts (sync/…: the syncs this process made and checked; a resumed run takes
    rounds sampled before the stop from its checkpoint, without syncing for them). :func:`metric_rows`: all."""
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "sync/"))} for row in metric_rows(run)]


def metric_rows(run: Path) -> list[dict]:
    """Every row of a run directory's metrics.jsonl, as logged."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# Means over micro-batches: a data-parallel rank's micro-batches hold other rows than one process's,
# so these averages differ between the backends (tests/rl/test_rl_ray.py's docstring).
DIAGNOSTIC_DEPENDENT = {
    "actor/clip_frac_low",
    "actor/clip_frac_high",
    "actor/approx_kl",
    "critic/vf_clip_frac",
}


# What the layout pads (a data-parallel rank's micro-batches, a shared prompt computed once): a property of
# how the rows were laid out, which the runs compared here change on purpose, not of the numbers computed.
LAYOUT_DEPENDENT = {"actor/padding_share", "critic/padding_share"}


def close_enough(a: float, b: float) -> bool:
    """Two logged numbers of a Ray run and a one-process run: relative or absolute 1e-5 (NaN equals NaN)."""
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)


def assert_metrics_close(local: Path, remote: Path) -> None:
    """Every step's logged numbers (but perf/…, DIAGNOSTIC_DEPENDENT and LAYOUT_DEPENDENT) :func:`close_enough`."""
    one, two = logged_metrics(local), logged_metrics(remote)
    assert [r["step"] for r in one] == [r["step"] for r in two]
    for a, b in zip(one, two):
        keys = set(a) - DIAGNOSTIC_DEPENDENT
        assert keys == set(b) - DIAGNOSTIC_DEPENDENT, f"step {a['step']}: keys differ"
        different = {k: (a[k], b[k]) for k in keys - LAYOUT_DEPENDENT if not close_enough(a[k], b[k])}
        assert not different, f"step {a['step']}: {different}"


def remove_checkpoint_part(checkpoint: Path, part: str) -> None:
    """Delete one part of a checkpoint directory: its manifest entry and its files."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    entry = manifest["parts"].pop(part)
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    for file in entry["files"]:
        (checkpoint / file["path"]).unlink()


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, role: str = "actor") -> None:
    """Every tensor of the two state dicts equal, bit for bit."""
    wa, wb = a.state_dict(), b.state_dict()
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), f"{role} {key} differs"


def assert_ledgers_close(a: Path, b: Path, close: Callable[[object, object], bool], steps=(1, 2)) -> list:
    """Every token row of two runs' ledgers at ``steps``, field by field, ``close``; returns the
    (ledger of a, ledger of b) pairs for further checks."""
    pairs = []
    for step in steps:
        name = f"ledgers/step_{step:06d}.jsonl"
        la, lb = read_jsonl(a / name), read_jsonl(b / name)
        for ra, rb in zip(la.responses, lb.responses, strict=True):
            for ta, tb in zip(ra.tokens, rb.tokens, strict=True):
                da, db = dataclasses.asdict(ta), dataclasses.asdict(tb)
                assert all(close(da[k], db[k]) for k in da), (step, da, db)
        pairs.append((la, lb))
    return pairs


def largest_weight_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """max |a − b| over every tensor of the two state dicts."""
    wa, wb = a.state_dict(), b.state_dict()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)
