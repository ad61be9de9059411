"""Routing in arrival order, and a bound on how long a request may wait for its turn.

Why: a burst of new requests (thousands at once) was routed all at once. Every stream's parse,
tokenize and pick interleaved on the one event loop, so each finished only when nearly all had,
and once that passed the gateway's per-message timeout (5 s in the generated Envoy) the late ones
all got 504 together: 209 of a burst of 3,000 (`scripts/bench_abuse.py streams`), and a small
request sent beside the burst waited seconds too.

Here at most `slots` requests route at once and the rest wait their turn in arrival order, so
the first come back first. A request that would wait longer than `max_wait` seconds is answered
503 at once (`--max-routing-wait`), before its body is parsed, while it is still cheap to refuse.

The wait is estimated from how fast routes leave the gate now, sampled every SAMPLE_S while at
least MIN_ROUTES routes completed (idle periods teach nothing and keep the last estimate). While
requests waited for the whole interval, the gate drained as fast as it could: the wall time per
route is the truth, whether routing was short of CPU or waited on I/O (pods' /render hanging
until its timeout). Otherwise the event loop thread's CPU time per route stands in: on one loop
the routes ahead are done one after another. A newcomer waits about (routes waiting + 1) x
(time per route).

A request flow control holds leaves the gate (`leave`): holding costs no routing work, and a
long hold must not keep others from theirs.
"""

from __future__ import annotations

import asyncio
import collections
import time

from epp.observability import metrics

SAMPLE_S = 0.5
MIN_ROUTES = 20
INITIAL_COST = 0.002  # seconds of loop time per route before one is measured (a short chat)
MIN_COST = 50e-6  # below any route measured: a sample of pure bookkeeping must not open the gate wide


class RoutingGate:
    """At most `slots` routes at once, the others waiting in arrival order (one event loop: no
    locks). `enter` is False when the wait would pass `max_wait` (0: no bound)."""

    __slots__ = (
        "_completed",
        "_completed_at",
        "_cpu_at",
        "_queue",
        "_running",
        "_sampled_at",
        "_saturated_at",
        "_slots",
        "_waiting",
        "cost",
        "max_wait",
    )

    def __init__(self, slots: int = 128, max_wait: float = 2.0, cost: float = INITIAL_COST) -> None:
        if slots < 1 or max_wait < 0:
            raise ValueError("the routing gate needs slots >= 1 and max_wait >= 0")
        self._slots = slots
        self.max_wait = max_wait
        self.cost = cost
        self._running = 0
        self._waiting = 0  # futures in _queue not cancelled
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self._completed = 0
        self._completed_at = 0
        self._cpu_at = time.thread_time()
        self._sampled_at = time.monotonic()
        self._saturated_at: float | None = None  # since when requests have been waiting

    @property
    def ahead(self) -> int:
        """Routes running or waiting now."""
        return self._running + self._waiting

    def wait_estimate(self) -> float:
        """Seconds a request arriving now would wait for its route to start."""
        if self._running < self._slots and not self._waiting:
            return 0.0
        return (self.ahead - self._slots + 1) * self.cost

    def full(self) -> bool:
        """Whether a request arriving now would wait past `max_wait`."""
        self._sample()
        return bool(self.max_wait) and self.wait_estimate() > self.max_wait

    async def enter(self) -> bool:
        """Take a slot, waiting in arrival order; False (no slot taken) if the wait would be
        too long. A True must be matched by one `leave`."""
        if self.full():
            return False
        if self._running < self._slots and not self._waiting:
            self._running += 1
            return True
        turn = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        if not self._waiting:
            self._saturated_at = time.monotonic()
        self._waiting += 1
        metrics.routing_waiting.inc()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.cancelled():
                self._waiting -= 1  # still queued: `leave` skips it
                metrics.routing_waiting.dec()
                if not self._waiting:
                    self._saturated_at = None
            else:
                self.leave()  # handed a slot just as it was cancelled: pass it on
            raise
        return True

    def leave(self) -> None:
        """A route is done (or held): its slot goes to the first one waiting."""
        self._completed += 1
        self._sample()
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                self._waiting -= 1
                metrics.routing_waiting.dec()
                if not self._waiting:
                    self._saturated_at = None
                turn.set_result(None)  # the slot passes on: _running is unchanged
                return
        self._running -= 1

    def _sample(self) -> None:
        now = time.monotonic()
        if now - self._sampled_at < SAMPLE_S:
            return
        cpu = time.thread_time()
        done = self._completed - self._completed_at
        if done >= MIN_ROUTES:
            saturated = self._saturated_at is not None and self._saturated_at <= self._sampled_at
            spent = now - self._sampled_at if saturated else cpu - self._cpu_at
            self.cost = 0.5 * self.cost + 0.5 * max(MIN_COST, spent / done)
        self._sampled_at, self._cpu_at, self._completed_at = now, cpu, self._completed
