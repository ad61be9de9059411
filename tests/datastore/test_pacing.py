"""Scrape pacing (epp.datastore.pacing): idle endpoints less often until epp books work on them,
endpoints whose load is all epp's own bookings less often until other load shows, every endpoint
less often while the event loop cannot keep the timers. Real aiohttp servers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest

from epp.datastore import pacing
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.datastore.pacing import WINDOW_S, Pace
from epp.datastore.scraper import MetricsScraper
from epp.observability import metrics

from .fake_vllm import FakeVLLM, until

INTERVAL = 0.02
IDLE = 0.4
BOOKED = 0.2


@pytest.fixture
async def server() -> AsyncIterator[FakeVLLM]:
    s = await FakeVLLM().start()
    yield s
    await s.stop()


def one(server: FakeVLLM) -> Datastore:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name="a", address="127.0.0.1", port=server.port)])
    return ds


def paced(ds: Datastore, *, idle_interval: float, booked_interval: float = 0.0) -> MetricsScraper:
    """A scraper on the idle and booked rules alone: the lateness rule (its own tests below) is
    off, so a loaded machine's late loop cannot widen the pace these tests count (in CI it
    widened to ~2x the base interval and a count of ~30 scrapes came out 14)."""
    return MetricsScraper(
        ds,
        pool_name="p",
        interval=INTERVAL,
        idle_interval=idle_interval,
        booked_interval=booked_interval,
        max_interval=INTERVAL,
    )


def hold_the_loop(seconds: float) -> None:
    """Busy work on the event loop's thread, as a saturated epp does."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def scrapes_in(server: FakeVLLM, seconds: float) -> int:
    before = server.requests
    await asyncio.sleep(seconds)
    return server.requests - before


async def test_an_idle_endpoint_is_scraped_at_the_idle_interval(server: FakeVLLM) -> None:
    ds = one(server)
    async with paced(ds, idle_interval=IDLE):
        await until(lambda: server.requests >= 2)
        n = await scrapes_in(server, 1.2)
        assert 2 <= n <= 4, n  # 1.2 s / 0.4 s; at the base interval it would be ~60
        (ep,) = ds.endpoints()
        assert ep.metrics.grace == pytest.approx(IDLE - INTERVAL)  # staleness checks forgive it
        assert metrics.REGISTRY.get_sample_value("epp_metrics_idle_endpoints") == 1
    assert metrics.REGISTRY.get_sample_value("epp_metrics_idle_endpoints") == 0


async def test_an_endpoint_with_work_is_scraped_at_the_base_interval(server: FakeVLLM) -> None:
    ds = one(server)
    (ep,) = ds.endpoints()
    server.running = 1
    async with paced(ds, idle_interval=IDLE):
        await until(lambda: ep.metrics.running == 1)
        assert await scrapes_in(server, 0.6) >= 15  # ~30 at 20 ms; 1-2 at the idle pace
        server.running = 0  # it finishes: the idle pace from its next scrape on
        await until(lambda: ep.metrics.running == 0)
        assert await scrapes_in(server, 0.8) <= 4
        server.waiting = 2  # work someone else sent: seen within the idle interval
        started = time.monotonic()
        await until(lambda: ep.metrics.waiting == 2, within=IDLE + 0.5)
        assert time.monotonic() - started <= IDLE + 0.2


async def test_a_booking_ends_the_idle_pause(server: FakeVLLM) -> None:
    ds = one(server)
    (ep,) = ds.endpoints()
    async with paced(ds, idle_interval=5.0):
        await until(lambda: ep.metrics.updated_at > 0)
        await asyncio.sleep(0.1)  # now in its idle pause (5 s)
        before, booked_at = server.requests, time.monotonic()
        server.running = 1  # what the pod will show once epp's request arrives
        ep.book(100)
        await until(lambda: server.requests > before, within=1.0)
        took = time.monotonic() - booked_at
        assert INTERVAL * 0.5 <= took < 0.5, took  # one base interval after the booking
        await until(lambda: ep.metrics.running == 1)
        ep.release(100)
        assert await scrapes_in(server, 0.4) >= 8  # busy while the pod says so (~20; booked pace: 2)


