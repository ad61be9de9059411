"""The event-loop lag monitor sees a loop held by synchronous work, and not an idle one."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from epp.observability import metrics
from epp.observability.looplag import LoopLagMonitor


def _count() -> float:
    return metrics.REGISTRY.get_sample_value("epp_event_loop_lag_seconds_count") or 0.0


def _slow() -> float:
    """Samples above 0.25 s."""
    total = _count()
    fast = metrics.REGISTRY.get_sample_value("epp_event_loop_lag_seconds_bucket", {"le": "0.25"}) or 0.0
    return total - fast


async def test_a_blocked_loop_shows_as_lag(caplog: pytest.LogCaptureFixture) -> None:
    monitor = LoopLagMonitor(interval=0.02)
    before, slow_before = _count(), _slow()
    await monitor.start()
    try:
        await asyncio.sleep(0.2)  # idle: samples, none slow
        assert _count() > before
        assert _slow() == slow_before
        with caplog.at_level(logging.WARNING, logger="epp.observability.looplag"):
            time.sleep(1.2)  # noqa: ASYNC251  (the point: a callback holding the loop, as a CPU-starved epp does)
            await asyncio.sleep(0.1)
        assert monitor.max_lag >= 1.0
        assert _slow() == slow_before + 1
        assert "event loop 1." in caplog.text
    finally:
        await monitor.stop()
    stopped = _count()
    await asyncio.sleep(0.1)
    assert _count() == stopped  # stopped means stopped
