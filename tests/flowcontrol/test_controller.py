"""The flow controller: holding, dispatch order, budgets, limits, cancellation, shutdown."""

from __future__ import annotations

import asyncio

import pytest

from epp import clock
from epp.api import errors
from epp.bench.policies import POLICIES
from epp.datastore.endpoints import Datastore
from epp.flowcontrol import config as fc_config
from epp.flowcontrol import controller as fc_controller
from epp.flowcontrol import fairness, ordering, usage_limits
from epp.flowcontrol.outcomes import DROPPED_REASON_HEADER
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from tests.flowcontrol.helpers import Detector, VirtualTimer, controller, endpoint, request, settle


@pytest.fixture
def timer() -> VirtualTimer:
    t = VirtualTimer()
    with clock.use(lambda: t.now):
        yield t


async def test_a_request_that_need_not_wait_is_not_queued(timer: VirtualTimer) -> None:
    fc, _ = controller(timer, Detector(0.5))
    await fc.admit(request(), 100)
    assert fc.registry.len == 0
    assert fc.stats.outcomes == {("Dispatched", "0"): 1}


async def test_a_held_request_goes_once_capacity_frees(timer: VirtualTimer) -> None:
    detector = Detector(1.0)
    fc, _ = controller(timer, detector)
    holds: list[float] = []

    async def on_hold(max_wait: float) -> None:
        holds.append(max_wait)

    task = asyncio.create_task(fc.admit(request(), 100, on_hold=on_hold))
    await settle()
    assert not task.done() and fc.registry.len == 1 and fc.registry.bytes == 100
    assert holds == [60.0]
    assert fc.halted == "saturated"
    await timer.advance(0.5)
    assert not task.done()
    detector.value = 0.9
    await timer.advance(0.002)
    assert task.done() and task.result() is None
    assert fc.registry.len == 0 and fc.registry.bytes == 0


async def test_a_critical_request_overtakes_queued_sheddable_ones(timer: VirtualTimer) -> None:
    detector = Detector(1.0)
    fc, _ = controller(timer, detector)
    order: list[str] = []

    async def admit(priority: int, name: str) -> None:
        await fc.admit(request(priority, rid=name), 10)
        order.append(name)

    tasks = [asyncio.create_task(admit(-1, f"batch-{i}")) for i in range(3)]
    await settle()
    tasks.append(asyncio.create_task(admit(10, "critical")))
    await settle()
    detector.value = 0.0
    await timer.advance(0.01)
    await asyncio.gather(*tasks)
    assert order == ["critical", "batch-0", "batch-1", "batch-2"]


async def test_one_request_per_cycle(timer: VirtualTimer) -> None:
    detector = Detector(1.0)
    fc, _ = controller(timer, detector)
    tasks = [asyncio.create_task(fc.admit(request(rid=str(i)), 10)) for i in range(5)]
    await settle()
    detector.value = 0.0
    await timer.advance(0.0025)  # two ticks
    assert sum(t.done() for t in tasks) == 2
    await timer.advance(0.01)
    assert all(t.done() for t in tasks)


async def test_ttl_answers_429_with_the_reason(timer: VirtualTimer) -> None:
    fc, _ = controller(timer, Detector(1.0), default_request_ttl=2.0, no_endpoint_request_ttl=2.0)
    task = asyncio.create_task(fc.admit(request(-1), 10))
    await timer.advance(1.9)
    assert not task.done()
    await timer.advance(0.2)
    exc = task.exception()
    assert isinstance(exc, errors.NoCapacity)
    assert exc.headers == {DROPPED_REASON_HEADER: "rejected-ttl-expired"}
    assert fc.registry.len == 0
    assert fc.stats.dropped == {("-1", "rejected-ttl-expired"): 1}


async def test_scale_from_zero_waits_for_no_endpoint_ttl(timer: VirtualTimer) -> None:
    detector = Detector(0.0)
    fc, pool = controller(timer, detector, pool=[], default_request_ttl=5.0, no_endpoint_request_ttl=30.0)
    waiting = asyncio.create_task(fc.admit(request(rid="waits"), 10))
    await timer.advance(20.0)
    assert not waiting.done() and fc.halted == "no-endpoints"
    pool.append(endpoint())  # a pod came up: the request goes
    await timer.advance(0.002)
    assert waiting.done() and waiting.result() is None
    # Nothing comes up for the next one: 503 after noEndpointRequestTTL.
    pool.clear()
    shed = asyncio.create_task(fc.admit(request(rid="shed"), 10))
    await timer.advance(29.0)
    assert not shed.done()
    await timer.advance(1.5)
    exc = shed.exception()
    assert isinstance(exc, errors.ServiceUnavailable)
    assert exc.headers == {DROPPED_REASON_HEADER: "rejected-no-endpoints"}


