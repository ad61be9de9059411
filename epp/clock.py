"""The clock the routing path reads: real monotonic time, or a benchmark's virtual time.

`epp bench --mode fast` runs a simulated fleet and its load in virtual time through the same
plugins and request control as `epp serve`; every time-dependent decision (metric staleness,
speculative-entry TTLs, request timings) reads `now()` so that a 30-minute workload can run in
seconds and stay deterministic. Serving never swaps the clock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

_now: Callable[[], float] = time.monotonic


def now() -> float:
    """Seconds on the current clock (time.monotonic unless a virtual clock is in use)."""
    return _now()


@contextlib.contextmanager
def use(clock: Callable[[], float]) -> Iterator[None]:
    """Make `now()` read `clock` inside the block (one virtual clock at a time, not nested)."""
    global _now
    previous = _now
    _now = clock
    try:
        yield
    finally:
        _now = previous
