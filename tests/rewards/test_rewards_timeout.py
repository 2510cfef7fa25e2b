"""call_with_timeout / WorkerPool: ok, timeout (worker killed and replaced), error, any thread."""

from __future__ import annotations

import operator
import os
import subprocess
import sys
import threading
import time

import pytest

from glassrl.worker_pool import WorkerPool, call_with_timeout


@pytest.fixture(scope="module")
def pool():
    pool = WorkerPool(1)
    yield pool
    pool.close()


def in_thread(fn, *args):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)))
    thread.start()
    thread.join()
    return out[0]


def test_ok_returns_the_value(pool):
    outcome = pool.call(operator.add, (2, 3), 5.0)
    assert (outcome.status, outcome.value) == ("ok", 5)


def test_sleeping_function_times_out_and_the_pool_still_works(pool):
    outcome = pool.call(time.sleep, (30,), 0.5)
    assert outcome.status == "timeout" and "0.5 s" in outcome.message
    assert pool.call(operator.mul, (6, 7), 5.0).value == 42


def test_raising_function_is_an_error_with_type_and_message(pool):
    outcome = pool.call(operator.truediv, (1, 0), 5.0)
    assert outcome.status == "error" and outcome.message == "ZeroDivisionError: division by zero"
    # sys.exit inside user code is an error result, not the end of the worker. (Sent as code to
    # exec: a sys.exit object replaced earlier in the test process by another library cannot be
    # pickled by reference.)
    assert pool.call(exec, ("import sys; sys.exit(2)",), 5.0).message == "SystemExit: 2"
    assert pool.call(operator.add, (1, 1), 5.0).value == 2


def test_a_dying_worker_is_an_error_and_is_replaced(pool):
    outcome = pool.call(os._exit, (3,), 5.0)
    assert outcome.status == "error" and "exit code 3" in outcome.message
    assert pool.call(operator.add, (1, 2), 5.0).value == 3


def test_only_plain_data_comes_back(pool):
    """The reply is JSON, never a pickle: a set is refused in the worker, a tuple arrives as a list."""
    outcome = pool.call(set, ([1, 2],), 5.0)
    assert outcome.status == "error" and outcome.message.startswith("the result is not plain data (JSON): TypeError")
    assert pool.call(tuple, ([1, 2],), 5.0).value == [1, 2]
    assert pool.call(float, ("nan",), 5.0).message.startswith("the result is not plain data (JSON): ValueError")


def test_unpicklable_function_is_an_error(pool):
    outcome = pool.call(lambda: 1, (), 5.0)
    assert outcome.status == "error" and "cannot send" in outcome.message


def test_timeouts_work_from_a_non_main_thread(pool):
    assert in_thread(pool.call, time.sleep, (30,), 0.3).status == "timeout"
    assert in_thread(pool.call, operator.add, (4, 4), 5.0).value == 8


def test_concurrent_callers_share_the_pool():
    pool = WorkerPool(2)
    try:
        results = [None] * 4
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, pool.call(operator.add, (i, i), 5.0)))
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r.value for r in results] == [0, 2, 4, 6]
    finally:
        pool.close()


def test_call_with_timeout_default_pool():
    assert call_with_timeout(operator.sub, (5, 3), 5.0).value == 2
    assert in_thread(call_with_timeout, time.sleep, (30,), 0.3).status == "timeout"


def test_the_worker_imports_no_torch():
    """A worker is a fresh interpreter that imports glassrl.rewards; the model-backed sources load
    torch and transformers only when built, so a worker starts without them."""
    code = "import sys, glassrl.rewards.user_function; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_pool_let_go_without_close_ends_its_workers():
    """A Trainer made and dropped (a notebook, a test suite) lets its pools go unclosed: their workers,
    whole interpreters, lived on until the caller died, and a suite's hundreds filled the memory."""
    import gc

    pool = WorkerPool(2)
    with pool.lease() as one, pool.lease() as two:  # both workers started
        pids = [one.call(os.getpid, (), 30.0).value, two.call(os.getpid, (), 30.0).value]
    assert len(set(pids)) == 2 and all(map(_alive, pids))
    del pool, one, two
    gc.collect()
    deadline = time.monotonic() + 30
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, pids))
