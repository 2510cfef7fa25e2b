"""``glassrl explain --ledger`` on what a run wrote: the whole table to a pipe or a file (issue 44
item 7), a 32 k-token response in one pass (issue 37 item 5), a preference ledger named as one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from glassrl.cli import main
from glassrl.ledger import read_jsonl

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def off_policy_ledger(T: int, path: Path) -> Path:
    """One multi-turn response of ``T`` tokens with every column a ledger can have (off-policy ones
    included): the widest table explain prints (the benchmark's ledger)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from bench_explain_ledger import write_ledger
    finally:
        sys.path.remove(str(BENCHMARKS))
    write_ledger(T, path)
    return path


def _explain(path: Path, timeout: float = 120) -> list[str]:
    """``glassrl explain --ledger PATH`` in a subprocess, its stdout a pipe."""
    done = subprocess.run(
        [sys.executable, "-m", "glassrl.cli", "explain", "--ledger", str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_pipe_gets_every_column_whole(tmp_path):
    lines = _explain(off_policy_ledger(20, tmp_path / "step.jsonl"))
    header = next(line for line in lines if line.lstrip().startswith("turn"))
    # the version column and each value in full: rich cut the table to 160 columns ("…")
    assert " v " in header and "lag" in header and "log μ(a_i|s_i)" in header and "role" in header
    assert not any("…" in line for line in lines[lines.index(header) : lines.index(header) + 22])
    row = lines[lines.index(header) + 2].split()
    assert (
        row[:4] == ["0", "0", "1000", "w00"]
        and row[4:9] == ["-0.5000", "-0.2500", "7", "1", "-0.7500"]
        and row[-1] == "gen"
    )
    assert "1.0625" in row
    assert len(header) > 160


def test_out_file_gets_every_column_whole(tmp_path):
    out = tmp_path / "table.txt"
    assert main(["explain", "--ledger", str(off_policy_ledger(20, tmp_path / "step.jsonl")), "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.endswith((" gen", " obs"))]  # the turns' lines say "19…19"
    assert len(rows) == 20 and all("1.0625" in row and "…" not in row for row in rows) and "\x1b[" not in text


def test_a_32k_token_response_is_shown(tmp_path):
    """Every token row of a 32 k-token response (rich's table took about 2 ms a row: over a minute;
    the timeout here is generous, the time is benchmarks/bench_explain_ledger.py's)."""
    T = 32_000
    lines = _explain(off_policy_ledger(T, tmp_path / "long.jsonl"), timeout=300)
    rows = [line for line in lines if line.endswith((" gen", " obs"))]
    assert len(rows) == T
    assert rows[-1].split()[:4] == [str((T - 1) // 10), str(T - 1), str(1000 + T - 1), f"w{(T - 1) % 97:02d}"]


def test_a_preference_ledger_is_named_with_the_command_that_explains_it(tmp_path, capsys):
    path = tmp_path / "preference.jsonl"
    path.write_text(json.dumps({"loss": "sigmoid", "prompt": "p", "chosen": {}, "rejected": {}}) + "\n")
    assert main(["explain", "--ledger", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"glassrl explain: error: {path}:1: a preference ledger (glassrl dpo's held-out pairs)")
    assert "glassrl explain --model RUN_DIR --prompt … --chosen … --rejected …" in err and "\n" not in err


def test_a_ledger_reads_back_exactly(tmp_path):
    path = off_policy_ledger(30, tmp_path / "step.jsonl")
    ledger = read_jsonl(path)
    ledger.to_jsonl(tmp_path / "again.jsonl")
    assert read_jsonl(tmp_path / "again.jsonl") == ledger and ledger.responses[0].tokens[29].is_weights == 1.0625


def test_showing_a_ledger_loads_neither_torch_nor_transformers(tmp_path):
    """Their imports took seconds before the first row (the flags of --model were read from the
    module that loads them)."""
    path = off_policy_ledger(10, tmp_path / "step.jsonl")
    code = (
        "import sys; from glassrl.cli import main; "
        f"assert main(['explain', '--ledger', {str(path)!r}, '--out', {str(tmp_path / 'out.txt')!r}]) == 0; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done
