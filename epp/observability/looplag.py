"""How late epp's event loop runs its callbacks: the first sign that one process is saturated.

Everything epp does on the data path shares one asyncio loop: ext-proc messages, decisions,
scrapes, KV events. When it has more work than a core, every callback waits, and past 30 s gRPC
itself cancels ext-proc streams the loop has not picked up yet (gRPC core's
`grpc.server_max_unrequested_time_in_server`; Envoy answers those requests 500). A live bench
that overloaded this machine showed exactly that (docs/bench/overhead.md#streamed and
docs/bench/routing-live.md#live). This monitor sleeps `interval` seconds over and over and records
how much later than asked it woke up, so the lag is visible on /metrics
(`epp_event_loop_lag_seconds`) long before streams are cancelled.
"""

from __future__ import annotations

import asyncio
import logging

from epp import tasks
from epp.observability import metrics

log = logging.getLogger(__name__)

INTERVAL_S = 0.25
WARN_LAG_S = 1.0
"""A lag above this is logged (at most once per `WARN_EVERY_S`)."""
WARN_EVERY_S = 60.0


class LoopLagMonitor:
    """`start()` on the running loop, `stop()` before it ends."""

    def __init__(self, interval: float = INTERVAL_S) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.interval = interval
        self.max_lag = 0.0  # since start, for tests and logs
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = tasks.create_guarded_task(self._run(), name="event-loop lag monitor", logger=log)

    async def stop(self) -> None:
        if self._task is not None:
            await tasks.cancel_and_wait([self._task])
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        warned_at = -WARN_EVERY_S
        while True:
            asked = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            lag = max(0.0, loop.time() - asked)
            metrics.event_loop_lag.observe(lag)
            self.max_lag = max(self.max_lag, lag)
            now = loop.time()
            if lag > WARN_LAG_S and now - warned_at >= WARN_EVERY_S:
                warned_at = now
                log.warning(
                    "event loop %.1fs late: epp has more work than one core (ext-proc streams not "
                    "picked up within 30s are cancelled by gRPC)",
                    lag,
                )
