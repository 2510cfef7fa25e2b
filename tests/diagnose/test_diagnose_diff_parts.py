"""glassrl diff never says "no difference" about what it did not compare (issue 45 items 1–2): a
part present in one run and missing in the other is a difference (exit 1), one that cannot be read
is one line naming it (exit 2), and the measurements of the machine (tool-call seconds, perf/…)
are counted apart from the verdict."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from glassrl.cli import main
from glassrl.diagnose.diff import diff_runs
from glassrl.ledger import LedgerTurn
from handmade_runs import ledger as _ledger
from handmade_runs import run as _run

ROOT = Path(__file__).resolve().parents[2]
LEDGER_2 = "ledgers/step_000002.jsonl"


def _diff(capsys, a: Path, b: Path) -> tuple[int, list[str], list[str]]:
    capsys.readouterr()
    rc = main(["diff", str(a), str(b)])
    captured = capsys.readouterr()
    return rc, captured.out.splitlines(), captured.err.splitlines()


def test_deleted_ledgers_are_a_difference(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    shutil.rmtree(b / "ledgers")
    rc, out, _ = _diff(capsys, a, b)
    assert rc == 1
    assert out[0] == "first divergence: step 1, phase 7, ledger ledgers/step_000001.jsonl: present vs missing"
    assert f"  step 2: metrics 0/2 differ, tensors 0/2 differ, ledger only in {a}" in out
    assert out[-2].endswith(f"with {b} (steps 0–3: 4 metric rows, 0 ledgers, 3 checkpoints (6 tensors))")


def test_a_removed_checkpoint_is_a_difference(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    shutil.rmtree(b / "checkpoints" / "step_00000002")
    rc, out, _ = _diff(capsys, a, b)
    assert rc == 1
    assert out[0] == "first divergence: step 2, phase 7, checkpoint checkpoints/step_00000002: present vs missing"
    assert out[-2].endswith("(steps 0–3: 4 metric rows, 3 ledgers, 2 checkpoints (4 tensors))")
    # the other way round too, and a file missing inside a checkpoint
    assert _diff(capsys, b, a)[1][0].endswith("checkpoint checkpoints/step_00000002: missing vs present")
    c = _run(tmp_path / "c")
    (c / "checkpoints" / "step_00000003" / "counters.json").unlink()
    assert diff_runs(a, c).first.line() == "step 3, phase 6, checkpoint counters.json: present vs missing"


def _one_error(capsys, a: Path, b: Path, match: str) -> None:
    rc, out, err = _diff(capsys, a, b)
    assert rc == 2 and out == [] and len(err) == 1, (rc, out, err)
    assert err[0].startswith("glassrl diff: error: ") and re.search(match, err[0]), err[0]


def test_a_ledger_that_is_a_link_loop_is_one_line(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    (b / LEDGER_2).unlink()
    (b / LEDGER_2).symlink_to(b / LEDGER_2)
    _one_error(capsys, a, b, rf"{re.escape(str(b / LEDGER_2))}: cannot be read: a symbolic link loop")
    (b / LEDGER_2).unlink()
    (b / LEDGER_2).symlink_to(tmp_path / "nowhere")
    # a link to nothing: the ledger is missing, a difference named
    assert _diff(capsys, a, b)[0] == 1
    assert diff_runs(a, b).first.line() == f"step 2, phase 7, ledger {LEDGER_2}: present vs missing"


def test_a_fifo_is_refused_by_its_type_without_being_opened(tmp_path):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    for fifo in (b / LEDGER_2, b / "checkpoints" / "step_00000001" / "counters.json"):
        fifo.unlink()
        os.mkfifo(fifo)
        # a subprocess under a timeout: opening a FIFO without a writer would block for ever
        done = subprocess.run(
            [sys.executable, "-m", "glassrl.cli", "diff", str(a), str(b)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2 and done.stdout == "", done
        assert (
            done.stderr.strip()
            == f"glassrl diff: error: {fifo}: a FIFO, not a regular file: cannot be read as part of a run"
        )
        fifo.unlink()
        shutil.copy(a / fifo.relative_to(b), fifo)


def test_an_unreadable_ledger_is_one_line(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    if os.geteuid() != 0:
        (b / LEDGER_2).chmod(0)
        why = "Permission denied"
    else:  # root reads any file: a regular file whose read fails (EIO) instead
        (b / LEDGER_2).unlink()
        (b / LEDGER_2).symlink_to("/proc/self/mem")
        why = "Input/output error"
    _one_error(capsys, a, b, rf"step_000002\.jsonl: cannot be read: {why}")


def test_truncated_files_are_one_line(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    ledger = b / LEDGER_2
    ledger.write_bytes(ledger.read_bytes()[:-40])  # cut inside the last token row
    _one_error(capsys, a, b, r"step_000002\.jsonl:\d+: not valid JSON")
    shutil.copy(a / LEDGER_2, ledger)
    weights = b / "checkpoints" / "step_00000003" / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4])
    _one_error(
        capsys, a, b, r"model\.safetensors: tensor 'w': data_offsets \[12, 24\]: expected .* within the file's 20 data"
    )
    # a last metrics row cut short (a killed run) is a step the other run has and this one not
    shutil.copy(a / "checkpoints" / "step_00000003" / "actor" / "model.safetensors", weights)
    metrics = b / "metrics.jsonl"
    metrics.write_text(metrics.read_text().rstrip("\n")[:-5])
    assert _diff(capsys, a, b)[1][0] == "first divergence: step 3, phase 7, metrics row: present vs missing"


def test_a_file_the_manifest_lists_with_another_size_is_one_line(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    counters = b / "checkpoints" / "step_00000001" / "counters.json"
    manifest = counters.parent / "manifest.json"
    manifest.write_text(
        '{"parts": {"counters": {"kind": "json", "files": [{"path": "counters.json", "size": 99, "sha256": ""}]}}}'
    )
    _one_error(capsys, a, b, r"counters\.json: 11 bytes, its checkpoint's manifest\.json says 99 \(truncated")


def _with_tool_seconds(run: Path, seconds: float) -> None:
    """Every response of step 1 a turn with one tool call that took ``seconds``."""
    ledger = _ledger(1)
    call = {"name": "add", "arguments": {"a": 1}, "status": "ok", "seconds": seconds}
    turn = LedgerTurn(0, 5, 5, "stop", (call,), {})
    responses = tuple(replace(r, turns=(turn,)) for r in ledger.responses)
    replace(ledger, responses=responses).to_jsonl(run / "ledgers" / "step_000001.jsonl")


def test_tool_call_seconds_are_not_a_divergence(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "bb")  # perf/step_s differs too (the path's length)
    _with_tool_seconds(a, 0.0125)
    _with_tool_seconds(b, 0.5)
    rc, out, _ = _diff(capsys, a, b)
    assert rc == 0 and out[0] == "no difference in metrics, ledgers or checkpoints"
    assert out[-1] == "not compared, measurements of the machine: perf/… 4/4 differ, tool-call seconds 3/3 differ"
    # the rest of a tool call is an outcome
    c = _run(tmp_path / "c")
    _with_tool_seconds(c, 0.0125)
    ledger = c / "ledgers" / "step_000001.jsonl"
    ledger.write_text(ledger.read_text().replace('"status": "ok"', '"status": "timeout"', 1))
    assert diff_runs(a, c).first.line().startswith("step 1, phase 1, response 0: turns ")


def test_every_measurement_of_the_machine_is_classified():
    """Metric keys that time or name the machine are perf/…; a tool call's record keys likewise."""
    from glassrl.diagnose.diff import MEASURED, MEASURED_METRICS, MEASURED_TOOL_CALL

    timing = re.compile(r"(_s$|seconds|time(?!out)|duration|host|pid|per_s)")  # a timeout is an outcome
    keys = re.findall(r"^\| `([^`]+)`", (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8"), flags=re.M)
    assert keys and all(k.startswith(MEASURED_METRICS) for k in keys if timing.search(k)), keys
    tools = (ROOT / "src" / "glassrl" / "agents" / "tools.py").read_text(encoding="utf-8")
    (record,) = re.findall(r"record = \{(.*?)\}", tools)
    fields = re.findall(r'"(\w+)":', record)
    assert [f for f in fields if timing.search(f)] == [MEASURED_TOOL_CALL] and set(MEASURED) == {
        "perf/…",
        "tool-call seconds",
    }


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "-inf", "abc"])
def test_a_tolerance_that_is_not_a_finite_number_is_one_line(value, tmp_path, capsys):
    a = _run(tmp_path / "a")
    capsys.readouterr()
    assert main(["diff", str(a), str(a), f"--atol={value}"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and re.search(r"--atol.*: expected (a )?finite numbers? >= 0", err[0]), err
