"""Freed memory kept for reuse on CPU: glibc's malloc set so that each step's tensors reuse the
pages the last step freed instead of faulting in new ones.

glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB at first, raised as large
blocks are freed, at most 32 MiB) as a fresh mapping, unmapped again when freed, and gives the
heap's free top back to the kernel past ``M_TRIM_THRESHOLD``. Either way the next allocation
touches new pages: a page fault each, the kernel zeroing 4 KiB. A training step allocates the same
sizes step after step (the KV cache, activations, gradients), so it pays that every step:
bench_vs_trl's default-model run took ~3,600 minor page faults per step as glibc starts, ~600 with
blocks up to 32 MiB taken from the heap and the heap kept up to 1 GiB; in one process alternating
the two settings, the step was 4 % shorter (BENCHMARKS.md). It is what PyTorch's CPU performance
guide gets by preloading jemalloc or tcmalloc, without another library.

The cost: memory the process freed stays with it, up to 1 GiB beyond what it uses (the peak RSS
is the peak either way). Linux with glibc only; elsewhere, or with ``GLASSRL_MALLOC=default`` in
the environment, malloc is left as it is, and the run's start-up lines say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt(3) parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HEAP_BLOCKS_UP_TO = 32 * 2**20  # glibc's largest M_MMAP_THRESHOLD on 64-bit (HEAP_MAX_SIZE / 2)
KEEP_FREED = 2**30


def keep_freed_memory() -> str | None:
    """Set glibc's malloc as the module docstring says; None when it was set, else why not (the
    run's start-up lines say which)."""
    if os.environ.get("GLASSRL_MALLOC") == "default":
        return "GLASSRL_MALLOC=default"
    if os.uname().sysname != "Linux":
        return f"{os.uname().sysname}: glibc's mallopt is Linux only"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return "the C library is not glibc (no mallopt)"
    if not (mallopt(M_MMAP_THRESHOLD, HEAP_BLOCKS_UP_TO) and mallopt(M_TRIM_THRESHOLD, KEEP_FREED)):
        return "glibc's mallopt refused the settings"
    return None


def memory_path(refused: str | None) -> str:
    """The start-up line's account of :func:`keep_freed_memory`'s answer ``refused``."""
    if refused is None:
        return "glibc keeps freed memory for reuse (GLASSRL_MALLOC=default turns this off)"
    return f"malloc left as it is: {refused}"