async def test_a_change_of_regime_starts_the_budget_afresh(timer: VirtualTimer) -> None:
    detector = Detector(1.0)
    fc, pool = controller(timer, detector, pool=[], default_request_ttl=5.0, no_endpoint_request_ttl=30.0)
    task = asyncio.create_task(fc.admit(request(), 10))
    await timer.advance(10.0)  # past defaultRequestTTL, but the pool is empty
    pool.append(endpoint())  # saturated from now on: 5 s more, from now
    await timer.advance(4.9)
    assert not task.done()
    await timer.advance(0.2)
    assert isinstance(task.exception(), errors.NoCapacity)


async def test_band_limits_refuse_at_once(timer: VirtualTimer) -> None:
    cfg = fc_config.FlowControlConfig.defaults()
    cfg.bands[-1] = fc_config.BandSpec(1000, 2, fairness.GlobalStrict("g"), ordering.Fcfs("f"))
    fc, pool = controller(timer, Detector(1.0), config=cfg)
    held = [asyncio.create_task(fc.admit(request(-1), 10)) for _ in range(2)]
    await settle()
    with pytest.raises(errors.NoCapacity) as info:
        await fc.admit(request(-1), 10)
    assert info.value.headers == {DROPPED_REASON_HEADER: "rejected-saturated"}
    with pytest.raises(errors.NoCapacity):  # bytes
        await fc.admit(request(-1, flow="other"), 1000)
    assert fc.registry.len == 2
    pool.clear()
    fc.config.bands[-1] = cfg.bands[-1]
    with pytest.raises(errors.ServiceUnavailable) as info:
        await fc.admit(request(-1), 10)
    assert info.value.headers == {DROPPED_REASON_HEADER: "rejected-no-endpoints"}
    for task in held:
        task.cancel()
    await settle()


async def test_global_limits(timer: VirtualTimer) -> None:
    fc, _ = controller(timer, Detector(1.0), max_requests=0, max_bytes=0)
    fc.registry.max_bytes = 25
    held = [asyncio.create_task(fc.admit(request(p), 10)) for p in (0, 5)]
    await settle()
    with pytest.raises(errors.NoCapacity):
        await fc.admit(request(7), 10)
    for task in held:
        task.cancel()
    await settle()


async def test_a_client_that_leaves_frees_its_slot_and_bytes(timer: VirtualTimer) -> None:
    fc, _ = controller(timer, Detector(1.0))
    tasks = [asyncio.create_task(fc.admit(request(flow=f"t{i}"), 1000)) for i in range(3)]
    await settle()
    assert (fc.registry.len, fc.registry.bytes) == (3, 3000)
    tasks[1].cancel()
    await settle()
    assert (fc.registry.len, fc.registry.bytes) == (2, 2000)
    assert sorted(fc.registry.bands[0].flows) == ["t0", "t2"]
    assert fc.stats.outcomes[("EvictedContextCancelled", "0")] == 1
    assert sum(n for n, _ in fc.stats.queued.values()) == 2
    for task in tasks:
        task.cancel()
    await settle()
    assert (fc.registry.len, fc.registry.bytes) == (0, 0) and fc.stats.queued == {}


async def test_close_answers_every_held_request_503(timer: VirtualTimer) -> None:
    fc, _ = controller(timer, Detector(1.0))
    task = asyncio.create_task(fc.admit(request(), 10))
    await settle()
    fc.close()
    await settle()
    exc = task.exception()
    assert isinstance(exc, errors.ServiceUnavailable)
    assert exc.headers == {DROPPED_REASON_HEADER: "rejected-shutting-down"}
    with pytest.raises(errors.ServiceUnavailable):
        await fc.admit(request(), 10)


