"""Thread choice: free cores from the load, then the environment variables, the config's count and a
resumed run's recorded count before them; bad values as one error line."""

from __future__ import annotations

import pytest
import torch

from glassrl.errors import GlassrlError
from glassrl.models import threads


@pytest.fixture
def machine(monkeypatch):
    """4 usable cores, load average 2.2, 0.2 of it this process's: auto chooses 2."""
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.2, 0.0, 0.0))
    monkeypatch.setattr(threads, "own_load", lambda: 0.2)


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


@pytest.mark.parametrize(
    ("setting", "recorded", "environ", "chosen", "why"),
    [
        ("auto", None, {}, 2, "auto: 4 usable cores, load average 2.20 (0.20 of it this process's) → 2 free"),
        ("auto", None, {"GLASSRL_THREADS": " "}, 2, "auto: 4 usable cores, load average 2.20"),  # blank: unset
        ("auto", None, {"GLASSRL_THREADS": "3", "OMP_NUM_THREADS": "1"}, 3, "auto: GLASSRL_THREADS=3"),
        ("auto", None, {"OMP_NUM_THREADS": "1"}, 1, "auto: OMP_NUM_THREADS=1"),
        ("auto", 1, {"GLASSRL_THREADS": "3"}, 1, "auto: recorded by the run in its checkpoint (auto would choose 3"),
        ("auto", 3, {}, 3, "auto: recorded by the run in its checkpoint (auto would choose 2 now)"),
        (1, None, {"GLASSRL_THREADS": "3"}, 1, "threads = 1"),  # the config's count before the environment
        (2, 2, {}, 2, "threads = 2"),
        (2, 1, {}, 2, "threads = 2; the run recorded 1: its numbers may differ"),
    ],
)
def test_choice_order(machine, setting, recorded, environ, chosen, why):
    n, text = threads.choose_threads(setting, recorded, environ)
    assert n == chosen and text.startswith(why)


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_bad_environment_values_are_one_error_line(value):
    with pytest.raises(GlassrlError, match=f"GLASSRL_THREADS={value!r}"):
        threads.choose_threads(environ={"GLASSRL_THREADS": value})


def test_set_threads_applies_the_choice_and_the_line_says_why():
    before = torch.get_num_threads()
    try:
        n, why = threads.set_threads(1, environ={})
        assert n == 1 and torch.get_num_threads() == 1
        assert threads.startup_line(n, why) == "threads: 1 (threads = 1)"
    finally:
        torch.set_num_threads(before)


def test_usable_cores_and_own_load_are_sane():
    assert 1 <= threads.usable_cores() <= (threads.os.cpu_count() or 1)
    assert threads.own_load() >= 0.0


@pytest.mark.parametrize(
    ("setting", "recorded", "environ", "why"),
    [
        (1_000_000, None, {}, "threads = 1000000; capped at the 4 usable cores"),
        ("auto", None, {"GLASSRL_THREADS": "64"}, "auto: GLASSRL_THREADS=64; capped at the 4 usable cores"),
        ("auto", None, {"OMP_NUM_THREADS": "5"}, "auto: OMP_NUM_THREADS=5; capped at the 4 usable cores"),
        ("auto", 16, {}, "auto: recorded by the run in its checkpoint (auto would choose 2 now); capped at the 4"),
    ],
)
def test_a_count_above_the_usable_cores_is_capped_and_the_line_says_so(machine, setting, recorded, environ, why):
    """issue 37: threads=1000000 started a million OpenMP threads (the tokenizer's pool panicked, a segfault)."""
    n, text = threads.choose_threads(setting, recorded, environ)
    assert n == 4 and text.startswith(why)
