"""keep_freed_memory (glassrl.models.allocator): freed blocks are reused without page faults.

In a fresh process (mallopt is process-wide), with glibc's thresholds at their starting values
(128 KiB; glibc then raises them as it goes, by an amount that depends on what the process did
before, so they are fixed here to compare), three rounds of 30 one-MiB tensors written and freed
fault in ~7,700 pages each (the freed heap is given back and mapped anew); after
keep_freed_memory() the same rounds fault in none. GLASSRL_MALLOC=default leaves malloc as it is.
Counted as minor page faults (getrusage), not timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROUNDS = """
import ctypes, json, resource, torch
from glassrl.models.allocator import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, keep_freed_memory

libc = ctypes.CDLL("libc.so.6")
libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)  # glibc's starting values, fixed
libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)

def faults():  # rounds 2-4 of allocating 30 × 1 MiB, written, then freeing them
    counts = []
    for _ in range(4):
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [torch.ones(2**18) for _ in range(30)]
        del blocks
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
    return sum(counts[1:])

before = faults()
print(json.dumps({"set": keep_freed_memory(), "before": before, "after": faults()}))
"""

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt: Linux only")


def run(**env) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", ROUNDS], env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_blocks_are_reused_without_page_faults():
    got = run()
    assert got["set"] is None  # set: no reason why not
    assert got["before"] > 3 * 256 * 30 * 0.9  # nearly every page of three rounds
    assert got["after"] < got["before"] / 20


def test_glassrl_malloc_default_leaves_malloc_alone():
    got = run(GLASSRL_MALLOC="default")
    assert got["set"] == "GLASSRL_MALLOC=default"
    assert got["after"] > got["before"] / 2