async def test_round_robin_serves_flows_in_turn(timer: VirtualTimer) -> None:
    cfg = fc_config.FlowControlConfig.defaults()
    cfg.bands[0] = fc_config.BandSpec(10**9, 5000, fairness.RoundRobin("rr"), ordering.Fcfs("f"))
    detector = Detector(1.0)
    fc, _ = controller(timer, detector, config=cfg)
    order: list[str] = []

    async def admit(flow: str, i: int) -> None:
        await fc.admit(request(flow=flow), 10)
        order.append(f"{flow}{i}")

    tasks = [asyncio.create_task(admit("a", i)) for i in range(4)]
    tasks += [asyncio.create_task(admit("b", i)) for i in range(2)]
    tasks += [asyncio.create_task(admit("c", 0))]
    await settle()
    detector.value = 0.0
    await timer.advance(0.1)
    await asyncio.gather(*tasks)
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2", "a3"]


async def test_edf_and_slo_deadline_order(timer: VirtualTimer) -> None:
    cfg = fc_config.FlowControlConfig.defaults()
    cfg.bands[0] = fc_config.BandSpec(10**9, 5000, fairness.GlobalStrict("g"), ordering.SloDeadline("s"))
    detector = Detector(1.0)
    fc, _ = controller(timer, detector, config=cfg)
    order: list[str] = []

    async def admit(name: str, slo: float | None) -> None:
        await fc.admit(request(slo_ttft=slo, flow=name), 10)
        order.append(name)

    tasks = [asyncio.create_task(admit("none", None))]
    await timer.advance(0.1)
    tasks.append(asyncio.create_task(admit("loose", 5.0)))
    tasks.append(asyncio.create_task(admit("tight", 0.5)))
    await settle()
    detector.value = 0.0
    await timer.advance(0.1)
    await asyncio.gather(*tasks)
    assert order == ["tight", "loose", "none"]


async def test_soft_reflective_ceiling_gates_the_lower_band_first(timer: VirtualTimer) -> None:
    detector = Detector(0.9)
    fc, _ = controller(timer, detector, usage_limit=usage_limits.SoftReflectiveCeiling("s"))
    fc._band(-1, timer.now)  # two bands: 0 and -1
    await fc.admit(request(0), 10)  # the top band's ceiling is 1.0: never gated below saturation 1
    # 0.9 >= 1 - 0.9: the lower band is open one cycle in round(0.9 / 0.1) = 9.
    task = asyncio.create_task(fc.admit(request(-1), 10))
    await timer.advance(0.0045)
    assert not task.done()
    await timer.advance(0.006)
    assert task.done()


async def test_stale_metrics_are_told_apart_from_load(timer: VirtualTimer) -> None:
    detector = Detector(1.0)
    fc, _ = controller(timer, detector, pool=[endpoint(0), endpoint(1)])
    task = asyncio.create_task(fc.admit(request(), 10))
    await settle()
    assert fc.halted == "saturated"
    detector.stale = 2
    await timer.advance(0.002)
    assert fc.halted == "stale-metrics" and fc.stale == 2
    snapshot = fc.snapshot()
    assert snapshot["dispatch_halted"] == "stale-metrics" and snapshot["queued_requests"] == 1
    task.cancel()
    await settle()


async def test_saturation_is_per_stage(timer: VirtualTimer) -> None:
    class ByRole(Detector):
        def saturation(self, endpoints):  # type: ignore[no-untyped-def]
            return 1.2 if any(ep.spec.labels.get("llm-d.ai/role") == "prefill" for ep in endpoints) else 0.3

    fc, _ = controller(timer, ByRole(), pool=[endpoint(0, "prefill"), endpoint(1, "decode")])
    task = asyncio.create_task(fc.admit(request(), 10))
    await settle()
    assert fc.saturations == {"prefill": 1.2, "decode": 0.3, "effective": 1.2}
    assert not task.done()
    task.cancel()
    await settle()


@pytest.mark.parametrize(
    ("policy", "reads"),
    [("gie-approx", False), ("flow-control", False), ("llm-d-flow-control", True)],
)
def test_flow_control_dispatches_on_the_scrapes_only_with_a_detector_reading_them(
    policy: str, reads: bool
) -> None:
    """Where it does, epp serve and fast mode read every busy pod at the base interval
    (epp.datastore.pacing's booked pace is off)."""
    ds = Datastore()
    text = POLICIES[policy].config_text()
    cfg = sched_config.load_config(text, Handle(datastore=ds), allow_experimental=True)
    _, flow, _ = fc_controller.from_scheduler_config(cfg, ds.candidates)
    assert (flow is not None) == (policy != "gie-approx")
    assert fc_controller.dispatch_reads_scrapes(flow) is reads
