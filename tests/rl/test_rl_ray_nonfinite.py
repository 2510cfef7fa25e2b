"""``on_nonfinite`` on the Ray backend, end to end: ``glassrl train`` with 2 data-parallel actor ranks
and ``actor_optim.lr=1e30`` (the probe of issue 15), as tests/reliability runs it in process.

- stop: the NonFiniteError raised in the ranks (every rank alike) reaches the driver as one line
  naming the step, the role's update, the ranks, the optimiser step and the tensor; exit code 2;
  with ``keep_checkpoints=1`` the newest checkpoint (finite) is ``latest`` and survives;
- skip: the run ends (exit 0) having dropped the same optimiser steps as the in-process run of
  the same config, counted in ``actor/skipped_steps``; every checkpoint is finite.

Which rank holds a NaN, and that all ranks then skip together, is tested without Ray in
tests/workers/test_workers_dp_nonfinite.py; here both ranks diverge at once.

Slow: one local Ray cluster (2 CPUs) for the module; each run starts its worker processes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from glassrl.cli import main
from glassrl.run.checkpoint import read_manifest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

RAY = [
    "trainer.backend=ray",
    "ray.actor.world_size=2",
    "ray.actor.resources={CPU: 0.5}",
    "ray.reference.resources={CPU: 0.5}",
]


def _argv(fast: list[str], out: Path, policy: str) -> list[str]:
    """3 steps at lr 1e30 (steps 2 and 3 diverge), a checkpoint each step, only the newest kept."""
    run = [f"output_dir={out}", "steps=3", "actor_optim.lr=1e30", f"on_nonfinite={policy}", "logging.report=false"]
    run.append("model.shared_prefix=false")  # in-process as on Ray: padded passes
    return ["train", "grpo", *fast, *run, "logging.checkpoint_every=1", "logging.keep_checkpoints=1"]


def _run(capsys, argv: list[str]) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err.splitlines()
    return rc, [line for line in err if line.strip() and not line.startswith(("Loading weights", "Writing model"))]


def _only_finite_checkpoint(run: Path) -> Path:
    from safetensors.torch import load_file

    checkpoints = run / "checkpoints"
    (latest,) = [p for p in checkpoints.iterdir() if p.name.startswith("step_")]
    assert (checkpoints / "latest").read_text().strip() == latest.name
    assert read_manifest(latest)["finite"]
    files = sorted((latest / "actor").glob("*.safetensors"))
    assert files and all(torch.isfinite(t).all() for f in files for t in load_file(f).values())
    return latest


def _skipped(run: Path) -> list[int]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row.get("actor/skipped_steps", 0) for row in rows if row["step"] > 0]


def test_stop_is_one_line_naming_the_ranks_and_keeps_the_finite_checkpoint(local_ray, capsys, fast, tmp_path):
    run = tmp_path / "ray"
    rc, err = _run(capsys, [*_argv(fast, run, "stop"), *RAY])
    assert rc == 2, err
    assert len(err) == 1, err
    assert re.match(
        r"^glassrl train: error: step 2, actor update on ranks 0, 1 of 2, optimiser step \d of 2: "
        r"actor/\S+ = nan.*; the weights were not changed .*; "
        r"the last checkpoint, step_00000001, holds finite weights$",
        err[0],
    ), err[0]
    assert _only_finite_checkpoint(run).name == "step_00000001"


def test_skip_drops_the_steps_the_in_process_run_drops(local_ray, capsys, fast, tmp_path):
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert _run(capsys, _argv(fast, local, "skip"))[0] == 0
    rc, err = _run(capsys, [*_argv(fast, remote, "skip"), *RAY, "ray.rollout_ranks=1"])
    assert rc == 0, err
    assert sum(_skipped(remote)) >= 2
    assert _skipped(remote) == _skipped(local)
    _only_finite_checkpoint(remote)
