"""Reward isolation without holes (issue 15): what a hostile or broken reward function can no
longer do to the trainer.

Each test reproduces a probe that used to get through: a crafted return value that ran code in
(or hung) the trainer when it was unpickled there, an import that hung or exited, a worker that
outlived a killed trainer. Process checks read /proc, so this file runs on Linux.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards import RewardRequest, UserFunctionSource, WorkerPool

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc")

HOSTILE = '''
import numbers, os, pickle, sys, time, subprocess

MARKER = {marker!r}

class RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (os.system, (f"touch {{MARKER}}",))

class HangsWhenUnpickled:
    def __reduce__(self):
        return (time.sleep, (600,))

@numbers.Real.register
class HangsWhenConverted:
    def __float__(self):
        time.sleep(600)

def reduce_score(prompt, response, answer, metadata):
    return RunsCodeWhenUnpickled()

def reduce_details(prompt, response, answer, metadata):
    return {{"score": 1.0, "payload": RunsCodeWhenUnpickled(), "sleeper": HangsWhenUnpickled()}}

def slow_float(prompt, response, answer, metadata):
    return {{"score": HangsWhenConverted()}}

def forged_reply(prompt, response, answer, metadata):
    # Write a pickle straight onto the reply pipe, as a reader that unpickles would run it.
    data = pickle.dumps(RunsCodeWhenUnpickled())
    os.write(int(sys.argv[2]), len(data).to_bytes(8, "big") + data)
    time.sleep(600)

def flood(prompt, response, answer, metadata):
    os.write(int(sys.argv[2]), (2**62).to_bytes(8, "big"))
    time.sleep(600)

def huge_details(prompt, response, answer, metadata):
    return {{"score": 1.0, "text": "x" * (20 * 1024 * 1024)}}

def hang_with_child(pidfile):
    child = subprocess.Popen(["sleep", "600"])
    with open(pidfile + ".tmp", "w") as f:
        f.write(f"{{os.getpid()}} {{os.getpgrp()}} {{child.pid}}")
    os.rename(pidfile + ".tmp", pidfile)
    time.sleep(600)

def pid():
    return os.getpid()

def allocate(n_bytes):
    return len(bytearray(n_bytes))
'''


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    marker = tmp_path / "code-ran"
    (tmp_path / "glassrl_hostile_rewards.py").write_text(textwrap.dedent(HOSTILE.format(marker=str(marker))))
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


def score(spec: str, timeout_s: float = 10.0, response: str = "r"):
    record = PromptRecord("p", "a", {}, "t#0")
    (result,) = UserFunctionSource(spec, style="glassrl", timeout_s=timeout_s).score(
        [RewardRequest("p", response, record)]
    )
    return result


def live_group_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that still run (zombies left to a non-reaping init do not count)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry))
    return members


def wait_for(predicate, limit_s: float = 60.0) -> bool:
    """Poll ``predicate`` until it holds or ``limit_s`` passes (a bound on a wait, not a timing test)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def read_pids(pidfile: Path) -> tuple[int, int, int]:
    assert wait_for(pidfile.exists), "the hanging reward never started"
    worker, group, child = map(int, pidfile.read_text().split())
    return worker, group, child


# ---------------------------------------------------------------- crafted return values


@pytest.mark.parametrize("name", ["reduce_score", "reduce_details"])
def test_a_crafted_return_value_runs_no_code_anywhere(hostile, name):
    """Was: the object was pickled in the worker and unpickled in the trainer, which ran os.system."""
    result = score(f"glassrl_hostile_rewards:{name}")
    if name == "reduce_score":
        assert result.status == "error" and "score must be a number, got RunsCodeWhenUnpickled" in result.message
    else:
        assert result.status == "ok" and result.score == 1.0
        assert isinstance(result.details["payload"], str) and isinstance(result.details["sleeper"], str)
    assert not hostile.exists()


def test_a_value_that_hangs_while_converted_is_a_timeout(hostile):
    """Was: the trainer hung past timeout_s reading the value. The conversion now runs in the worker, on its clock."""
    result = score("glassrl_hostile_rewards:slow_float", timeout_s=1.0)
    assert result.status == "timeout" and "no result after 1 s" in result.message


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("forged_reply", "unreadable reply from the reward worker"),
        ("flood", f"the reply is {2**62} bytes, more than"),
        ("huge_details", "bytes of JSON, more than the 16777216 a reply may hold"),
    ],
)
def test_bytes_on_the_reply_pipe_are_json_and_bounded(hostile, name, fragment):
    result = score(f"glassrl_hostile_rewards:{name}")
    assert result.status == "error" and fragment in result.message
    assert not hostile.exists()


