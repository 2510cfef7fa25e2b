"""The multi-rank tests' join (tests/workers/spawned.py): ranks that never finish fail the test
with each rank's stack, a rank's exception fails it as mp.spawn raises it, finished ranks pass."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from spawned import spawn_ranks
from torch.multiprocessing import ProcessRaisedException


def _waits_forever_on_rank_1(rank: int, out: str) -> None:
    Path(out, f"started{rank}").touch()
    while rank == 1:
        time.sleep(0.1)


def _raises(rank: int, out: str) -> None:
    raise ValueError(f"rank {rank} failed on purpose")


def _finishes(rank: int, out: str) -> None:
    Path(out, f"done{rank}").touch()


def test_a_rank_that_never_finishes_fails_with_its_stack(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failure:
        spawn_ranks(_waits_forever_on_rank_1, (str(tmp_path),), 2, tmp_path, hang_s=20)
    message = str(failure.value)
    assert "the ranks still run after 20 s" in message
    rank0, rank1 = message.split("--- rank 0 ---")[1].split("--- rank 1 ---")
    assert rank0.strip() == "(finished)"
    assert "in _waits_forever_on_rank_1" in rank1  # faulthandler's 'File "…", line N in <function>'
    assert (tmp_path / "started0").exists() and (tmp_path / "started1").exists()


def test_a_rank_that_raises_fails_with_its_error(tmp_path):
    with pytest.raises(ProcessRaisedException, match="failed on purpose"):
        spawn_ranks(_raises, (str(tmp_path),), 2, tmp_path)


def test_ranks_that_finish_return(tmp_path):
    spawn_ranks(_finishes, (str(tmp_path),), 2, tmp_path)
    assert (tmp_path / "done0").exists() and (tmp_path / "done1").exists()
