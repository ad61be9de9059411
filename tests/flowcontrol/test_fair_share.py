"""fair-share-fairness-policy: round-robin turns, and a tenant holding more than its share in
flight waits once the pool is past `overShareCeiling` of the band's ceiling, while tenants under
their share still go at once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from epp import clock
from epp.flowcontrol import config as fc_config
from epp.flowcontrol import ordering
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.fair_share import FairShare
from epp.scheduling.interfaces import RequestOutcome
from tests.flowcontrol.helpers import Detector, VirtualTimer, controller, endpoint, request, settle
from tests.flowcontrol.test_config import ON, config, error


@pytest.fixture
def timer() -> Iterator[VirtualTimer]:
    t = VirtualTimer()
    with clock.use(lambda: t.now):
        yield t


def fair_share(timer: VirtualTimer, detector: Detector, **params: float) -> FlowController:
    cfg = fc_config.FlowControlConfig.defaults()
    cfg.bands[0] = fc_config.BandSpec(10**9, 5000, FairShare("fs", **params), ordering.Fcfs("f"))
    fc, _ = controller(timer, detector, config=cfg)
    return fc


def run(fc: FlowController, flow: str, n: int) -> None:
    """`n` requests of `flow` routed and in flight."""
    for _ in range(n):
        fc.started(request(flow=flow))


def end(fc: FlowController, flow: str) -> None:
    fc.completed(request(flow=flow), RequestOutcome(endpoint=endpoint(), status=200, ok=True))


async def test_an_over_share_tenant_waits_past_its_ceiling_and_the_others_go(timer: VirtualTimer) -> None:
    detector = Detector(0.5)  # past 0.4 x the band's ceiling (1.0), under the ceiling
    fc = fair_share(timer, detector, over_share_ceiling=0.4, over_share_factor=1.5)
    run(fc, "burst", 20)
    run(fc, "steady", 1)  # share: 1.5 x 21 / 2 = 15.75; burst holds 20
    held = asyncio.create_task(fc.admit(request(flow="burst"), 10))
    await settle()
    assert not held.done() and fc.registry.len == 1
    await fc.admit(request(flow="steady"), 10)  # under its share: at once, past the held one
    assert not held.done()
    detector.value = 0.3  # under 0.4: every tenant takes its turn
    await timer.advance(0.01)
    await held
    # Under the ceiling but past 0.4 again: the burst goes once its share is back.
    detector.value = 0.5
    held = asyncio.create_task(fc.admit(request(flow="burst"), 10))
    await timer.advance(0.01)
    assert not held.done()
    for _ in range(16):
        end(fc, "burst")  # 4 in flight against a share of 1.5 x 5 / 2: still over
    await timer.advance(0.01)
    assert not held.done()
    end(fc, "burst")  # 3 against 1.5 x 4 / 2: its share
    await timer.advance(0.01)
    await held


async def test_debug_shows_each_tenants_requests_in_flight(timer: VirtualTimer) -> None:
    fc = fair_share(timer, Detector(0.0))
    run(fc, "burst", 3)
    run(fc, "steady", 1)
    (band,) = fc.snapshot()["bands"]
    assert band["fairness"] == "fair-share-fairness-policy"
    assert band["in_flight"] == {"burst": 3, "steady": 1}


async def test_a_band_holding_its_over_share_tenant_holds_the_lower_bands_too(timer: VirtualTimer) -> None:
    detector = Detector(0.5)
    fc = fair_share(timer, detector)
    run(fc, "burst", 20)
    run(fc, "steady", 1)
    held = asyncio.create_task(fc.admit(request(flow="burst"), 10))
    lower = asyncio.create_task(fc.admit(request(priority=-1, flow="other"), 10))
    await timer.advance(0.01)
    assert not held.done() and not lower.done() and fc.halted == "saturated"
    detector.value = 0.1
    await timer.advance(0.01)
    await held
    await lower


async def test_a_lone_tenant_is_never_over_its_share(timer: VirtualTimer) -> None:
    fc = fair_share(timer, Detector(0.9), over_share_ceiling=0.4, over_share_factor=1.0)
    run(fc, "only", 50)
    await fc.admit(request(flow="only"), 10)
    assert fc.registry.len == 0


async def test_past_the_ceiling_everyone_waits_and_counts_never_go_negative(timer: VirtualTimer) -> None:
    detector = Detector(1.0)
    fc = fair_share(timer, detector)
    held = asyncio.create_task(fc.admit(request(flow="steady"), 10))
    await timer.advance(0.01)
    assert not held.done()
    end(fc, "steady")  # a stream that ends with nothing counted (a band collected meanwhile)
    band = fc.registry.bands[0]
    assert band.state.total == 0 and band.state.inflight == {}
    detector.value = 0.0
    await timer.advance(0.01)
    await held


def test_the_configuration_builds_it_with_its_parameters() -> None:
    text = (
        ON
        + """
plugins:
- type: queue-scorer
- type: fair-share-fairness-policy
  parameters: {overShareCeiling: 0.6, overShareFactor: 1.25}
flowControl:
  defaultPriorityBand: {fairnessPolicyRef: fair-share-fairness-policy}
"""
    )
    policy = config(text).default_band.fairness
    assert isinstance(policy, FairShare)
    assert (policy.over_share_ceiling, policy.over_share_factor) == (0.6, 1.25)
    assert "overShareFactor" in error(text.replace("overShareFactor: 1.25", "overShareFactor: 0.5"))
