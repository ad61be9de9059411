"""`SimFleet.restart`: a replica's container restart, as the rolling-restart workload drives it.

While it is down its requests in flight are cut and its port refuses connections; then it serves
again on the same HTTP address and KV-event endpoint, with an empty prefix cache and its event
sequence from 0. The fleet's counters keep what it served before.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import zmq

from epp.kvcache.events import AllBlocksCleared, BlockStored, decode_batch
from epp.sim.engine import SimConfig
from epp.sim.fleet import SimFleet

PROMPT = "The quick brown fox jumps over the lazy dog. " * 40  # ~400 tokens: 25 blocks of 16


async def _complete(http: aiohttp.ClientSession, url: str, max_tokens: int = 2) -> int:
    """One completion; its cached prompt tokens."""
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": max_tokens}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        usage = (await r.json())["usage"]
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def _stream(http: aiohttp.ClientSession, url: str) -> str:
    """A long streamed completion read to its end: "ok", or the error that cut it."""
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 5000, "stream": True}
    try:
        async with http.post(url + "/v1/completions", json=body) as r:
            async for _ in r.content:
                pass
    except aiohttp.ClientError as exc:
        return type(exc).__name__
    return "ok"


def _received(sub: zmq.Socket[bytes], within: float) -> list[tuple[int, list[object]]]:
    """(sequence number, events) of every batch that arrives within `within` seconds."""
    out: list[tuple[int, list[object]]] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if sub.poll(20):
            _topic, seq, payload = sub.recv_multipart()
            out.append((int.from_bytes(seq, "big"), list(decode_batch(payload).events)))
    return out


@pytest.mark.timeout(60)
async def test_a_restart_cuts_refuses_then_serves_cold_on_the_same_endpoints() -> None:
    configs = [SimConfig(name="pod-0", kv_events="tcp://127.0.0.1:0", kv_replay="tcp://127.0.0.1:0")]
    configs.append(SimConfig(name="pod-1"))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        with SimFleet(configs) as fleet:
            url = f"http://{fleet.addresses[0]}"
            kv, replay = fleet.kv_endpoints[0], fleet.kv_replay_endpoints[0]
            assert kv is not None
            sub.connect(kv)
            deadline = time.monotonic() + 5
            while fleet.kv_subscriptions()[0] < 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            # A connection per request: a kept-alive one would be reset, not refused.
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
                assert await _complete(http, url) == 0
                assert await _complete(http, url) > 0  # warm
                before = _received(sub, 0.3)
                assert before and any(isinstance(e, BlockStored) for _, es in before for e in es)
                long = asyncio.create_task(_stream(http, url))
                await asyncio.sleep(0.3)
                assert not long.done()

                restart = fleet.restart(0, down_s=1.5)
                assert await asyncio.wait_for(long, 5) != "ok"  # cut, not finished
                with pytest.raises(aiohttp.ClientConnectorError):  # nothing listens meanwhile
                    await _complete(http, url)
                await asyncio.wrap_future(restart)

                assert fleet.restarts == [1, 0]
                assert fleet.addresses[0] == url.removeprefix("http://")
                # Its SUB, connected to the old publisher, reconnects to the new one by itself
                # (libzmq acts on the lost connection when the SUB's owner next calls it: poll).
                deadline = time.monotonic() + 5
                while fleet.kv_subscriptions()[0] < 1:
                    assert time.monotonic() < deadline
                    sub.poll(0)
                    await asyncio.sleep(0.01)
                assert await _complete(http, url) == 0  # the cache is empty
                after = _received(sub, 0.5)
                assert after and after[0][0] == 0  # the sequence starts again
                assert not any(isinstance(e, AllBlocksCleared) for _, es in after for e in es)
                assert await _complete(http, url) > 0
            stats = fleet.stats()
            # Before: 2 completions and the cut stream's; after: 2.
            assert stats[0]["completed"] >= 4 and stats[0]["prefix_cache_hits"] > 0
            assert fleet.kv_replay_endpoints[0] == replay
            fleet.reset()
            assert fleet.stats()[0]["completed"] == 0
    finally:
        sub.close(linger=0)
        ctx.term()


def test_restart_names_a_replica_of_the_fleet() -> None:
    with SimFleet([SimConfig(name="pod-0")]) as fleet, pytest.raises(IndexError, match="no replica 1"):
        fleet.restart(1, down_s=0.1)


def test_a_replica_restarts_once_at_a_time_and_a_stop_leaves_it_down() -> None:
    fleet = SimFleet([SimConfig(name="pod-0")])
    fleet.start()
    try:
        first = fleet.restart(0, down_s=30.0)
        second = fleet.restart(0, down_s=0.1)
        with pytest.raises(RuntimeError, match="replica 0 is already restarting"):
            second.result(timeout=5)
    finally:
        started = time.monotonic()
        fleet.stop()
    assert time.monotonic() - started < 10  # not the 30 s down
    assert first.cancelled() and fleet.restarts == [0]
