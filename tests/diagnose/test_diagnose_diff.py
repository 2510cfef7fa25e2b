"""glassrl diff on hand-made run directories: the first divergence named to the token, the phase
order inside a step, tolerances, runs of different lengths, checkpoints tensor by tensor, errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from glassrl.cli import main
from glassrl.diagnose.checkpoint_diff import read_safetensors
from glassrl.diagnose.diff import diff_runs
from glassrl.errors import GlassrlError
from glassrl.ledger import RESPONSE_FIELDS, TOKEN_FIELDS
from handmade_runs import ledger as _ledger
from handmade_runs import run as _run


def test_same_runs_do_not_differ(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    assert main(["diff", str(a), str(b)]) == 0
    read = "steps 0–3: 4 metric rows, 3 ledgers, 3 checkpoints (6 tensors)"
    assert capsys.readouterr().out.splitlines() == [
        "no difference in metrics, ledgers or checkpoints",
        f"compared {a} ({read}) with {b} ({read})",
        "not compared, measurements of the machine: perf/… 0/4 differ",
    ]


def test_the_first_divergence_is_named_to_the_token(tmp_path, capsys):
    a = _run(tmp_path / "a")
    # later differences (step 3) and a later token of the same step do not hide the first one
    b = _run(tmp_path / "b", dtype="bfloat16", change={2: {(1, 3): -1.203, (2, 0): -9.0}, 3: {(0, 0): -2.0}})
    result = diff_runs(a, b)
    assert result.config == [("model.compute_dtype", "float32", "bfloat16")]
    assert result.first.line() == "step 2, phase 3, response 1, token 3 ('等于'): logprobs -1.25 vs -1.203"
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "configs differ in 1 key(s):",
        "  model.compute_dtype: 'float32' vs 'bfloat16'",
        "first divergence: step 2, phase 3, response 1, token 3 ('等于'): logprobs -1.25 vs -1.203; "
        "the configs differ in model.compute_dtype",
    ]
    # how it grows: one line per step from the first divergence on; each response's fields and its
    # 5 tokens' fields are compared (index and the response's own index aside)
    n = 3 * (len(RESPONSE_FIELDS) - 1 + 5 * (len(TOKEN_FIELDS) - 1))
    assert out[3:6] == [
        "after it:",
        f"  step 2: ledger values 2/{n} differ, metrics 0/2 differ, tensors 0/2 differ, max |Δ| 7.75 (logprobs)",
        f"  step 3: ledger values 1/{n} differ, metrics 0/2 differ, tensors 0/2 differ, max |Δ| 0.75 (logprobs)",
    ]


def test_digits_enough_to_tell_two_numbers_apart(tmp_path):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", change={1: {(0, 1): -1.2500001}})
    assert diff_runs(a, b).first.line() == "step 1, phase 3, response 0, token 1 ('加'): logprobs -1.25 vs -1.2500001"


def test_tolerances(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", change={1: {(0, 1): -1.2500001}})
    assert not diff_runs(a, b, atol=1e-6).differs
    assert not diff_runs(a, b, rtol=1e-6).differs
    assert diff_runs(a, b, rtol=1e-9).differs
    assert main(["diff", str(a), str(b), "--atol", "1e-6"]) == 0
    assert main(["diff", str(a), str(b), "--rtol=-1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "glassrl diff: error: --atol/--rtol: expected finite numbers >= 0, got 0.0 and -1.0"
    )


def test_inside_a_step_the_earlier_phase_comes_first(tmp_path):
    # the metric actor/loss (phase 6) differs beside a logprob (phase 3) of a later response: the logprob is first
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", change={"metric": (1, "actor/loss", 0.5), 1: {(2, 4): -1.0}})
    assert diff_runs(a, b).first.line() == "step 1, phase 3, response 2, token 4 ('7'): logprobs -1.25 vs -1"
    # a reward metric (phase 2) comes before it
    c = _run(tmp_path / "c", change={"metric": (1, "reward/mean", 0.75), 1: {(2, 4): -1.0}})
    assert diff_runs(a, c).first.line() == "step 1, phase 2, metric reward/mean: 0.5 vs 0.75"


def test_checkpoints_are_compared_tensor_by_tensor(tmp_path):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", change={"tensor": (2, 0.5)})
    assert diff_runs(a, b).first.line() == "step 2, phase 6, checkpoint actor/model.safetensors w[1, 2]: 0 vs 0.5"
    # bfloat16 read without torch, widened by its bits
    w = read_safetensors(b / "checkpoints" / "step_00000002" / "actor" / "model.safetensors")["w"]
    assert w.dtype == np.float32 and w[1, 2] == 0.5 and w.sum() == 0.5


def test_runs_of_different_lengths(tmp_path, capsys):
    a, b = _run(tmp_path / "a", steps=3), _run(tmp_path / "b", steps=2)
    result = diff_runs(a, b)
    assert result.differs
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "first divergence: step 3, phase 7, metrics row: present vs missing",
        "after it:",
        f"  step 3: metrics row only in {a}, ledger only in {a}, checkpoint only in {a}",
    ]
    assert out[3] == f"{a} logged steps 0–3; {b} logged steps 0–2"
    assert out[4].endswith("(steps 0–2: 3 metric rows, 2 ledgers, 2 checkpoints (4 tensors))")


def test_response_fields_follow_the_tokens_of_their_phase(tmp_path):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b")
    path = b / "ledgers" / "step_000001.jsonl"
    ledger = _ledger(1)
    changed = replace(
        ledger.responses[1],
        finish_reason="length",
        tokens=(replace(ledger.responses[1].tokens[0], token_id=7), *ledger.responses[1].tokens[1:]),
    )
    replace(ledger, responses=(ledger.responses[0], changed, ledger.responses[2])).to_jsonl(path)
    assert diff_runs(a, b).first.line() == "step 1, phase 1, response 1, token 0 ('3'): token_id 100 vs 7"


def test_not_a_run_is_one_line(tmp_path, capsys):
    a = _run(tmp_path / "a")
    (tmp_path / "empty").mkdir()
    assert main(["diff", str(a), str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.startswith(
        f"glassrl diff: error: run directory {tmp_path / 'empty'}: missing config.yaml"
    )
    with pytest.raises(GlassrlError, match="not a directory"):
        diff_runs(a, tmp_path / "nowhere")


def test_the_report_of_two_runs_shows_their_first_divergence(tmp_path, capsys):
    from glassrl.cli import main

    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", change={2: {(1, 3): -1.203}})
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert '<a href="#divergence">first divergence</a>' in page
    assert "first divergence: step 2, phase 3, response 1, token 3 (&#x27;等于&#x27;): logprobs -1.25 vs -1.203" in page
    assert main(["report", str(a), "--out", str(tmp_path / "one.html")]) == 0
    assert 'id="divergence"' not in (tmp_path / "one.html").read_text(encoding="utf-8")


def test_every_ledger_column_has_a_phase():
    from glassrl.diagnose.diff import _COLUMN_PHASE
    from glassrl.ledger import RUN_FIELDS

    columns = {*RUN_FIELDS, *RESPONSE_FIELDS, *TOKEN_FIELDS} - {"step", "response_index", "index"}
    assert columns <= _COLUMN_PHASE.keys()
