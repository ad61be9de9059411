"""How often the scraper reads each endpoint's /metrics: GIE's interval, less often where that
buys nothing.

Three rules, measured with `epp bench fleet` and `epp bench` (docs/bench/fleet-cost.md#fleet-cost):

- **Idle endpoints.** At 50 ms every endpoint costs 20 GETs of a 55 KB page a second, ~0.2% of a
  core each, whether or not it serves anything. An endpoint whose last scrape showed nothing
  running or waiting, and on which epp has booked nothing, is scraped every `idle_interval`
  (500 ms by default) instead. epp's own bookings wake it: `Endpoint.on_book` ends the idle pause
  and the next scrape comes one base interval after the booking, as it would have. What an idle
  endpoint's figures can miss for longer is work sent to it by someone else (another epp replica,
  a client that bypasses the gateway), at most `idle_interval` late.
- **Load epp booked.** An endpoint whose last scrape showed nothing waiting and no more requests
  running than epp has in flight there (`booked`: its batch is epp's own requests, and it queues
  none) is scraped every `booked_interval` (`--booked-metrics-interval`, 200 ms by default; 0
  turns it off). A booking ends that pause as it ends an idle one: the endpoint is read on its
  first tick half a base interval after epp sends it another request, so a queue that request
  starts shows as soon as at the base pace. The routing knows that load between scrapes: the
  scorers take the larger of epp's own count and the scraped one for the batch, and the queue
  from the prefill epp booked; a queue (requests waiting for KV blocks or a batch slot) is
  vLLM's own decision, so it keeps the base interval. With 8 busy pods at 20 requests a second
  (scraping was about a quarter of epp's busy time) it took 1.4-2.2 ms a request off epp's CPU
  in live runs, with the first-token tail level; in `epp bench` fast mode (ten workloads, five
  seeds) no routing figure moved beyond what a 49 ms interval instead of 50 moves it
  (docs/bench/fleet-cost.md#booked-pace). Load epp did not book (another
  replica's, a client that bypasses the gateway) puts the endpoint back on the base interval
  from its next scrape; with `--workers N` the supervisor, which scrapes for the workers, books
  nothing, so every busy endpoint stays on the base interval. Where flow control dispatches on
  the scrapes (a `utilization-detector`) the rule is off.
- **A late event loop.** When the loop cannot keep up (a thousand busy endpoints at 50 ms is
  ~20,000 GETs a second, more than one process can make), scraping at the configured rate only
  makes everything later, requests included. A probe sleeps one base interval over and over and
  measures how late it wakes (the loop's lag, as `epp_event_loop_lag_seconds` does); when the
  mean over a second exceeds half the base interval, every busy endpoint's interval grows by
  half (up to `max_interval`), and when it falls under a tenth, it shrinks back.
  `epp_metrics_scrape_interval_seconds` shows the interval in force. The scrapes' own timing is
  not the signal: a scrape that overruns its interval may only mean a slow server.
"""

from __future__ import annotations

import asyncio
import logging
import math

from epp.datastore.endpoints import Endpoint
from epp.observability import metrics

log = logging.getLogger("epp.datastore.scraper")

WINDOW_S = 1.0
"""Lateness is averaged over this long before the interval changes."""
GROW = 1.5
SHRINK = 1.25
LATE_GROW = 0.5
"""Grow when the loop's mean lag exceeds this share of the base interval."""
LATE_SHRINK = 0.1
"""Shrink when it is under this share of the base interval."""


# Endpoints share scrape times, up to this many at each: the scrapes of one tick go out in one
# wake-up of the loop, and on a small VM a wake-up costs more than reading the page (8 pods every
# 50 ms: 2.4-2.9% of a core against 6.0-6.4% on timers of their own; 100: 18-24% against 34-38%;
# tests/datastore/bench_scraper.py, docs/bench/fleet-cost.md#scrape-grid). More endpoints
# take more ticks, evenly spaced within the interval, so that a thousand do not all scrape at once
# and hold the loop (a tick of eight holds it ~0.5-1 ms).
SCRAPES_PER_TICK = 8


