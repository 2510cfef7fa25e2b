"""Metric sinks: JSONL rows and resume truncation, TensorBoard scalars, console line, fan-out."""

from __future__ import annotations

import io
import json

import pytest

from glassrl.report.sinks import ConsoleSink, JsonlSink, MetricSinks, TensorBoardSink

ROWS = {
    1: {"reward/mean": 0.25, "kl/mean": float("nan"), "reward/failures/timeout": 2},
    2: {"reward/mean": 0.5, "kl/mean": float("inf"), "reward/failures/timeout": 0},
    3: {"reward/mean": 0.75, "kl/mean": 0.125, "reward/failures/timeout": 1},
    4: {"reward/mean": 1.0, "kl/mean": -float("inf"), "reward/failures/timeout": 0},
}


def test_jsonl_rows_with_null_for_non_finite(tmp_path):
    sink = JsonlSink(tmp_path / "run" / "metrics.jsonl")
    sink.log(1, ROWS[1])
    # Flushed per line: readable while the sink is still open (a killed run keeps it).
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == (
        '{"step": 1, "reward/mean": 0.25, "kl/mean": null, "reward/failures/timeout": 2}\n'
    )
    sink.log(2, ROWS[2])
    sink.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1] == {"step": 2, "reward/mean": 0.5, "kl/mean": None, "reward/failures/timeout": 0}
    with pytest.raises(ValueError, match="'step'"):
        JsonlSink(tmp_path / "x.jsonl").log(1, {"step": 3.0})


def test_jsonl_resume_matches_a_straight_run(tmp_path):
    straight = JsonlSink(tmp_path / "straight.jsonl")
    for step in (1, 2, 3, 4):
        straight.log(step, ROWS[step])
    straight.close()

    killed = JsonlSink(tmp_path / "resumed.jsonl")
    for step in (1, 2, 3):
        killed.log(step, ROWS[step])
    killed._file.write('{"step": 4, "reward/me')  # the kill cut the last line short
    killed.close()
    resumed = JsonlSink(tmp_path / "resumed.jsonl")  # resumed from the checkpoint of step 2
    resumed.truncate_after(2)
    assert [json.loads(x)["step"] for x in (tmp_path / "resumed.jsonl").read_text().splitlines()] == [1, 2]
    for step in (3, 4):
        resumed.log(step, ROWS[step])
    resumed.close()
    assert (tmp_path / "resumed.jsonl").read_bytes() == (tmp_path / "straight.jsonl").read_bytes()


def _scalars(log_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return None
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_scalars_skip_non_finite_and_purge_on_resume(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    for step in (1, 2, 3):
        sink.log(step, ROWS[step])
    sink.close()
    assert _scalars(tmp_path / "tb", "reward/mean") == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert _scalars(tmp_path / "tb", "kl/mean") == [(3, 0.125)]  # NaN and inf skipped

    resumed = TensorBoardSink(tmp_path / "tb", purge_step=3)  # resumed from step 2
    resumed.log(3, {"reward/mean": 0.0625})
    resumed.close()
    assert _scalars(tmp_path / "tb", "reward/mean") == [(1, 0.25), (2, 0.5), (3, 0.0625)]


def test_console_line_and_progress():
    from rich.console import Console

    out = io.StringIO()
    sink = ConsoleSink(
        total_steps=4,
        keys_to_show=["reward/mean", "kl/mean", "absent/key"],
        console=Console(file=out, width=200, force_terminal=False),
    )
    assert sink.format_line(3, ROWS[3]) == "step 3/4  reward/mean 0.75  kl/mean 0.125"
    assert sink.format_line(1, {"kl/mean": 1 / 3}) == "step 1/4  kl/mean 0.3333"
    sink.log(1, ROWS[1])
    sink.log(2, ROWS[2])
    sink.close()
    text = out.getvalue()
    assert "step 1/4  reward/mean 0.25  kl/mean nan" in text and "step 2/4  reward/mean 0.5  kl/mean inf" in text
    assert sink._progress.tasks[0].completed == 2


class _Recorder:
    def __init__(self):
        self.calls = []

    def log(self, step, metrics):
        self.calls.append((step, dict(metrics)))

    def close(self):
        self.calls.append("closed")


def test_metric_sinks_fan_out():
    a, b = _Recorder(), _Recorder()
    sinks = MetricSinks([a, b])
    sinks.log(5, {"x": 1.0})
    sinks.close()
    assert a.calls == b.calls == [(5, {"x": 1.0}), "closed"]
