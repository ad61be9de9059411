"""The routing gate (epp.extproc.backlog): routes in arrival order, a bounded wait answered 503
at once, slots given back on every path (done, refused, cancelled, held by flow control)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from epp.extproc import backlog
from epp.extproc.backlog import RoutingGate
from epp.extproc.limits import StreamGuard, StreamLimits
from epp.extproc.stream import Stream
from epp.observability import metrics
from tests.extproc import helpers as h

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def test_routes_wait_their_turn_in_arrival_order() -> None:
    gate = RoutingGate(slots=1, max_wait=0)
    assert await gate.enter()
    order: list[int] = []

    async def route(i: int) -> None:
        assert await gate.enter()
        order.append(i)
        await asyncio.sleep(0)
        gate.leave()

    waiting0 = metrics.routing_waiting._value.get()
    waiters = [asyncio.create_task(route(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert order == [] and gate.ahead == 6
    assert metrics.routing_waiting._value.get() == waiting0 + 5
    gate.leave()
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2, 3, 4]
    assert gate.ahead == 0 and metrics.routing_waiting._value.get() == waiting0


async def test_a_request_that_would_wait_too_long_is_refused_at_once() -> None:
    gate = RoutingGate(slots=1, max_wait=0.25, cost=0.1)
    assert await gate.enter()  # running
    waiting = [asyncio.create_task(gate.enter()) for _ in range(2)]  # waits 0.1 s, 0.2 s
    await asyncio.sleep(0)
    assert gate.full() and gate.wait_estimate() == pytest.approx(0.3)
    t0 = time.monotonic()
    assert not await gate.enter()
    assert time.monotonic() - t0 < 0.05
    assert gate.ahead == 3  # the refused one took no place
    for _ in waiting:
        gate.leave()
    assert all(await asyncio.gather(*waiting))
    gate.leave()
    assert gate.ahead == 0 and not gate.full()


async def test_a_cancelled_waiter_gives_up_its_place_and_a_handed_slot_passes_on() -> None:
    gate = RoutingGate(slots=1, max_wait=0)
    assert await gate.enter()
    first = asyncio.create_task(gate.enter())
    second = asyncio.create_task(gate.enter())
    await asyncio.sleep(0)
    first.cancel()  # the client left while waiting
    await asyncio.sleep(0)
    assert gate.ahead == 2
    gate.leave()
    assert await second
    gate.leave()
    assert gate.ahead == 0
    # handed the slot, cancelled before it ran: the slot goes on to the next one
    assert await gate.enter()
    third = asyncio.create_task(gate.enter())
    fourth = asyncio.create_task(gate.enter())
    await asyncio.sleep(0)
    gate.leave()  # hands the slot to `third`
    third.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
    assert await fourth
    gate.leave()
    assert gate.ahead == 0


async def test_the_cost_per_route_is_learned_from_the_loop_threads_cpu(monkeypatch: Any) -> None:
    monkeypatch.setattr(backlog, "SAMPLE_S", 0.05)
    gate = RoutingGate(slots=4, max_wait=1.0, cost=0.1)
    for _ in range(600):  # 1.2 s of routes of 2 ms: ~24 samples of ~25 routes
        assert await gate.enter()
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.002:
            pass
        gate.leave()
    await asyncio.sleep(0.06)
    gate._sample()  # the routes since the last sample
    assert 0.0019 < gate.cost < 0.004
    learned = gate.cost
    # an idle interval (and one with fewer than MIN_ROUTES routes) teaches nothing
    await asyncio.sleep(0.06)
    gate._sample()
    assert await gate.enter()
    gate.leave()
    await asyncio.sleep(0.06)
    gate._sample()
    assert gate.cost == learned


async def test_while_requests_wait_the_drain_rate_is_the_cost_io_included(monkeypatch: Any) -> None:
    """Routes waiting on I/O (a pod's /render hanging) cost the loop nothing, yet drain slowly:
    while requests wait, the wall time per route is what a newcomer waits for."""
    monkeypatch.setattr(backlog, "SAMPLE_S", 0.1)
    monkeypatch.setattr(backlog, "MIN_ROUTES", 4)
    gate = RoutingGate(slots=2, max_wait=0.2, cost=0.001)

    async def route() -> bool:
        if not await gate.enter():
            return False
        await asyncio.sleep(0.05)  # two at a time: 40 routes a second
        gate.leave()
        return True

    routes = [asyncio.create_task(route()) for _ in range(30)]
    await asyncio.sleep(0.45)
    assert 0.015 < gate.cost < 0.035
    assert not await route()  # ~10 waiting: past 0.2 s
    assert all(await asyncio.gather(*routes))


def test_bad_gate_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RoutingGate(slots=0)
    with pytest.raises(ValueError):
        StreamLimits(max_routing_wait=-1)


async def _routed(stream: Stream, mode: int = h.BUFFERED) -> list[Any]:
    out = await h.answer(stream, h.headers_msg(h.post_headers(), mode=mode))
    if out and out[0].HasField("immediate_response"):
        return out
    return await h.answer(stream, h.body_msg(CHAT))


@pytest.mark.parametrize("mode", [h.BUFFERED, h.DUPLEX])
async def test_past_the_wait_a_stream_is_answered_503_naming_the_flag(mode: int, monkeypatch: Any) -> None:
    monkeypatch.setattr(backlog, "SAMPLE_S", 1e9)  # keep the cost this test sets
    director, _ = h.make_director()
    guard = StreamGuard(StreamLimits(max_routing_wait=0.5, routing_slots=4))
    gate = guard.routing
    gate.cost = 1.0
    for _ in range(4):  # every slot taken by routes in progress
        assert await gate.enter()
    stream = Stream(director, guard)
    out = await _routed(stream, mode)
    assert out[0].immediate_response.status.code == 503
    assert b"--max-routing-wait" in out[0].immediate_response.body
    stream.close()
    assert guard.streams == 0 and gate.ahead == 4
    for _ in range(4):
        gate.leave()
    # with the slots free the same request is routed, and its slot comes back
    stream = Stream(director, guard)
    out = await _routed(stream, mode)
    assert not out[0].HasField("immediate_response")
    assert gate.ahead == 0
    stream.close()


async def test_a_request_refused_at_its_body_gives_back_nothing_it_did_not_take(monkeypatch: Any) -> None:
    """Admitted at its headers, refused when its body came: the burst filled the gate between."""
    monkeypatch.setattr(backlog, "SAMPLE_S", 1e9)
    director, _ = h.make_director()
    guard = StreamGuard(StreamLimits(max_routing_wait=0.5, routing_slots=4))
    gate = guard.routing
    gate.cost = 1.0
    stream = Stream(director, guard)
    assert not (await h.answer(stream, h.headers_msg(h.post_headers(), mode=h.BUFFERED)))[0].HasField(
        "immediate_response"
    )
    for _ in range(4):
        assert await gate.enter()
    out = await h.answer(stream, h.body_msg(CHAT))
    assert out[0].immediate_response.status.code == 503
    stream.close()
    assert gate.ahead == 4 and guard.streams == 0 and guard.buffered == 0


async def test_a_request_flow_control_holds_gives_its_slot_to_the_next() -> None:
    director, _ = h.make_director()
    guard = StreamGuard(StreamLimits(routing_slots=1))
    gate = guard.routing
    released = asyncio.Event()
    route = director.route

    async def held_route(**kw: Any) -> Any:
        await kw["on_hold"](10.0)  # as the flow controller calls it when it queues the request
        await released.wait()
        return await route(**kw)

    director.route = held_route  # type: ignore[method-assign]
    held = Stream(director, guard)
    holding = asyncio.create_task(_routed(held))
    await asyncio.sleep(0.01)
    assert gate.ahead == 0  # held: not routing
    director.route = route  # type: ignore[method-assign]
    other = Stream(director, guard)
    out = await asyncio.wait_for(_routed(other), 5)  # the only slot was given back
    assert not out[0].HasField("immediate_response")
    released.set()
    out = await holding
    assert not out[-1].HasField("immediate_response")
    assert gate.ahead == 0
    held.close()
    other.close()
