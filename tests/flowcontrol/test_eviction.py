"""Eviction of in-flight sheddable requests (enableEviction): who is cut, how many, and when the
next cut may come."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from epp import clock
from epp.flowcontrol.eviction import Reclaimer
from tests.flowcontrol.helpers import Detector, VirtualTimer, controller, request, settle


@pytest.fixture
def timer() -> Iterator[VirtualTimer]:
    t = VirtualTimer()
    with clock.use(lambda: t.now):
        yield t


async def test_a_waiting_critical_request_cuts_the_newest_lowest_sheddable_one(timer: VirtualTimer) -> None:
    detector = Detector(1.0)
    detector.type = "concurrency-detector"  # type: ignore[misc]
    fc, _ = controller(timer, detector, enable_eviction=True)
    assert fc.reclaimer is not None and fc.reclaimer.grace == 0.01
    cut: list[str] = []

    def running(priority: int, name: str, cuttable: bool = True):  # type: ignore[no-untyped-def]
        def evict() -> bool:
            if cuttable:
                cut.append(name)
            return cuttable

        entry = fc.track(priority, evict)
        assert entry is not None
        return entry

    standard = running(0, "standard")
    old = running(-1, "old batch")
    await timer.advance(1.0)
    new = running(-1, "new batch")
    running(-2, "skipped", cuttable=False)  # its response skips epp: passed over
    task = asyncio.create_task(fc.admit(request(10), 10))
    await timer.advance(0.001)
    # The deficit (saturation 1.0 - ceiling 1.0) rounds up to one cut: the lowest priority first,
    # the one that cannot be cut passed over, then the newest of the next priority.
    assert cut == ["new batch"]
    await timer.advance(0.05)
    assert cut == ["new batch"]  # stop and wait: nothing more until that stream has ended
    fc.untrack(new)
    detector.value = 0.9  # its place is free
    await timer.advance(0.02)
    assert task.done()
    assert fc.reclaimer.issued == {10: 1} and fc.reclaimer.confirmed == 1
    fc.untrack(old)
    fc.untrack(standard)


async def test_no_cut_at_or_above_the_waiting_band(timer: VirtualTimer) -> None:
    fc, _ = controller(timer, Detector(1.0), enable_eviction=True)
    cut: list[int] = []
    fc.track(-1, lambda: cut.append(-1) or True)
    task = asyncio.create_task(fc.admit(request(-1), 10))  # same priority as the victim
    await timer.advance(1.0)
    assert cut == []
    task.cancel()
    await settle()


def test_sizing_and_the_timeout() -> None:
    r = Reclaimer(grace=0.5, timeout=10.0)
    cuts: list[int] = []
    for i in range(5):
        r.track(-1, float(i), lambda i=i: cuts.append(i) or True)  # type: ignore[misc]
    # deficit 0.5 over a mean share of 1.5 / 5 = 0.3: ceil(1.67) = 2 (the cap)
    assert r.reclaim(1.5, 1.0, 0, now=10.0) == 2
    assert cuts == [4, 3]
    assert not r.gate_open(15.0)
    assert not r.gate_open(20.1)  # 10 s without an end: taken as done, then the grace
    assert r.gate_open(20.7)
    assert r.timed_out == 2
