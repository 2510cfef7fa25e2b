"""The sync truth check in a run (glassrl.diagnose.sync_check): on the local backend what moves is the
reference that follows the actor (algo.kl.ref_sync_every) and the sampling copy of rollout.max_staleness 1;
each mix or copy is checked, and an injected fault (the mix skipping one tensor: "a tensor dropped")
stops the run at the step it happens, naming the step, the tensor and its layer; under
check.on_sync_breach: warn the run goes on and says so each step. (The Ray paths and the fault classes
one by one: tests/workers/test_workers_sync_truth.py, tests/rl/test_rl_ray_rollout_apart.py.)"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

import glassrl.workers.local as local_workers
from glassrl import presets
from glassrl.diagnose.sync_check import SyncBreach
from glassrl.report.html import write_run_report
from helpers import preset_trainer
from run_helpers import metric_rows

DROPPED = "model.layers.1.mlp.down_proj.weight"


def _drop_one(monkeypatch) -> None:
    real = local_workers.lerp_into

    def lerp_but_one(targets, weights, alpha):
        real(targets, [(n, t) for n, t in weights if n != DROPPED], alpha)

    monkeypatch.setattr(local_workers, "lerp_into", lerp_but_one)


def _run(fast, tmp_path, *more, console=None):
    trainer = preset_trainer(
        "grpo", [*fast, "steps=2", "algo.kl.ref_sync_every=1", f"output_dir={tmp_path / 'run'}", *more], console=console
    )
    return trainer


def test_a_clean_reference_sync_is_proven_every_step(fast, tmp_path):
    trainer = _run(fast, tmp_path)
    trainer.train()
    rows = metric_rows(trainer.out)
    synced = [r for r in rows if "sync/checks" in r]
    assert [r["step"] for r in synced] == [1, 2]
    assert all(r["sync/checks"] == 1 and r["sync/breaches"] == 0 and r["sync/tensors"] > 0 for r in synced)
    assert not (trainer.out / "watch.jsonl").exists()


def test_a_dropped_tensor_stops_the_run_naming_step_tensor_and_layer(fast, tmp_path, monkeypatch):
    _drop_one(monkeypatch)
    out = io.StringIO()
    trainer = _run(fast, tmp_path, console=Console(file=out, width=400))
    with pytest.raises(SyncBreach) as caught:
        trainer.train()
    line = str(caught.value)
    assert line.startswith(f"sync truth check at step 1: reference, weights of version 1: {DROPPED} (layer 1): ")
    assert "check.on_sync_breach: stop" in line
    assert f"sync truth check at step 1: reference, weights of version 1: {DROPPED}" in out.getvalue()
    rows = metric_rows(trainer.out)  # step 0: the evaluation before the first step
    assert rows[-1]["step"] == 1 and rows[-1]["sync/breaches"] == 1  # the step is logged before the run stops
    [alert] = [json.loads(x) for x in (trainer.out / "watch.jsonl").read_text().splitlines()]
    assert alert["kind"] == "sync truth" and alert["level"] == "alert" and DROPPED in alert["message"]
    report = write_run_report([trainer.out], tmp_path / "report.html").read_text()
    assert "sync truth" in report and DROPPED in report


def test_warn_goes_on_and_off_sees_nothing(fast, tmp_path, monkeypatch):
    _drop_one(monkeypatch)
    warned = _run(fast, tmp_path / "warn", "check.on_sync_breach=warn")
    warned.train()
    assert [r["sync/breaches"] for r in metric_rows(warned.out) if r["step"]] == [1, 1]
    alerts = [json.loads(x) for x in (warned.out / "watch.jsonl").read_text().splitlines()]
    assert [(a["step"], a["level"]) for a in alerts] == [(1, "warning"), (2, "warning")]

    off = _run(fast, tmp_path / "off", "check.sync=false")
    off.train()
    assert not any(k.startswith("sync/") for r in metric_rows(off.out) for k in r)


@pytest.mark.slow
@pytest.mark.parametrize("preset", presets.rl_names())
def test_no_false_alarm_on_any_preset(preset, fast, prompt_files, tmp_path):
    """Every RL preset, two steps, with everything the local backend moves switched on: the sampling copy
    (rollout.max_staleness: 1; not ReMax, which refuses it) and, where there is a reference, its sync
    every step. Each step's syncs are
    checked and none is a breach (the check stops the run at the first)."""
    from test_rl_presets import EXTRA, PARTIAL_CREDIT, _config, _unlabelled

    sampling_copy = preset != "remax"  # ReMax's greedy baselines are sampled within the step: nothing ahead
    extra = [*EXTRA.get(preset, []), *(["rollout.max_staleness=1"] if sampling_copy else [])]
    if preset == "ttrl":
        extra.append(f"data.train={_unlabelled(prompt_files[0], tmp_path / 'unlabelled.jsonl')}")
    else:
        extra.append(f"reward.sources={PARTIAL_CREDIT}")
    uses_reference = _config(preset).algo.kl.placement != "none"
    if uses_reference:
        extra.append("algo.kl.ref_sync_every=1")
    trainer = preset_trainer(preset, [*fast, *extra])
    trainer.train()
    rows = [r for r in metric_rows(trainer.out) if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    synced = [{k: v for k, v in r.items() if k.startswith("sync/")} for r in rows]
    expected = sampling_copy + uses_reference  # ReMax: nothing moves (no reference, no copy): nothing to check
    # each step: the copy that sampled its round(s) (dynamic sampling may take more), and the reference's mix
    if not expected:
        assert synced == [{}, {}]
        return
    assert all(r.get("sync/breaches") == 0 for r in synced), synced
    assert all(r["sync/checks"] >= expected for r in synced), synced
    if preset != "dapo":
        assert all(r["sync/checks"] == expected for r in synced), synced
    assert not (trainer.out / "watch.jsonl").exists()
