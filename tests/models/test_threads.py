"""Thread choice: free cores from the load, the environment variables first, bad values as one error line."""

from __future__ import annotations

import pytest
import torch

from glassrl.errors import GlassrlError
from glassrl.models import threads


@pytest.mark.parametrize(
    ("cores", "load", "own", "free"),
    [
        (2, 0.1, 0.0, 2),  # idle machine: every core
        (2, 1.0, 0.0, 1),  # another process keeps one core busy
        (2, 1.6, 0.0, 1),  # 0.4 of a core left rounds to none, but at least 1
        (2, 6.0, 0.0, 1),  # 8 helpers on 2 cores
        (2, 2.0, 2.0, 2),  # the load is this process's own: all free
        (8, 2.6, 0.5, 6),  # 8 − 2.1 = 5.9 → 6
        (4, 1.5, 0.0, 3),  # 2.5 rounds half up
    ],
)
def test_free_cores_table(cores, load, own, free):
    assert threads.free_cores(cores, load, own) == free


def test_environment_variables_win(monkeypatch):
    assert threads.choose_threads({"GLASSRL_THREADS": "3", "OMP_NUM_THREADS": "1"}) == (3, "GLASSRL_THREADS=3")
    assert threads.choose_threads({"OMP_NUM_THREADS": "1"}) == (1, "OMP_NUM_THREADS=1")
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.2, 0.0, 0.0))
    monkeypatch.setattr(threads, "own_load", lambda: 0.2)
    n, why = threads.choose_threads({"GLASSRL_THREADS": " "})
    assert n == 2 and why == "4 usable cores, load average 2.20 (0.20 of it this process's)"


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_bad_values_are_one_error_line(value):
    with pytest.raises(GlassrlError, match=f"GLASSRL_THREADS={value!r}"):
        threads.choose_threads({"GLASSRL_THREADS": value})


def test_set_threads_applies_the_choice():
    before = torch.get_num_threads()
    try:
        assert threads.set_threads({"GLASSRL_THREADS": "1"})[0] == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_usable_cores_and_own_load_are_sane():
    assert 1 <= threads.usable_cores() <= (threads.os.cpu_count() or 1)
    assert threads.own_load() >= 0.0