async def test_idle_interval_zero_scrapes_everything_at_the_base_interval(server: FakeVLLM) -> None:
    ds = one(server)
    async with paced(ds, idle_interval=0):
        await until(lambda: server.requests >= 2)
        assert await scrapes_in(server, 0.6) >= 15


async def test_a_removed_endpoint_keeps_no_hook(server: FakeVLLM) -> None:
    ds = one(server)
    (ep,) = ds.endpoints()
    async with paced(ds, idle_interval=IDLE) as s:
        assert ep.on_book == s.wake
        ds.sync("t", [])
        assert ep.on_book is None
        ep.book(1)  # no scraper to wake: nothing happens


async def test_load_that_is_all_epps_bookings_is_scraped_at_the_booked_interval(server: FakeVLLM) -> None:
    ds = one(server)
    (ep,) = ds.endpoints()
    server.running = 2
    for _ in range(3):
        ep.book(100)  # epp's three requests, one still on its way: all the load the pod shows
    scraper = paced(ds, idle_interval=IDLE, booked_interval=BOOKED)
    async with scraper:
        await until(lambda: ep.metrics.running == 2)
        n = await scrapes_in(server, 1.0)
        assert 3 <= n <= 7, n  # 1 s / 0.2 s; at the base interval it would be ~50
        assert ep.metrics.grace == pytest.approx(BOOKED - INTERVAL)  # staleness checks forgive it
        assert metrics.REGISTRY.get_sample_value("epp_metrics_booked_endpoints") == 1
        assert metrics.REGISTRY.get_sample_value("epp_metrics_idle_endpoints") == 0
        server.running = 4  # load epp did not book (another replica's): seen within one pause
        before = server.requests
        await until(lambda: ep.metrics.running == 4, within=BOOKED + 0.5)
        # By the next scrape (the one in flight may have read the old page): counted in scrapes,
        # not wall time, which a loaded CI machine stretched to 0.55 s once.
        assert server.requests - before <= 2, server.requests - before
        assert await scrapes_in(server, 0.6) >= 15  # then the base interval (~30; booked pace: 3)
        assert ep.metrics.grace == 0.0
        assert metrics.REGISTRY.get_sample_value("epp_metrics_booked_endpoints") == 0
    assert metrics.REGISTRY.get_sample_value("epp_metrics_booked_endpoints") == 0


async def test_a_booking_ends_the_booked_pause(server: FakeVLLM) -> None:
    """A new request on a pod paced for its booked load: the pod is read about half a base
    interval after the booking, not at the end of the longer pause, so a queue the request
    starts there shows as soon as it would at the base pace."""
    ds = one(server)
    (ep,) = ds.endpoints()
    server.running = 1
    ep.book(100)
    scraper = paced(ds, idle_interval=IDLE, booked_interval=5.0)
    async with scraper:
        await until(lambda: ep.metrics.running == 1)
        await asyncio.sleep(0.1)  # now in its booked pause (5 s)
        assert metrics.REGISTRY.get_sample_value("epp_metrics_booked_endpoints") == 1
        before, booked_at = server.requests, time.monotonic()
        server.waiting = 1  # what the pod shows once epp's second request arrives
        ep.book(100)
        await until(lambda: server.requests > before, within=3.0)  # the first read since
        took = time.monotonic() - booked_at
        await until(lambda: ep.metrics.waiting == 1, within=1.0)  # that read shows the queue
        # Far below the 5 s pause it ends; a loaded 2-core CI machine took 0.53 s here (and read
        # the pod twice more at the base pace before a poll for the queue saw it).
        assert INTERVAL * 0.5 <= took < 2.0, took
        assert await scrapes_in(server, 0.4) >= 8  # a queue: the base interval
        assert metrics.REGISTRY.get_sample_value("epp_metrics_booked_endpoints") == 0


