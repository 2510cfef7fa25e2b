"""W&B and MLflow sinks in their offline modes (WANDB_MODE=offline; an MLflow file store in a tmp
dir), sample tables in every sink that shows them, and a run that logs to both trackers and
refreshes report.html as it goes. The extras come from `pip install -e '.[test,wandb,mlflow]'`;
without them the tracker tests skip, saying which package is missing."""

from __future__ import annotations

import json
import math
import struct
import sys
import time

import pytest

from glassrl.errors import GlassrlError
from glassrl.ledger import Ledger, ResponseLedger
from glassrl.report.sinks import (
    SAMPLE_COLUMNS,
    MetricSinks,
    MlflowSink,
    TensorBoardSink,
    WandbSink,
    markdown_table,
    sample_rows,
)

ROWS = [
    {"group_id": 0, "prompt": "1+1=?", "response": "2 | two", "score": 1.0, "length": 3, "finish_reason": "stop"},
    {"group_id": 0, "prompt": "1+1=?", "response": "3\nthree", "score": 0.0, "length": 16, "finish_reason": "length"},
]
CONFIG = {"seed": 0, "steps": 2, "algo": {"advantage": "grpo", "kl": {"coef": 0.001}}, "reward": {"sources": []}}


def test_sample_rows_are_the_ledgers_responses():
    responses = tuple(
        ResponseLedger(
            prompt=r["prompt"],
            response=r["response"],
            score=r["score"],
            group_id=r["group_id"],
            length=r["length"],
            finish_reason=r["finish_reason"],
            baseline_reward=None,
            tokens=(),
        )
        for r in ROWS
    )
    ledger = Ledger(estimator="grpo", gamma=1.0, lam=None, beta=0.0, kl_kind="k3", responses=responses, step=3)
    assert sample_rows(ledger) == ROWS
    assert tuple(ROWS[0]) == SAMPLE_COLUMNS


def test_markdown_table_escapes_bars_and_line_breaks():
    assert markdown_table(ROWS[:1] + [ROWS[1] | {"prompt": "a\\b"}]).splitlines() == [
        "| group_id | prompt | response | score | length | finish_reason |",
        "|---|---|---|---|---|---|",
        "| 0 | 1+1=? | 2 \\| two | 1.0 | 3 | stop |",
        "| 0 | a\\\\b | 3<br>three | 0.0 | 16 | length |",
    ]
    assert markdown_table([]) == "(no samples)"


def test_tensorboard_shows_samples_as_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path)
    sink.log_samples(4, ROWS)
    sink.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    (event,) = events.Tensors("samples/text_summary")
    assert event.step == 4 and event.tensor_proto.string_val[0].decode() == markdown_table(ROWS)


def test_metric_sinks_send_samples_to_the_sinks_that_show_tables():
    class Tables:
        def __init__(self):
            self.seen = []

        def log(self, step, metrics): ...

        def log_samples(self, step, rows):
            self.seen.append((step, rows))

        def close(self): ...

    class MetricsOnly:
        def log(self, step, metrics): ...

        def close(self): ...

    tables = Tables()
    MetricSinks([MetricsOnly(), tables]).log_samples(2, ROWS)
    assert tables.seen == [(2, ROWS)]


@pytest.mark.parametrize(("sink", "module", "extra"), [(WandbSink, "wandb", "wandb"), (MlflowSink, "mlflow", "mlflow")])
def test_a_missing_extra_is_one_line_naming_the_key_and_the_install(tmp_path, monkeypatch, sink, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as when it is not installed
    kwargs = {"project": "p"} if sink is WandbSink else {"experiment": "e"}
    with pytest.raises(GlassrlError, match=rf"^logging\.{extra} is on, but {module} is not installed: pip install "):
        sink(tmp_path, CONFIG, **kwargs)


# ---------------------------------------------------------------- W&B, offline


def _wandb_records(run_dir):
    """The protobuf records of the offline run file (run-ID.wandb): LevelDB's log format, 32 KiB
    blocks of chunks with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)
    after W&B's 7-byte file header."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, chunk, records = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = chunk + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
        elif kind == 0:
            break
    return records


def _wandb_written(run_dir, deadline_s: float = 120.0) -> None:
    """Wait until W&B's service has written the offline run through its exit record: ``finish()``
    returns before the service's writer has flushed the file (seen at load average ~10: a 7-byte
    file, then the whole run a moment later). A deadline, not a timing assertion."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if list((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
            records = _wandb_records(run_dir)
            if records and records[-1].WhichOneof("record_type") == "exit":
                return
        time.sleep(0.2)
    raise AssertionError(f"W&B wrote no complete offline run under {run_dir} within {deadline_s:g} s")


def _wandb_history(run_dir) -> list[dict]:
    """The history rows of the offline run: {key: value} with W&B's own _step."""
    rows = []
    for record in _wandb_records(run_dir):
        if record.history.item:
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.append({k: v for k, v in items.items() if k not in ("_timestamp", "_runtime")})
    return rows


