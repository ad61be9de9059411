"""Python's cyclic garbage collector, set for a process that serves for days.

What the collector cost a serving epp at CPython's defaults (`epp bench --mode live --workload
shared-prefix --gateway-config override`, 20 req/s over 8 pods; each collection's thread CPU from
`gc.callbacks`; docs/bench/fleet-cost.md#gc):

- Start-up leaves ~99,000 tracked objects that live as long as the process (modules, the config,
  the tokenizers' and gRPC's Python side). Every full collection walked all of them, 31-55 ms with
  the GIL held, about once a minute: the event loop, and every stream, waited that long.
- The young generation (threshold 700 net new objects) was collected every ~1.4 s, in ~2 ms. What
  it walks is mostly the objects of the ~90 requests in flight (a streamed answer takes seconds),
  which survive it anyway: little of a request's memory is cyclic (gRPC's method lookup leaves a
  small cycle per stream); the rest is freed by reference counts when the request ends.

`settle()` freezes what start-up made (`gc.freeze`: no collection walks it again) and raises the
young threshold tenfold: at that load one young collection every ~40 s (8-14 ms) instead of ~55
collections of all generations a minute. The collector's CPU fell from ~0.11 to ~0.01 ms a request
and its longest stall from 31-39 to 9-14 ms. The cyclic garbage left meanwhile is those small
cycles, well under 1 MB.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from epp.observability import metrics

log = logging.getLogger("epp.garbage")

YOUNG_THRESHOLD = 7_000  # net new tracked objects between young collections (CPython: 700)

_started: list[float] = []


def settle() -> int:
    """Once start-up is over (before the process reports ready): collect, freeze the survivors,
    raise the young threshold, and time every collection from now on (`epp_gc_pause_seconds`).
    Returns the objects frozen."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    if _observe not in gc.callbacks:
        gc.callbacks.append(_observe)
    frozen = gc.get_freeze_count()
    log.info("gc: %d start-up objects frozen, young threshold %d", frozen, YOUNG_THRESHOLD)
    return frozen


def _observe(phase: str, info: dict[str, Any]) -> None:
    # Runs inside the collection, with the GIL held and the collector not re-entrant: keep it to a
    # clock read and one observation. Wall time, as the event loop waits it.
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        metrics.gc_pause.labels(str(info["generation"])).observe(time.perf_counter() - _started[0])
