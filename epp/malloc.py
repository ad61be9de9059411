"""glibc malloc settings for a process that handles request bodies of many megabytes.

By default glibc serves an allocation over its mmap threshold (dynamic, 128 KiB to 32 MiB) with a
fresh mmap and gives the heap's free top back to the kernel past a trim threshold. Either way a
16 MiB request body is copied into memory the kernel has to fault in and zero, page by page: a
16 MiB message parsed and its body read took 11.5 ms here against 1.1 ms in reused memory, and
each of those steps holds the GIL, so every large body stalled the event loop for ~20 ms (other
requests' routing p99 ~25 ms at four 16 MiB bodies a second; issue 19,
tests/api/bench_big_bodies.py). With the threshold at its maximum and a high trim threshold the
memory freed by one body is reused by the next: the cost is up to TRIM_THRESHOLD of freed memory
kept in the process's RSS after a burst of large bodies.

The environment's own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ win (glibc reads them at
start; they are left alone here). Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("epp.malloc")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 256 << 20


def tune() -> bool:
    """Apply the settings above; False where they do not apply (not glibc, or set by env)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 on success; musl and others without it were caught above.
    ok = bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    )
    if not ok:
        log.debug("mallopt refused the large-body settings")
    return ok
