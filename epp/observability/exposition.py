"""Writing a /metrics page without holding the event loop for the whole of it.

`prometheus_client.generate_latest` collects every family and formats every sample in one call. At
the label caps (metrics.MAX_LABEL_PAIRS, ~1 MB, ~7,800 lines) that is ~170 ms of CPU on a 2-core VM
(`scripts/bench_metrics_render.py`: ~65 ms collecting, ~110 ms formatting), and on the event loop
every request being routed waited for it at each Prometheus scrape. Here:

* the families are collected on the loop, where the custom collectors may read epp's own state
  (the datastore, the KV index, the flow-control queues) without locks, but the loop is given back
  whenever a collector has held it past `HOLD_S`. Each collector's families are a snapshot taken in
  one go; a page was never atomic across families (Prometheus does not ask it to be);
* the snapshot is formatted in a thread (`asyncio.to_thread`): the samples are plain values by then,
  and the thread gives the GIL back to the loop at every switch interval (1 ms in `epp serve`).

The bytes are the same as `generate_latest`'s (tests/observability/test_exposition.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

HOLD_S = 0.001
"""How long collecting may hold the loop before it yields to other work (between families)."""


class Families:
    """Families already collected (or merged), as a collector `generate_latest` can write."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


async def collect(registry: Collector) -> list[Metric]:
    """Every family of `registry`, collected on the loop in steps of about HOLD_S."""
    families: list[Metric] = []
    since = time.perf_counter()
    for family in registry.collect():
        families.append(family)
        now = time.perf_counter()
        if now - since >= HOLD_S:
            # Twice: after the first, this task runs again before the I/O and timers that fell
            # due meanwhile (asyncio queues them behind the callbacks already ready); after the
            # second, behind them.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            since = time.perf_counter()
    return families


def write(families: Sequence[Metric]) -> bytes:
    """`families` in Prometheus' text format (0.0.4), as `generate_latest` writes a registry."""
    return generate_latest(Families(families))


async def render(registry: Collector) -> bytes:
    """The page `generate_latest(registry)` would write, collected in steps and formatted off the
    loop."""
    with _gc_paused():
        families = await collect(registry)
        return await asyncio.to_thread(write, families)


_paused = 0


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic collector off while a page is written. A page is ~8,000 samples and their label
    dicts at the caps, each a tracked object that lives until the page is sent: collections that
    ran meanwhile found them in gen0, promoted them, and the gen1/gen2 passes that followed held the
    GIL (the loop's, or the writing thread's) for 15-45 ms. Paused, they are freed by their reference
    counts before any pass sees them (`scripts/bench_metrics_render.py`: loop lag max 42 -> 16 ms).
    Nested or overlapping scrapes share one pause; a collector disabled elsewhere stays so."""
    global _paused
    if _paused == 0 and not gc.isenabled():
        yield
        return
    _paused += 1
    gc.disable()
    try:
        yield
    finally:
        _paused -= 1
        if _paused == 0:
            gc.enable()