# ---------------------------------------------------------------- imports


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("import time\ntime.sleep(600)\n", "did not finish within import_timeout_s=1 s"),
        ("import sys\nsys.exit(0)\n", "SystemExit: 0"),
        ("import os\nos._exit(0)\n", "reward worker died (exit code 0)"),
        ("raise ImportError('needs a GPU')\n", "ImportError: needs a GPU"),
    ],
)
def test_an_import_that_hangs_or_exits_is_one_clear_error(tmp_path, body, fragment):
    """Was: imported in the trainer, so a hang hung it and sys.exit(0) ended it with exit code 0."""
    (tmp_path / "bad_import.py").write_text(f"{body}\ndef f(prompt, response, answer, metadata):\n    return 1.0\n")
    with pytest.raises(GlassrlError, match=re.escape(fragment)) as info:
        UserFunctionSource("bad_import.py:f", import_timeout_s=1.0, base_dir=str(tmp_path))
    assert "\n" not in str(info.value)
    assert not any("bad_import" in name for name in sys.modules)  # never imported in the trainer


def test_an_import_beyond_the_memory_limit_says_which_option_to_raise(tmp_path):
    (tmp_path / "greedy.py").write_text(
        "TABLE = bytearray(2 * 1024**3)\n\ndef f(prompt, response, answer, metadata):\n    return 1.0\n"
    )
    with pytest.raises(GlassrlError, match=r"MemoryError.*may use 512 MiB of address space: raise memory_limit_mb"):
        UserFunctionSource("greedy.py:f", memory_limit_mb=512, base_dir=str(tmp_path))


def test_a_setup_that_hangs_is_a_timeout_and_the_call_is_not_made():
    pool = WorkerPool(1)
    try:
        outcome = pool.call(os.getpid, (), 5.0, setup=(time.sleep, (600,)), setup_timeout_s=0.5)
        assert outcome.status == "timeout" and outcome.message.startswith("setup: no result after 0.5 s")
        assert pool.call(abs, (-3,), 5.0, setup=(abs, (1,))).value == 3
    finally:
        pool.close()


# ---------------------------------------------------------------- limits and recycling


def test_workers_are_recycled_after_n_calls(hostile):
    pool = WorkerPool(1, recycle_after=2)
    try:
        from glassrl_hostile_rewards import pid

        pids = [pool.call(pid, (), 10.0).value for _ in range(3)]
        assert pids[0] == pids[1] != pids[2]
        assert wait_for(lambda: not live_group_members(pids[0]))  # the retired worker's group is gone
    finally:
        pool.close()


def test_memory_limit_is_a_memory_error_in_the_worker(hostile):
    from glassrl_hostile_rewards import allocate

    pool = WorkerPool(1, memory_limit_mb=512)
    try:
        assert pool.call(allocate, (10 * 1024 * 1024,), 10.0).value == 10 * 1024 * 1024
        outcome = pool.call(allocate, (2 * 1024**3,), 10.0)
        assert outcome.status == "error" and outcome.message.startswith("MemoryError")
        assert pool.call(allocate, (1024,), 10.0).value == 1024  # the worker lives on
    finally:
        pool.close()


# ---------------------------------------------------------------- no orphans


def test_a_timeout_kills_the_workers_whole_process_group(hostile, tmp_path):
    from glassrl_hostile_rewards import hang_with_child

    pool = WorkerPool(1)
    pidfile = tmp_path / "pids"
    try:
        outcome = pool.call(hang_with_child, (str(pidfile),), 2.0)
        assert outcome.status == "timeout"
        worker, group, child = read_pids(pidfile)
        assert group == worker != os.getpgrp()  # the worker leads its own group
        assert wait_for(lambda: not live_group_members(group))
        assert child not in live_group_members(group)
    finally:
        pool.close()


TRAINER = '''
import sys, threading
sys.path.insert(0, {module_dir!r})
from glassrl.rewards import WorkerPool
from glassrl_hostile_rewards import hang_with_child

pool = WorkerPool(1)
if sys.argv[1] == "kill-me":
    pool.call(hang_with_child, ({pidfile!r},), 600)
else:  # exit normally while a call hangs in another thread
    threading.Thread(target=pool.call, args=(hang_with_child, ({pidfile!r},), 600), daemon=True).start()
    import os, time
    while not os.path.exists({pidfile!r}):
        time.sleep(0.05)
'''


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill-me", "exit"])
def test_no_worker_outlives_the_trainer(hostile, tmp_path, how):
    """kill -9 of the trainer during a hanging reward (the reaper kills the group), or a normal
    exit (atexit does): afterwards no process of the worker's group runs."""
    pidfile = tmp_path / f"pids-{how}"
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.format(module_dir=str(tmp_path), pidfile=str(pidfile)))
    trainer = subprocess.Popen([sys.executable, str(script), how])
    try:
        worker, group, child = read_pids(pidfile)
        assert group not in (os.getpgrp(), trainer.pid)
        if how == "kill-me":
            os.kill(trainer.pid, signal.SIGKILL)
        assert trainer.wait(timeout=60) == (-signal.SIGKILL if how == "kill-me" else 0)
        assert wait_for(lambda: not live_group_members(group)), live_group_members(group)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()


def test_calls_from_many_threads_each_get_their_own_answer(hostile):
    from glassrl_hostile_rewards import allocate

    pool = WorkerPool(2)
    results: dict[int, object] = {}
    try:
        threads = [
            threading.Thread(target=lambda n=n: results.__setitem__(n, pool.call(allocate, (n,), 10.0).value))
            for n in range(1, 9)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {n: n for n in range(1, 9)}
    finally:
        pool.close()