async def test_booked_interval_zero_scrapes_booked_load_at_the_base_interval(server: FakeVLLM) -> None:
    ds = one(server)
    (ep,) = ds.endpoints()
    server.running = 1
    ep.book(100)
    async with paced(ds, idle_interval=IDLE, booked_interval=0):
        await until(lambda: ep.metrics.running == 1)
        assert await scrapes_in(server, 0.6) >= 15


def test_booked_means_no_load_beyond_epps_own() -> None:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name="a", address="127.0.0.1", port=1)])
    (ep,) = ds.endpoints()
    ep.metrics.updated_at = 1.0
    assert not pacing.booked(ep)  # nothing booked: the idle rule's, not this one's
    ep.book(10)
    ep.metrics.running = 1
    assert pacing.booked(ep)
    ep.metrics.running = 2  # one request more than epp sent it
    assert not pacing.booked(ep)
    ep.book(10)
    assert pacing.booked(ep)
    ep.metrics.waiting = 1  # a queue: vLLM's own admission, read at the base interval
    ep.book(10)
    assert not pacing.booked(ep)
    ep.metrics.waiting = 0
    ep.scrape_failures = 1  # its last scrape failed: what it holds is not known
    assert not pacing.booked(ep)


def test_pace_backs_off_while_timers_fire_late_and_comes_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="epp.datastore.scraper")
    pace = Pace(0.05, idle_interval=0.5, max_interval=1.0, booked_interval=0.2)
    now = 0.0
    for _ in range(4):  # the loop 100 ms late: +50% a second
        now += WINDOW_S
        pace.woke(0.1, now)
        pace.woke(0.1, now)
    assert pace.current == pytest.approx(0.05 * 1.5**4)
    for _ in range(40):
        now += WINDOW_S
        pace.woke(0.1, now)
    assert pace.current == pytest.approx(1.0)  # capped at max_interval
    assert metrics.REGISTRY.get_sample_value("epp_metrics_scrape_interval_seconds") == pytest.approx(1.0)
    assert pace.delay(idle=True) == pytest.approx(1.0)  # never faster than the busy interval
    assert pace.delay(idle=False, booked=True) == pytest.approx(1.0)
    assert any("late on average" in r.message for r in caplog.records)
    logged = len(caplog.records)
    assert logged <= 6, [r.message for r in caplog.records]  # at doublings, not every step
    for _ in range(40):  # on time again
        now += WINDOW_S
        pace.woke(0.0, now)
        pace.woke(0.0, now)
    assert pace.current == pytest.approx(0.05)
    assert pace.delay(idle=True) == pytest.approx(0.5)
    assert pace.delay(idle=False, booked=True) == pytest.approx(0.2)
    assert pace.delay(idle=False) == pytest.approx(0.05)
    assert "every 50 ms" in caplog.records[-1].message


def test_pace_does_not_move_on_a_little_lateness() -> None:
    pace = Pace(0.05, idle_interval=0.5, max_interval=1.0)
    now = 0.0
    for _ in range(20):
        now += WINDOW_S
        pace.woke(0.01, now)  # 10 ms late: between the two thresholds
    assert pace.current == pytest.approx(0.05)


async def test_a_saturated_loop_stretches_the_interval(
    server: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pacing, "WINDOW_S", 0.2)
    ds = one(server)
    (ep,) = ds.endpoints()
    server.running = 1  # busy: the base interval applies
    async with MetricsScraper(ds, pool_name="p", interval=INTERVAL, idle_interval=IDLE, staleness=2.0) as s:
        await until(lambda: ep.metrics.running == 1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and s.pace.current < 4 * INTERVAL:
            hold_the_loop(0.1)  # a timer due meanwhile fires up to 100 ms late
            await asyncio.sleep(0.01)  # room for a scrape
        assert s.pace.current >= 4 * INTERVAL
        assert s.pace.current <= 1.0  # at most half the staleness bound