class Grid:
    """When each endpoint is scraped: its slot on a grid of ticks within the base interval."""

    __slots__ = ("_placed", "interval")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._placed = 0  # endpoints given a slot so far

    def slot(self, endpoints: int) -> tuple[float, int]:
        """A new endpoint's place on the grid, with `endpoints` being scraped: its phase within
        each interval, which `SCRAPES_PER_TICK` endpoints share (the phases evenly spaced), and
        its phase's turn among the intervals, so that on a longer pace (idle endpoints: every
        tenth interval) the groups take turns, each still scraped in one wake-up, not all in the
        same interval."""
        ticks = max(1, math.ceil(endpoints / SCRAPES_PER_TICK))
        group, self._placed = self._placed % ticks, self._placed + 1
        return group * self.interval / ticks, group

    def at(self, at: float, slot: tuple[float, int], delay: float) -> float:
        """The first time at or after `at` (within a microsecond) of `slot` on a pace of `delay`,
        which is taken up to whole intervals: its phase past a multiple of the interval, in its
        turn among every `delay / interval` of them."""
        phase, turn = slot
        every = max(1, math.ceil(delay / self.interval - 1e-6))
        period = every * self.interval
        offset = phase + (turn % every) * self.interval
        return offset + math.ceil((at - offset - 1e-6) / period) * period


class Pace:
    """The scrape intervals in force for one scraper's loops (one event loop)."""

    def __init__(
        self, interval: float, *, idle_interval: float, max_interval: float, booked_interval: float = 0.0
    ) -> None:
        """`idle_interval` <= `interval` (0 included) turns the idle rule off, `booked_interval`
        <= `interval` the booked one; `max_interval` <= `interval` turns the lateness rule off."""
        self.interval = interval
        self.idle_interval = max(idle_interval, interval)
        self.booked_interval = max(booked_interval, interval)
        self.max_factor = max(1.0, max_interval / interval)
        self.factor = 1.0
        self._since = 0.0
        self._late = 0.0
        self._wakes = 0
        self._logged = 1.0
        metrics.scrape_interval.set(interval)

    @property
    def current(self) -> float:
        """The interval of a busy endpoint now."""
        return self.interval * self.factor

    def delay(self, idle: bool, booked: bool = False) -> float:
        """How long after this scrape's start the next one is due."""
        if idle:
            return max(self.current, self.idle_interval)
        return max(self.current, self.booked_interval) if booked else self.current

    async def probe(self) -> None:
        """Measure the loop's lag for as long as it runs (the scraper's task)."""
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            now = loop.time()
            self.woke(now - asked, now)

    def woke(self, late: float, now: float) -> None:
        """A timer fired `late` seconds after it was due (`now`: the loop's clock)."""
        self._late += max(late, 0.0)
        self._wakes += 1
        if now - self._since < WINDOW_S:
            return
        mean = self._late / self._wakes
        self._since, self._late, self._wakes = now, 0.0, 0
        before = self.factor
        if mean > LATE_GROW * self.interval:
            self.factor = min(self.factor * GROW, self.max_factor)
        elif mean < LATE_SHRINK * self.interval:
            self.factor = max(self.factor / SHRINK, 1.0)
        if self.factor != before:
            metrics.scrape_interval.set(self.current)
            # Logged when it doubles or halves from what was last logged, not at every step.
            back = self.factor == 1.0
            if back or self.factor >= 2 * self._logged or self.factor <= self._logged / 2:
                self._logged = self.factor
                log.info(
                    "event loop %.0f ms late on average: scraping busy endpoints every %.0f ms "
                    "(configured %.0f ms)",
                    mean * 1000,
                    self.current * 1000,
                    self.interval * 1000,
                )


def booked(ep: Endpoint) -> bool:
    """Whether the endpoint's load at its last good scrape was all epp's own bookings, none of it
    waiting."""
    m = ep.metrics
    n = ep.inflight_requests
    return (
        n > 0
        and m.waiting == 0
        and m.running <= n
        and m.updated_at > 0
        and not ep.scrape_failures
        and not ep.excluded
    )
