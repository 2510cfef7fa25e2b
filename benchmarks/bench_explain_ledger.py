"""`glassrl explain --ledger` against the response length (issue 37 item 5).

    .venv/bin/python benchmarks/bench_explain_ledger.py
    .venv/bin/python benchmarks/bench_explain_ledger.py --lengths 1000 5000 32000 200000

Setting: one multi-turn response of T tokens with every column a ledger can hold (log-probs,
reference log-probs, KL, scores, rewards, values, TD errors, advantages, returns, whitened
advantages, token ids, and an asynchronous run's version, staleness, log μ, weight and keep; a
turn every 10 tokens): the widest table explain prints. For each T it prints

- ``read + render``: ``read_jsonl`` and the text table with its legend, in this process (best
  of ``--repeats``), and its ratio to the first T's: linear work keeps the per-token time flat;
- ``command``: ``glassrl explain --ledger FILE`` as a user runs it, its stdout a pipe, once
  (start-up included: about 0.3 s now that showing a ledger imports neither torch nor
  transformers; it took 4–20 s on the 2-core machine of BENCHMARKS.md, by its load).

Before the text table (rich's Table, about 2 ms a row, and the whole output built before it was
written) the issue measured 98 s for 5 k tokens and 327 s for 10 k; 200 k did not finish.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from glassrl.commands.explain import legend
from glassrl.ledger import Ledger, LedgerTurn, ResponseLedger, TokenRow, read_jsonl
from glassrl.ledger.render import to_text


def write_ledger(T: int, path: Path) -> None:
    tokens = tuple(
        TokenRow(
            *(i, 1000 + i, f"w{i % 97:02d}", -0.5, -0.25, 0.01, float(i == T - 1), 0.0, 0.5, 0.1, 0.2, 0.3, 0.4),
            *(i % 10 != 9, None),
            role="generated" if i % 10 != 9 else "observation",
            turn=i // 10,
            policy_version=7,
            staleness=1,
            rollout_logprobs=-0.75,
            is_weights=1.0625,
            is_keep=True,
        )
        for i in range(T)
    )
    turns = tuple(LedgerTurn(k * 10, k * 10 + 9, k * 10 + 10, "tool_call") for k in range(T // 10))
    response = ResponseLedger("p", "".join(t.token for t in tokens), 1.0, 0, T, "stop", None, tokens, turns=turns)
    Ledger("gae", 1.0, 0.95, 0.1, "k1", responses=(response,), step=1).to_jsonl(path)


def in_process(path: Path, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        ledger = read_jsonl(path)
        lines = to_text(ledger) + legend(ledger, "0", None)
        assert len(lines) > ledger.responses[0].length
        best = min(best, time.perf_counter() - start)
    return best


def command(path: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "glassrl.cli", "explain", "--ledger", str(path)],
        check=True,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 5000, 32000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print(f"{'T':>8} {'read + render s':>16} {'ratio':>7} {'per 1k tokens s':>16} {'command s':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        first = None
        for T in args.lengths:
            path = Path(tmp) / f"step_{T}.jsonl"
            write_ledger(T, path)
            seconds = in_process(path, args.repeats)
            first = first or seconds
            print(f"{T:>8} {seconds:>16.3f} {seconds / first:>7.1f} {seconds / T * 1000:>16.4f} {command(path):>10.2f}")


if __name__ == "__main__":
    main()
