"""Closed doors on the KV-event ingester: who may publish in bind mode, frame sizes, held bytes,
and the count of out-of-order batches. Real ZMQ sockets on 127.0.0.x (Linux routes all of
127.0.0.0/8 to loopback, so a socket can send from 127.0.0.2 by naming it as its source)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq
import zmq.asyncio

from epp.kvcache.access import AccessPolicy, PeerCheck
from epp.kvcache.ingest import FeedSpec, KVEventIngester
from tests.kvcache.test_ingest import (
    BS,
    LOCAL,
    Rig,
    eventually,
    held,
    metric,
    spec,
    status,
    stored,
    subscribed,
    tokens,
)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        await r.close()


def batch(toks: list[int], *, trailer: bytes | None = None) -> bytes:
    """A vLLM batch storing `toks`; `trailer` pads it with an extra field decoders skip."""
    body: list[object] = [0.0, [["BlockStored", [hash(tuple(toks)) & 0xFFFF_FFFF], None, toks, BS]], 0]
    if trailer is not None:
        body.append(trailer)
    return msgspec.msgpack.encode(body)


async def sender(rig: Rig, ing: KVEventIngester, source: str = "127.0.0.1") -> zmq.asyncio.Socket:
    """An XPUB connected to the bound socket from `source` (it sees the SUB's subscription)."""
    sock = rig.socket(zmq.XPUB)
    assert ing.bind_endpoint is not None
    port = ing.bind_endpoint.rsplit(":", 1)[1]
    sock.connect(f"tcp://{source}:0;127.0.0.1:{port}")
    return sock


async def admitted(sock: zmq.asyncio.Socket, within: float = 1.0) -> bool:
    """Whether the SUB subscribed through this connection (it does only once admitted). A
    refusal is waited for `within`; an expected admission gets longer (a loaded CI machine)."""
    try:
        return await asyncio.wait_for(sock.recv(), within) == b"\x01"
    except TimeoutError:
        return False


async def send(sock: zmq.asyncio.Socket, topic: str, seq: int, payload: bytes) -> None:
    await sock.send_multipart([topic.encode(), seq.to_bytes(8, "big"), payload])


def bind_pod(host: str) -> FeedSpec:
    return spec(hostport=f"{host}:8000", model="m", events=None)


# --- who may publish --------------------------------------------------------------------------------


async def test_a_stranger_cannot_publish_into_a_pods_index(rig: Rig) -> None:
    pod = bind_pod("10.0.0.1")  # the pool's only pod is elsewhere; the sender is 127.0.0.1
    ing = await rig.ingester(pod, bind=LOCAL)
    raw = await sender(rig, ing)
    assert not await admitted(raw)
    toks = tokens(1)
    for seq in range(20):
        await send(raw, "kv@10.0.0.1:8000@m", seq, batch(toks))
    await eventually(lambda: (metric("epp_kv_events_errors_total", pod="", reason="peer_denied") or 0) >= 1)
    await asyncio.sleep(0.2)
    assert held(rig.index, pod.pod, toks, model="m") == 0
    assert status(ing, pod.pod).batches == 0


async def test_a_pod_publishes_for_itself_only(rig: Rig) -> None:
    a, b = bind_pod("127.0.0.1"), bind_pod("127.0.0.2")
    ing = await rig.ingester(a, b, bind=LOCAL)
    from_a, from_b = await sender(rig, ing, "127.0.0.1"), await sender(rig, ing, "127.0.0.2")
    assert await admitted(from_a, 10) and await admitted(from_b, 10)
    forged, own_a, own_b = tokens(1), tokens(1), tokens(1)
    await send(from_a, "kv@127.0.0.2:8000@m", 0, batch(forged))  # a writes as b: dropped
    await send(from_a, "kv@127.0.0.1:8000@m", 0, batch(own_a))
    await send(from_b, "kv@127.0.0.2:8000@m", 0, batch(own_b))
    await eventually(
        lambda: held(rig.index, a.pod, own_a, "m") == 1 and held(rig.index, b.pod, own_b, "m") == 1
    )
    assert held(rig.index, b.pod, forged, "m") == 0
    assert metric("epp_kv_events_errors_total", pod="", reason="peer_mismatch") == 1
    assert status(ing, b.pod).batches == 1


async def test_a_pod_is_admitted_once_it_joins_the_pool(rig: Rig) -> None:
    ing = await rig.ingester(bind_pod("10.0.0.1"), bind=LOCAL)
    raw = await sender(rig, ing)
    assert not await admitted(raw)
    joined = bind_pod("127.0.0.1")
    ing.set_feeds([bind_pod("10.0.0.1"), joined])
    # A refused handshake times out after 2 s and the sender tries again (room for a slow CI).
    for _ in range(10):
        if await admitted(raw):
            break
    else:
        raise AssertionError("not admitted after joining the pool")
    toks = tokens(1)
    await send(raw, "kv@127.0.0.1:8000@m", 0, batch(toks))
    await eventually(lambda: held(rig.index, joined.pod, toks, "m") == 1)


async def test_admitted_networks_and_any(rig: Rig) -> None:
    pod = bind_pod("10.0.0.1")
    for policy in ("127.0.0.0/8", "any"):
        ing = await rig.ingester(pod, bind=LOCAL, access=AccessPolicy.parse(policy))
        raw = await sender(rig, ing)
        assert await admitted(raw, 10), policy
        toks = tokens(1)
        await send(raw, "kv@10.0.0.1:8000@m", 0, batch(toks))
        await eventually(lambda t=toks: held(rig.index, pod.pod, t, "m") == 1)  # type: ignore[misc]
        await ing.stop()


def test_access_policy_parsing() -> None:
    assert str(AccessPolicy.parse("pool")) == "pool"
    assert str(AccessPolicy.parse("pool, 10.1.0.0/16,10.2.3.4")) == "pool,10.1.0.0/16,10.2.3.4/32"
    assert AccessPolicy.parse("any").any
    assert not AccessPolicy.parse("10.0.0.0/8").pool
    for bad in ("", "pool,any", "somewhere", "10.0.0.0/33"):
        with pytest.raises(ValueError):
            AccessPolicy.parse(bad)
    check = PeerCheck(AccessPolicy.parse("pool,192.168.0.0/16"))
    check.set_pods(["10.0.0.1", "[fd00::1]", "pod.example"])
    assert check.admits("10.0.0.1") and check.admits("fd00::1") and check.admits("::ffff:10.0.0.1")
    assert check.admits("192.168.4.4") and not check.admits("10.0.0.2") and not check.admits("garbage")
    assert check.may_publish("10.0.0.1", "10.0.0.1") and not check.may_publish("10.0.0.1", "10.0.0.9")
    assert check.may_publish("192.168.4.4", "10.0.0.9") and not check.may_publish(None, "10.0.0.1")


# --- sizes ------------------------------------------------------------------------------------------


async def test_a_frame_over_the_size_limit_never_reaches_the_index(rig: Rig) -> None:
    pod = bind_pod("127.0.0.1")
    ing = await rig.ingester(pod, bind=LOCAL)  # the default limit: 16 MiB
    raw = await sender(rig, ing)
    assert await admitted(raw, 10)
    big = tokens(1)
    await send(raw, "kv@127.0.0.1:8000@m", 0, batch(big, trailer=bytes(20 << 20)))
    # libzmq closes the connection on the oversized frame; the sender reconnects and goes on.
    # Sequence numbers go on rising: a repeated one would pass for a restart and purge the pod.
    small = tokens(1)
    for seq in range(1, 101):
        await send(raw, "kv@127.0.0.1:8000@m", seq, batch(small))
        await asyncio.sleep(0.05)
        if held(rig.index, pod.pod, small, "m") == 1:
            break
    assert held(rig.index, pod.pod, small, "m") == 1
    assert held(rig.index, pod.pod, big, "m") == 0


async def test_connect_mode_an_oversized_frame_costs_that_frame_not_the_subscription(rig: Rig) -> None:
    """Connect mode: one frame over the cap closed epp's subscription for good, and the pod's
    entries stayed, stale, for ever. Now the SUB connects again, the pod's entries are purged
    (what the lost frame removed is unknown), and the feed goes on with the next batches."""
    raw = rig.socket(zmq.XPUB)
    raw.bind(LOCAL)
    pod = spec(events=raw.getsockopt_string(zmq.LAST_ENDPOINT))
    ing = await rig.ingester(pod, max_message_bytes=64 << 10)
    assert await admitted(raw, 10)
    before = tokens(1)
    await send(raw, "kv@m", 0, batch(before))
    await eventually(lambda: held(rig.index, pod.pod, before, "m") == 1)
    await send(raw, "kv@m", 1, batch(tokens(1), trailer=bytes(128 << 10)))  # over the cap
    await eventually(lambda: held(rig.index, pod.pod, before, "m") == 0, "the pod purged", limit=10)
    after = tokens(1)
    for seq in range(2, 200):  # the publisher goes on; the SUB is back within its reconnect interval
        await send(raw, "kv@m", seq, batch(after))
        await asyncio.sleep(0.05)
        if held(rig.index, pod.pod, after, "m") == 1:
            break
    assert held(rig.index, pod.pod, after, "m") == 1
    assert status(ing, pod.pod).connected


async def test_held_bytes_are_bounded(rig: Rig) -> None:
    silent = rig.socket(zmq.ROUTER)  # takes the replay request, never answers
    silent.bind(LOCAL)
    pub = rig.publisher()
    s = spec(pub, replay=silent.getsockopt_string(zmq.LAST_ENDPOINT))
    ing = await rig.ingester(s, replay_timeout=60, hold_bytes=4096)
    await subscribed(pub)
    pub.publish([stored(tokens(1))])
    await eventually(lambda: status(ing, s.pod).batches == 1)
    pub.drop()
    for _ in range(8):  # ~1 KB each: the budget overflows after a few, failing the replay at once
        pub.publish([stored(tokens(16))])
    await eventually(lambda: status(ing, s.pod).replays_failed == 1, limit=2)
    assert status(ing, s.pod).held_bytes <= 4096 + 2048


# --- counting --------------------------------------------------------------------------------------


async def test_out_of_order_batches_are_counted(rig: Rig) -> None:
    pub = rig.publisher(replay=True)
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    t1, t2, t3 = tokens(1), tokens(1), tokens(1)
    pub.publish([stored(t1)])
    pub.publish([stored(t2)], deliver=False)  # a gap: the replay brings seq 1 and 2 ...
    pub.publish([stored(t3)])  # ... so the live seq 2, held meanwhile, is a duplicate
    await eventually(lambda: status(ing, s.pod).replays_ok == 1 and status(ing, s.pod).last_seq == 2)
    await eventually(lambda: status(ing, s.pod).out_of_order >= 1)
    assert (
        metric("epp_kv_events_errors_total", pod=s.pod, reason="out_of_order")
        == status(ing, s.pod).out_of_order
    )
