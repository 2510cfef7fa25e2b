"""Crafted and garbled run files under ``glassrl diff`` and ``glassrl explain --ledger`` (issue 37
item 6, issue 45 item 5): each is one GlassrlError line naming the file and the field (exit 2),
never a traceback, never a value accepted in silence, and never a read of more than the file holds."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import assert_one_error_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from handmade_runs import run as _run  # noqa: E402

sys.path.pop(0)

WEIGHTS = "checkpoints/step_00000002/actor/model.safetensors"
LEDGER = "ledgers/step_000002.jsonl"


def _safetensors(header: object, data: bytes = b"", claimed: int | None = None) -> bytes:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(text) if claimed is None else claimed) + text + data


def _weights(run: Path, content: bytes) -> None:
    (run / WEIGHTS).write_bytes(content)


def _ledger_row(run: Path, line: int, change: Callable[[dict], object]) -> None:
    """Replace row ``line`` (1-based) of the step-2 ledger by ``change(row)`` (a dict, or raw text)."""
    path = run / LEDGER
    rows = path.read_text(encoding="utf-8").splitlines()
    new = change(json.loads(rows[line - 1]))
    rows[line - 1] = new if isinstance(new, str) else json.dumps(new)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def _set(**fields) -> Callable[[dict], dict]:
    return lambda row: {**row, **fields}


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
# name -> (what it does to run b, the error it must give)
CRAFTED: dict[str, tuple[Callable[[Path], None], str]] = {
    "safetensors-header-claims-10^12-bytes": (
        lambda run: _weights(run, _safetensors({"w": F32}, b"\0" * 8, claimed=10**12)),
        r"model\.safetensors: not a safetensors file \(its header claims 1000000000000 bytes; the file holds \d+",
    ),
    "safetensors-offsets-past-the-file": (
        lambda run: _weights(run, _safetensors({"w": {**F32, "data_offsets": [0, 10**9]}}, b"\0" * 8)),
        r"tensor 'w': data_offsets \[0, 1000000000\]: expected \[begin, end\] within the file's 8 data bytes",
    ),
    "safetensors-no-dtype": (
        lambda run: _weights(run, _safetensors({"w": {"shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)),
        r"tensor 'w': no dtype; glassrl diff reads F64, F32",
    ),
    "safetensors-unknown-dtype": (
        lambda run: _weights(run, _safetensors({"w": {**F32, "dtype": "Q4"}}, b"\0" * 8)),
        r"tensor 'w': dtype 'Q4'",
    ),
    "safetensors-list-header": (
        lambda run: _weights(run, _safetensors([1, 2, 3])),
        r"not a safetensors file \(its header is a list, not an object\)",
    ),
    "safetensors-shape-not-its-span": (
        lambda run: _weights(run, _safetensors({"w": {**F32, "shape": [3]}}, b"\0" * 8)),
        r"tensor 'w': shape \[3\] of F32 takes 12 bytes, its data_offsets span 8",
    ),
    "safetensors-header-nested-10^5-deep": (
        lambda run: _weights(run, _safetensors(b"[" * 100_000 + b"]" * 100_000)),
        r"its header is not JSON: nested deeper than 64 levels",
    ),
    "safetensors-shorter-than-8-bytes": (
        lambda run: _weights(run, b"\1\2\3"),
        r"not a safetensors file \(3 bytes, shorter than its 8-byte header length\)",
    ),
    "checkpoint-json-nested-10^5-deep": (
        lambda run: (run / "checkpoints/step_00000002/counters.json").write_text("[" * 100_000 + "]" * 100_000),
        r"counters\.json: not valid JSON \(nested deeper than 64 levels\)",
    ),
    "metrics-nested-10^5-deep": (
        lambda run: (run / "metrics.jsonl").write_text('{"step": 0, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
        r"metrics\.jsonl:1: nested deeper than 64 levels",
    ),
    "metric-10^400": (
        lambda run: (run / "metrics.jsonl").write_text('{"step": 0, "reward/mean": 1' + "0" * 400 + "}\n"),
        r"metrics\.jsonl:1: reward/mean: an integer of 401 digits, beyond a float's range",
    ),
    "metric-step-not-an-integer": (
        lambda run: (run / "metrics.jsonl").write_text('{"step": NaN, "reward/mean": 1}\n'),
        r"metrics\.jsonl:1: expected an object with an integer 'step'",
    ),
    "config-yaml-tag": (
        lambda run: (run / "config.yaml").write_text("seed: !!python/object/apply:os.system ['echo hi']\n"),
        r"/b: its config is not valid YAML: .*python/object/apply:os\.system",
    ),
    "ledger-step-nan": (
        lambda run: _ledger_row(run, 1, _set(step=float("nan"))),
        rf"{LEDGER}:1: field 'step': expected an integer or null, got NaN",
    ),
    "ledger-response-index-object": (
        lambda run: _ledger_row(run, 1, _set(response_index={})),
        rf"{LEDGER}:1: field 'response_index': expected an integer, got an object {{}}",
    ),
    "ledger-token-a-number": (
        lambda run: _ledger_row(run, 2, _set(token=5)),
        rf"{LEDGER}:2: field 'token': expected a string, got 5",
    ),
    "ledger-length-a-string": (
        lambda run: _ledger_row(run, 1, _set(length="5")),
        rf"{LEDGER}:1: field 'length': expected an integer, got '5'",
    ),
    "ledger-turns-a-string": (
        lambda run: _ledger_row(run, 1, _set(turns="xyz")),
        rf"{LEDGER}:1: field 'turns': expected a list of turns or null, got 'xyz'",
    ),
    "ledger-turn-past-the-response": (
        lambda run: _ledger_row(
            run, 1, _set(turns=[{"start": 0, "end": 5, "observation_end": 99, "finish_reason": "stop"}])
        ),
        r"response 0: turn 0 ends at 99, past its 5 tokens",
    ),
    "ledger-logprob-10^400": (
        lambda run: _ledger_row(
            run, 2, lambda row: json.dumps(row).replace('"logprobs": -1.25', '"logprobs": 1' + "0" * 400)
        ),
        rf"{LEDGER}:2: field 'logprobs': an integer of 401 digits is beyond a float's range",
    ),
    "ledger-mask-a-number": (
        lambda run: _ledger_row(run, 2, _set(response_mask=1)),
        rf"{LEDGER}:2: field 'response_mask': expected true or false, got 1",
    ),
    "ledger-role-unknown": (
        lambda run: _ledger_row(run, 2, _set(role="narrator")),
        rf"{LEDGER}:2: field 'role': expected one of generated, observation or null, got 'narrator'",
    ),
    "ledger-index-out-of-order": (
        lambda run: _ledger_row(run, 3, _set(index=7)),
        rf"{LEDGER}:3: field 'index': expected 1 \(tokens in order\)",
    ),
    "ledger-nested-10^5-deep": (
        lambda run: _ledger_row(run, 2, lambda row: '{"kind": "token", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        rf"{LEDGER}:2: nested deeper than 64 levels",
    ),
}


@pytest.mark.parametrize("name", list(CRAFTED))
def test_diff_of_a_crafted_run_file_is_one_line(name, tmp_path, capsys):
    craft, message = CRAFTED[name]
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    craft(b)
    assert_one_error_line(capsys, ["diff", a, b], message)


@pytest.mark.parametrize("name", [n for n in CRAFTED if n.startswith("ledger-")])
def test_explain_of_a_crafted_ledger_is_one_line(name, tmp_path, capsys):
    craft, message = CRAFTED[name]
    run = _run(tmp_path / "b")
    craft(run)
    assert_one_error_line(capsys, ["explain", "--ledger", run / LEDGER], message)