def test_wandb_offline_logs_metrics_samples_and_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(tmp_path, CONFIG, project="glassrl-test", name="tiny")
    sink.log(1, {"reward/mean": 0.5, "kl/mean": math.nan, "response/count": 8})
    sink.log_samples(1, ROWS)
    sink.log(2, {"reward/mean": 0.75, "kl/mean": 0.01})
    sink.close()

    _wandb_written(tmp_path)
    records = _wandb_records(tmp_path)
    rows = _wandb_history(tmp_path)
    assert rows[0]["_step"] == 1 and rows[0]["reward/mean"] == 0.5 and rows[0]["response/count"] == 8
    assert "kl/mean" not in rows[0]  # NaN: a gap, as in TensorBoard
    assert rows[0]["samples/_type"] == "table-file" and rows[0]["samples/nrows"] == 2
    assert rows[1] == {"_step": 2, "reward/mean": 0.75, "kl/mean": 0.01}
    (table,) = (tmp_path / "wandb").glob("offline-run-*/files/media/table/samples_1_*.table.json")
    saved = json.loads(table.read_text())
    assert saved["columns"] == list(SAMPLE_COLUMNS) and saved["data"] == [list(r.values()) for r in ROWS]
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "tiny" and run.project == "glassrl-test"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["algo"] == CONFIG["algo"] and config["steps"] == 2
    # a resumed run logs to the same W&B run
    run_id = json.loads((tmp_path / "tracking.json").read_text())["wandb"]
    assert run.run_id == run_id
    resumed = WandbSink(tmp_path, CONFIG | {"steps": 3}, project="glassrl-test", resume=True)
    assert resumed._run.id == run_id
    resumed.close()


# ---------------------------------------------------------------- MLflow, file store


@pytest.fixture
def file_store(tmp_path, monkeypatch) -> str:
    pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[mlflow]'")
    # MLflow 3 keeps the file store for those who ask for it (a database is its default)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def test_mlflow_file_store_logs_metrics_samples_and_params(tmp_path, file_store):
    from mlflow import MlflowClient

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sink = MlflowSink(run_dir, CONFIG, experiment="glassrl-test", tracking_uri=file_store, name="tiny")
    sink.log(1, {"reward/mean": 0.5, "kl/mean": math.nan, "reward/math:v2/mean": 1.0})
    sink.log_samples(1, ROWS)
    sink.log(2, {"reward/mean": 0.75})
    sink.close()

    client = MlflowClient(file_store)
    run_id = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    run = client.get_run(run_id)
    assert run.info.run_name == "tiny" and run.info.status == "FINISHED"
    # a file store keeps a name as a path: "/" becomes "."; ":" is no character of a metric name
    assert sink.metric_name("reward/math:v2/mean") == "reward.math_v2.mean"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "reward.mean")] == [(1, 0.5), (2, 0.75)]
    assert client.get_metric_history(run_id, "kl.mean") == []  # NaN: a gap
    assert client.get_metric_history(run_id, "reward.math_v2.mean")[0].value == 1.0
    assert run.data.params == {"seed": "0", "steps": "2", "algo.advantage": "grpo", "algo.kl.coef": "0.001",
                               "reward.sources": "[]"}  # fmt: skip
    table = client.download_artifacts(run_id, "samples/step_000001.json", str(tmp_path))
    saved = json.loads(open(table, encoding="utf-8").read())
    assert saved["columns"] == list(SAMPLE_COLUMNS) and saved["data"] == [list(r.values()) for r in ROWS]
    # a resumed run logs to the same MLflow run; its params stay the first ones (MLflow cannot change one)
    resumed = MlflowSink(
        run_dir, CONFIG | {"steps": 3}, experiment="glassrl-test", tracking_uri=file_store, resume=True
    )
    resumed.log(3, {"reward/mean": 1.0})
    resumed.close()
    assert [m.step for m in client.get_metric_history(run_id, "reward.mean")] == [1, 2, 3]
    assert client.get_run(run_id).data.params["steps"] == "2"


def test_mlflow_refusing_to_start_is_one_line_naming_the_key(tmp_path, file_store, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    with pytest.raises(GlassrlError, match=r"^logging\.mlflow: MLflow could not start a run at file://.*file"):
        MlflowSink(tmp_path, CONFIG, experiment="glassrl-test", tracking_uri=file_store)


# ---------------------------------------------------------------- a run with both trackers


def test_a_run_logs_to_both_trackers_and_refreshes_its_report(
    tiny_model_dir, prompt_files, tmp_path, file_store, monkeypatch
):
    pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")
    from mlflow import MlflowClient

    import glassrl.rl.loop as loop
    from glassrl.report.run_dir import read_metrics
    from helpers import preset_trainer, tiny_run_overrides

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    written = []  # the steps metrics.jsonl held at each report.html written

    def write_run_report(runs, path, **kwargs):
        written.append([row["step"] for row in read_metrics(out / "metrics.jsonl")])
        return report(runs, path, **kwargs)

    report = loop.write_run_report
    monkeypatch.setattr(loop, "write_run_report", write_run_report)
    overrides = [
        *tiny_run_overrides(tiny_model_dir, prompt_files, out),
        "steps=3",
        "logging.wandb=true",
        f"logging.mlflow.tracking_uri={file_store}",
        "logging.report_every=1",
    ]
    preset_trainer("grpo", overrides).train()
    assert written == [[0, 1], [0, 1, 2], [0, 1, 2, 3]]  # steps 1 and 2 during the run, then the end
    assert (out / "report.html").is_file()

    ids = json.loads((out / "tracking.json").read_text())
    client = MlflowClient(file_store)
    logged = read_metrics(out / "metrics.jsonl")
    for key in ("reward/mean", "eval/accuracy", "eval/accuracy/en"):  # a name and a name under it
        history = client.get_metric_history(ids["mlflow"], key.replace("/", "."))
        assert history and [(m.step, m.value) for m in history] == [
            (r["step"], r[key]) for r in logged if r.get(key) is not None
        ]
    assert [a.path for a in client.list_artifacts(ids["mlflow"], "samples")] == [
        f"samples/step_{s:06d}.json" for s in (1, 2, 3)
    ]
    _wandb_written(out)
    wandb_steps = _wandb_history(out)
    assert {h["_step"] for h in wandb_steps if "reward/mean" in h} == {1, 2, 3}
    assert sum("samples/_type" in h for h in wandb_steps) == 3
