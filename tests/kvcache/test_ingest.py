"""epp.kvcache.ingest and epp.kvcache.feed: KV events over real ZMQ sockets into a BlockIndex.

Publishers are `epp.sim.kvpublisher.KVEventPublisher` (vLLM's wire format) or raw sockets for
garbage, all on 127.0.0.1 with ephemeral ports. Every wait is on a condition with a timeout.
What the index holds is read through `BlockIndex.match`, as the scorer reads it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from epp.kvcache import zmqread
from epp.kvcache.access import AccessPolicy
from epp.kvcache.events import BlockRemoved, BlockStored
from epp.kvcache.index import BlockIndex
from epp.kvcache.ingest import FeedSpec, FeedStatus, KVEventIngester
from epp.kvcache.keys import block_keys, seed_for
from epp.observability.metrics import REGISTRY
from epp.sim.kvpublisher import KVEventPublisher

MODEL = "m"
BS = 16
LOCAL = "tcp://127.0.0.1:0"
_hashes = itertools.count(1_000)
_tokens = itertools.count(0, 10_000)
_pods = itertools.count()


def tokens(n_blocks: int) -> list[int]:
    """Tokens of `n_blocks` blocks sharing no block with any other call's."""
    start = next(_tokens)
    return list(range(start, start + n_blocks * BS))


def stored(toks: list[int], parent: int | None = None) -> BlockStored:
    return BlockStored([next(_hashes) for _ in range(len(toks) // BS)], parent, toks, BS)


def held(index: BlockIndex, pod: str, toks: list[int], model: str = MODEL) -> int:
    """Leading blocks of `toks` the index says `pod` holds."""
    found = index.match(block_keys(toks, BS, seed=seed_for(model)), [pod]).get(pod)
    return 0 if found is None else found.blocks


async def eventually(cond: Callable[[], bool], what: str = "condition", limit: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


def metric(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


class Rig:
    """One test's index, ingesters, publishers and raw sockets; all closed at teardown."""

    def __init__(self) -> None:
        self.index = BlockIndex()
        self.ingesters: list[KVEventIngester] = []
        self.publishers: list[KVEventPublisher] = []
        self.ctx = zmq.asyncio.Context()
        self.sockets: list[zmq.asyncio.Socket] = []
        self.state: dict[str, Any] = {}  # what a hypothesis test keeps across its examples

    def publisher(self, *, replay: bool = False, endpoint: str = LOCAL, **kw: Any) -> KVEventPublisher:
        pub = KVEventPublisher(endpoint, replay_endpoint=LOCAL if replay else None, **kw)
        self.publishers.append(pub)
        return pub

    async def ingester(self, *specs: FeedSpec, **kw: Any) -> KVEventIngester:
        ing = KVEventIngester(self.index, **kw)
        self.ingesters.append(ing)
        ing.set_feeds(specs)
        await ing.start()
        return ing

    def socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self.sockets.append(sock)
        return sock

    async def raw_publisher(self) -> tuple[zmq.asyncio.Socket, str]:
        """An XPUB bound to an ephemeral port: for frames no real publisher would send."""
        sock = self.socket(zmq.XPUB)
        sock.bind(LOCAL)
        return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def close(self) -> None:
        for ing in self.ingesters:
            await ing.stop()
        for pub in self.publishers:
            pub.close()
        for sock in self.sockets:
            sock.close()
        self.ctx.term()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    before = asyncio.all_tasks()
    r = Rig()
    try:
        yield r
    finally:
        await r.close()
    await asyncio.sleep(0)
    left = [t.get_name() for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    assert not left, f"tasks left running: {left}"


def spec(pub: KVEventPublisher | None = None, **kw: Any) -> FeedSpec:
    kw.setdefault("pod", f"pod-{next(_pods)}")
    kw.setdefault("model", MODEL)
    if pub is not None:
        kw.setdefault("events", pub.endpoint)
        kw.setdefault("replay", pub.replay_endpoint)
    kw.setdefault("events", None)
    return FeedSpec(**kw)


async def subscribed(*pubs: KVEventPublisher) -> None:
    await eventually(lambda: all(p.subscriptions for p in pubs), "subscriptions")


def status(ing: KVEventIngester, pod: str) -> FeedStatus:
    return ing.status()[pod]


# ---------------------------------------------------------------------------------------------
# Live streams


async def test_a_thousand_pods_fit_in_the_ingesters_context(rig: Rig) -> None:
    """ZMQ's default of 1,023 sockets a context stopped epp at 1,000 pods (2-3 sockets each)."""
    ing = await rig.ingester()
    assert ing._ctx is not None and ing._ctx.get(zmq.MAX_SOCKETS) >= 4_000


@pytest.mark.parametrize(
    ("encoding", "hash_form", "version"),
    [
        ("map", "int", "0.22"),
        ("map", "bytes", "0.22"),
        ("array", "int", "0.22"),
        ("array", "bytes", "0.10.2"),
    ],
)
async def test_live_stream_in_every_encoding(
    rig: Rig, encoding: Literal["map", "array"], hash_form: Literal["int", "bytes"], version: Any
) -> None:
    pub = rig.publisher(encoding=encoding, hash_form=hash_form, array_version=version)
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    first, more = tokens(3), tokens(2)
    a = stored(first)
    b = stored(more, parent=a.block_hashes[-1])
    pub.publish([a])
    pub.publish([b])
    pub.publish([BlockRemoved([b.block_hashes[-1]])])
    await eventually(lambda: status(ing, s.pod).batches == 3)
    assert held(rig.index, s.pod, first + more) == 4
    st_ = status(ing, s.pod)
    assert (st_.connected, st_.last_seq, st_.blocks_stored, st_.blocks_removed) == (True, 2, 5, 1)
    assert (st_.gaps, st_.resets, st_.decode_errors) == (0, 0, 0)
    assert 0 <= st_.last_event_age_s < 5


async def test_model_from_topic_when_the_spec_has_none(rig: Rig) -> None:
    pub = rig.publisher(topic="kv@10.0.0.7:8000@org/model-x")
    s = spec(pub, model="")
    ing = await rig.ingester(s)
    await subscribed(pub)
    toks = tokens(2)
    pub.publish([stored(toks)])
    await eventually(lambda: status(ing, s.pod).batches == 1)
    assert held(rig.index, s.pod, toks, model="org/model-x") == 2


async def test_connected_follows_the_publisher(rig: Rig) -> None:
    pub = rig.publisher()
    s = spec(pub)
    ing = await rig.ingester(s)
    await eventually(lambda: status(ing, s.pod).connected, "handshake")
    pub.close()
    await eventually(lambda: not status(ing, s.pod).connected, "disconnection")


# ---------------------------------------------------------------------------------------------
# Sequence health


@pytest.mark.parametrize("style", ["current", "legacy"])
async def test_gap_repaired_by_replay(rig: Rig, style: Literal["current", "legacy"]) -> None:
    pub = rig.publisher(replay=True, replay_style=style)
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    t1, t2, t3 = tokens(2), tokens(2), tokens(2)
    a = stored(t1)
    b = stored(t2, parent=a.block_hashes[-1])
    pub.publish([a])
    pub.publish([b], deliver=False)  # dropped at the socket, still in the replay buffer
    pub.publish([stored(t3, parent=b.block_hashes[-1])])
    await eventually(lambda: status(ing, s.pod).replays_ok == 1 and status(ing, s.pod).last_seq == 2)
    assert held(rig.index, s.pod, t1 + t2 + t3) == 6  # nothing purged, nothing orphaned
    st_ = status(ing, s.pod)
    assert (st_.gaps, st_.batches, st_.replays_partial, st_.replays_failed) == (1, 3, 0, 0)
    pub.publish([stored(tokens(1))])  # live again after the replay
    await eventually(lambda: status(ing, s.pod).last_seq == 3)


async def test_gap_without_replay_purges_and_rebuilds(rig: Rig) -> None:
    pub = rig.publisher()
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    old, new = tokens(2), tokens(2)
    pub.publish([stored(old)])
    await eventually(lambda: held(rig.index, s.pod, old) == 2)
    pub.drop()
    pub.publish([stored(new)])
    await eventually(lambda: status(ing, s.pod).last_seq == 2)
    assert (held(rig.index, s.pod, old), held(rig.index, s.pod, new)) == (0, 2)
    assert status(ing, s.pod).gaps == 1


async def test_a_storm_of_gaps_and_restarts_logs_a_line_per_interval_not_per_gap(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A publisher that skips a sequence number in every batch (or restarts again and again)
    wrote one INFO line per message: 9,166 lines in 3.8 s. Counted, and logged once per interval."""
    pub = rig.publisher()
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    caplog.set_level(logging.INFO, logger="epp.kvcache")
    for i in range(60):
        if i % 2:
            pub.drop()
        else:
            pub.restart()
        pub.publish([stored(tokens(1))])
    await eventually(lambda: status(ing, s.pod).batches == 60, "every batch applied")
    st_ = status(ing, s.pod)
    assert (st_.gaps, st_.resets) == (30, 29)  # the first message starts the sequence
    lines = [r for r in caplog.records if r.name == "epp.kvcache" and "purged" in r.getMessage()]
    assert 1 <= len(lines) <= 3, [r.getMessage() for r in lines]


async def test_gap_the_replay_no_longer_has_purges(rig: Rig) -> None:
    pub = rig.publisher(replay=True)
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    old, new = tokens(2), tokens(2)
    pub.publish([stored(old)])
    await eventually(lambda: held(rig.index, s.pod, old) == 2)
    pub.drop()  # not in the replay buffer either
    pub.publish([stored(new)])
    await eventually(lambda: status(ing, s.pod).replays_partial == 1)
    assert (held(rig.index, s.pod, old), held(rig.index, s.pod, new)) == (0, 2)
    assert status(ing, s.pod).last_seq == 2


async def test_replay_timeout_purges_then_cooldown_skips_replays(rig: Rig) -> None:
    silent = rig.socket(zmq.ROUTER)  # takes replay requests, never answers
    silent.bind(LOCAL)
    pub = rig.publisher()
    s = spec(pub, replay=silent.getsockopt_string(zmq.LAST_ENDPOINT))
    ing = await rig.ingester(s, replay_timeout=0.2)
    await subscribed(pub)
    t1, t2, t3 = tokens(1), tokens(1), tokens(1)
    pub.publish([stored(t1)])
    await eventually(lambda: held(rig.index, s.pod, t1) == 1)
    pub.drop()
    pub.publish([stored(t2)])
    await eventually(lambda: status(ing, s.pod).replays_failed == 1)
    await eventually(lambda: held(rig.index, s.pod, t2) == 1, "held message applied")
    assert held(rig.index, s.pod, t1) == 0
    pub.drop()
    pub.publish([stored(t3)])  # within the cooldown: purged at once, no replay
    await eventually(lambda: held(rig.index, s.pod, t3) == 1)
    st_ = status(ing, s.pod)
    assert (st_.gaps, st_.replays_failed, held(rig.index, s.pod, t2)) == (2, 1, 0)


async def test_hold_buffer_overflow_fails_the_replay_at_once(rig: Rig) -> None:
    silent = rig.socket(zmq.ROUTER)
    silent.bind(LOCAL)
    pub = rig.publisher()
    s = spec(pub, replay=silent.getsockopt_string(zmq.LAST_ENDPOINT))
    ing = await rig.ingester(s, replay_timeout=60, hold_limit=2)
    await subscribed(pub)
    pub.publish([stored(tokens(1))])
    await eventually(lambda: status(ing, s.pod).batches == 1)
    pub.drop()
    for _ in range(4):  # the gap message and one more are held, then the buffer overflows
        pub.publish([stored(tokens(1))])
    await eventually(lambda: status(ing, s.pod).replays_failed == 1, limit=2)
    last = tokens(1)
    pub.publish([stored(last)])  # seq 6; 4 and 5 were dropped by the overflow: a gap, purged
    await eventually(lambda: held(rig.index, s.pod, last) == 1)
    assert status(ing, s.pod).last_seq == 6


async def test_replays_are_capped(rig: Rig) -> None:
    silent = rig.socket(zmq.ROUTER)
    silent.bind(LOCAL)
    pub_a, pub_b = rig.publisher(), rig.publisher(replay=True)
    a = spec(pub_a, replay=silent.getsockopt_string(zmq.LAST_ENDPOINT))
    b = spec(pub_b)
    ing = await rig.ingester(a, b, replay_timeout=60, max_replays=1)
    await subscribed(pub_a, pub_b)
    for pub in (pub_a, pub_b):
        pub.publish([stored(tokens(1))])
        pub.drop()
    pub_a.publish([stored(tokens(1))])
    await eventually(lambda: status(ing, a.pod).held == 1, "a's replay under way")
    late = tokens(1)
    pub_b.publish([stored(late)])
    await eventually(lambda: status(ing, b.pod).held == 1, "b's gap held")
    await asyncio.sleep(0.1)  # b's replay would answer in ~1 ms if it had a slot
    assert status(ing, b.pod).held == 1 and status(ing, b.pod).replays_partial == 0
    ing.set_feeds([b])  # a leaves: its replay is cancelled and frees the slot
    await eventually(lambda: status(ing, b.pod).replays_partial == 1 and held(rig.index, b.pod, late) == 1)


async def test_publisher_restart_purges(rig: Rig) -> None:
    pub = rig.publisher()
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    old, new = tokens(2), tokens(2)
    pub.publish([stored(old)])
    pub.publish([stored(tokens(1))])
    await eventually(lambda: status(ing, s.pod).last_seq == 1)
    pub.restart()
    pub.publish([stored(new)])
    await eventually(lambda: status(ing, s.pod).resets == 1)
    assert (held(rig.index, s.pod, old), held(rig.index, s.pod, new)) == (0, 2)
    assert status(ing, s.pod).last_seq == 0


async def test_restart_with_replay_catches_up_from_zero(rig: Rig) -> None:
    pub = rig.publisher(replay=True)
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    for _ in range(3):
        pub.publish([stored(tokens(1))])
    await eventually(lambda: status(ing, s.pod).last_seq == 2)
    pub.restart()
    t0, t1 = tokens(1), tokens(1)
    pub.publish([stored(t0)], deliver=False)  # seq 0 never arrives live
    pub.publish([stored(t1)])  # seq 1 <= 2: a restart, and seq 0 is missing: replay from 0
    await eventually(lambda: status(ing, s.pod).replays_ok == 1)
    assert (held(rig.index, s.pod, t0), held(rig.index, s.pod, t1)) == (1, 1)
    assert status(ing, s.pod).resets == 1


@pytest.mark.parametrize("replay", [True, False])
async def test_joining_mid_stream(rig: Rig, replay: bool) -> None:
    pub = rig.publisher(replay=replay)
    early = [tokens(1) for _ in range(3)]
    for toks in early:  # before epp subscribed: lost live, but buffered for replay
        pub.publish([stored(toks)], deliver=False)
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    late = tokens(1)
    pub.publish([stored(late)])
    await eventually(
        lambda: status(ing, s.pod).last_seq == 3 and status(ing, s.pod).replays_ok == int(replay)
    )
    assert held(rig.index, s.pod, late) == 1
    assert [held(rig.index, s.pod, t) for t in early] == [int(replay)] * 3
    st_ = status(ing, s.pod)
    assert (st_.gaps, st_.replays_ok, st_.batches) == (0, int(replay), 4 if replay else 1)
    pub.restart()  # right after the catch-up: seq 0 again is a restart, not a replayed duplicate
    pub.publish([stored(tokens(1))])
    await eventually(lambda: status(ing, s.pod).resets == 1)
    assert held(rig.index, s.pod, late) == 0


async def test_restart_while_a_join_replay_waits_is_a_restart(rig: Rig) -> None:
    # The join replay from 0 must not make the restarted publisher's messages pass for replayed
    # duplicates: live sequence numbers going back are a restart whatever the replay floor.
    silent = rig.socket(zmq.ROUTER)
    silent.bind(LOCAL)
    pub_a, pub_b = rig.publisher(), rig.publisher(replay=True)
    a = spec(pub_a, replay=silent.getsockopt_string(zmq.LAST_ENDPOINT))
    b = spec(pub_b)
    ing = await rig.ingester(a, b, replay_timeout=60, max_replays=1)
    await subscribed(pub_a, pub_b)
    pub_a.publish([stored(tokens(1))])
    pub_a.drop()
    pub_a.publish([stored(tokens(1))])
    await eventually(lambda: status(ing, a.pod).held == 1, "a's replay holding the only slot")
    old = [tokens(1) for _ in range(3)]
    for toks in old[:2]:
        pub_b.publish([stored(toks)], deliver=False)
    pub_b.publish([stored(old[2])])  # seq 2: b joins mid-stream, its replay from 0 waits
    await eventually(lambda: status(ing, b.pod).held == 1, "b's join held")
    pub_b.restart()
    new = [tokens(1) for _ in range(3)]
    pub_b.publish([stored(new[0])])  # seq 0 again, while b's replay is pending
    pub_b.publish([stored(new[1])])
    await eventually(lambda: status(ing, b.pod).resets == 1 and status(ing, b.pod).held == 2)
    ing.set_feeds([b])  # frees the slot: b's replay, of the old publisher, is abandoned
    await eventually(lambda: status(ing, b.pod).last_seq == 1 and status(ing, b.pod).held == 0)
    pub_b.publish([stored(new[2])])  # live after the abandoned replay: applied, not a duplicate
    await eventually(lambda: status(ing, b.pod).last_seq == 2)
    assert [held(rig.index, b.pod, t) for t in old + new] == [0, 0, 0, 1, 1, 1]
    st_ = status(ing, b.pod)
    assert (st_.resets, st_.gaps, st_.replays_ok, st_.replays_partial, st_.replays_failed) == (1, 0, 0, 0, 0)


async def test_restart_abandons_the_replay_under_way(rig: Rig) -> None:
    silent = rig.socket(zmq.ROUTER)  # the old publisher's replay never answers
    silent.bind(LOCAL)
    pub = rig.publisher()
    s = spec(pub, replay=silent.getsockopt_string(zmq.LAST_ENDPOINT))
    ing = await rig.ingester(s, replay_timeout=60)
    await subscribed(pub)
    pub.publish([stored(tokens(1))], deliver=False)
    pub.publish([stored(tokens(1))])  # seq 1: a join, replaying from 0
    await eventually(lambda: status(ing, s.pod).held == 1, "join replay under way")
    pub.restart()
    new = [tokens(1) for _ in range(2)]
    for toks in new:
        pub.publish([stored(toks)])
    # Without waiting for the replay's 60 s timeout, and no failure (no cooldown) counted.
    await eventually(lambda: status(ing, s.pod).last_seq == 1 and status(ing, s.pod).held == 0)
    assert [held(rig.index, s.pod, t) for t in new] == [1, 1]
    st_ = status(ing, s.pod)
    assert (st_.resets, st_.batches, st_.replays_ok, st_.replays_failed) == (1, 2, 0, 0)


async def test_reconnection_to_a_restarted_publisher_rejoins(rig: Rig, tmp_path: Path) -> None:
    # The restarted publisher is already past the old one's last seq when epp reconnects: not a
    # gap to repair on top of the old blocks, a new sequence to join.
    endpoint, replay = f"ipc://{tmp_path}/ev", f"ipc://{tmp_path}/rp"
    old_pub = KVEventPublisher(endpoint, replay_endpoint=replay)
    rig.publishers.append(old_pub)
    s = spec(old_pub)
    ing = await rig.ingester(s)
    await subscribed(old_pub)
    old = [tokens(1) for _ in range(2)]
    for toks in old:
        old_pub.publish([stored(toks)])
    await eventually(lambda: status(ing, s.pod).last_seq == 1)
    old_pub.close()
    await eventually(lambda: not status(ing, s.pod).connected, "disconnection")
    new_pub = KVEventPublisher(endpoint, replay_endpoint=replay)
    rig.publishers.append(new_pub)
    new = [tokens(1) for _ in range(4)]
    for toks in new[:3]:  # published while epp was not connected
        new_pub.publish([stored(toks)], deliver=False)
    await subscribed(new_pub)
    # Purged on reconnection, before the new publisher sends anything.
    await eventually(lambda: held(rig.index, s.pod, old[0]) == 0, "purge at reconnection")
    new_pub.publish([stored(new[3])])  # seq 3 > 1
    await eventually(lambda: status(ing, s.pod).last_seq == 3 and status(ing, s.pod).replays_ok == 1)
    assert [held(rig.index, s.pod, t) for t in old + new] == [0, 0, 1, 1, 1, 1]
    st_ = status(ing, s.pod)
    assert (st_.gaps, st_.resets, st_.replays_partial, st_.connected) == (0, 0, 0, True)


async def test_a_pod_back_in_rotation_is_purged_and_dialled_at_once(rig: Rig, tmp_path: Path) -> None:
    # The pod was down long enough to be excluded; libzmq's backoff has grown to seconds. When its
    # owner says it serves again, its old blocks go at once (no new connection needed) and the SUB
    # dials it then, not at the next backoff step.
    endpoint = f"ipc://{tmp_path}/ev"
    old_pub = KVEventPublisher(endpoint)
    rig.publishers.append(old_pub)
    s, other = spec(old_pub), spec(pod="other")
    ing = await rig.ingester(s, other)
    await subscribed(old_pub)
    old = tokens(2)
    old_pub.publish([stored(old)])
    await eventually(lambda: held(rig.index, s.pod, old) == 2)
    ing.pod_back(s.pod)  # connected throughout: not news, nothing purged
    ing.pod_back(other.pod)  # no publisher configured: nothing to do
    ing.pod_back("unknown")
    assert held(rig.index, s.pod, old) == 2
    old_pub.close()
    await eventually(lambda: not status(ing, s.pod).connected, "disconnection")
    # Refused attempts at 0.1, 0.2, 0.4, 0.8, 1.6 s apart: the next one is ~1.6 s after ~1.5 s.
    await asyncio.sleep(1.7)
    new_pub = KVEventPublisher(endpoint)
    rig.publishers.append(new_pub)
    back = time.monotonic()
    ing.pod_back(s.pod)
    assert held(rig.index, s.pod, old) == 0  # at once, before any connection
    await eventually(lambda: bool(new_pub.subscriptions) and status(ing, s.pod).connected, "redial")
    assert time.monotonic() - back < 1.0
    new = tokens(1)
    new_pub.publish([stored(new)])  # seq 0: the new sequence is joined, not a gap
    await eventually(lambda: held(rig.index, s.pod, new) == 1)
    st_ = status(ing, s.pod)
    assert (st_.last_seq, st_.gaps, st_.connected) == (0, 0, True)


# ---------------------------------------------------------------------------------------------
# Bind mode


async def test_bind_mode_routes_by_topic_and_data_parallel_rank(rig: Rig) -> None:
    p0 = spec(hostport="10.0.0.1:8000", model="")
    p1 = spec(hostport="10.0.0.1:8000", rank=1, model="")
    p2 = spec(hostport="10.0.0.2:8000", model="configured")
    p3 = spec(hostport="10.0.0.3:8000", model="")  # reached by the old `kv@<ip>@<model>` topic
    # Every publisher here sends from 127.0.0.1 for pods at 10.0.0.x: admitted as a network.
    ing = await rig.ingester(p0, p1, p2, p3, bind=LOCAL, access=AccessPolicy.parse("127.0.0.0/8"))
    assert ing.bind_endpoint is not None and not ing.bind_endpoint.endswith(":0")
    pubs = [
        rig.publisher(endpoint=ing.bind_endpoint, topic="kv@10.0.0.1:8000@m1", data_parallel_rank=0),
        rig.publisher(endpoint=ing.bind_endpoint, topic="kv@10.0.0.1:8000@m1", data_parallel_rank=1),
        rig.publisher(endpoint=ing.bind_endpoint, topic="kv@10.0.0.2:8000@ignored"),
        rig.publisher(endpoint=ing.bind_endpoint, topic="kv@10.0.0.3@m3"),
        rig.publisher(endpoint=ing.bind_endpoint, topic="kv@10.9.9.9:1@m"),  # nobody's
    ]
    await subscribed(*pubs)
    toks = [tokens(1) for _ in pubs]
    for pub, t in zip(pubs, toks, strict=True):
        pub.publish([stored(t)])
    await eventually(lambda: ing.unrouted == 1 and all(st_.batches == 1 for st_ in ing.status().values()))
    assert held(rig.index, p0.pod, toks[0], model="m1") == 1
    assert held(rig.index, p1.pod, toks[1], model="m1") == 1
    assert held(rig.index, p0.pod, toks[1], model="m1") == 0  # rank 1's blocks are p1's only
    assert held(rig.index, p2.pod, toks[2], model="configured") == 1
    assert held(rig.index, p3.pod, toks[3], model="m3") == 1
    assert all(st_.connected for st_ in ing.status().values())
    assert metric("epp_kv_events_errors_total", pod="", reason="unknown_topic") is not None


# ---------------------------------------------------------------------------------------------
# Garbage


async def _settled(rig: Rig, raw: zmq.asyncio.Socket, pod: str, seq: int) -> None:
    """Send a valid message with a fresh block on `raw` and wait until the index shows it: every
    message sent before it has then been handled."""
    toks = tokens(1)
    payload = msgspec.msgpack.encode([0.0, [["BlockStored", [next(_hashes)], None, toks, BS]], 0])
    await raw.send_multipart([b"", seq.to_bytes(8, "big"), payload])
    await eventually(lambda: held(rig.index, pod, toks) == 1, "sentinel")


async def test_garbage_frames_are_counted_for_their_pod_only(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    raw, endpoint = await rig.raw_publisher()
    pub = rig.publisher()
    bad, good = spec(events=endpoint), spec(pub)
    ing = await rig.ingester(bad, good)
    assert await asyncio.wait_for(raw.recv(), 5) == b"\x01"  # the subscription
    await subscribed(pub)
    good_tokens = tokens(2)
    pub.publish([stored(good_tokens)])
    await eventually(lambda: held(rig.index, good.pod, good_tokens) == 2)
    with caplog.at_level(logging.WARNING, logger="epp.kvcache"):
        await raw.send_multipart([b"", bytes(8)])
        await raw.send_multipart([b"", bytes(8), b"\x90", b"extra"])
        await raw.send_multipart([b"", b"\x00\x01", b"\x90"])
        await raw.send_multipart([b"", bytes(8), b"\xc1 not msgpack"])
        await _settled(rig, raw, bad.pod, 0)
    st_ = status(ing, bad.pod)
    assert st_.decode_errors == 4 and st_.batches == 1
    for reason, n in (("frames", 2), ("seq", 1), ("decode", 1)):
        assert metric("epp_kv_events_errors_total", pod=bad.pod, reason=reason) == n
    assert held(rig.index, good.pod, good_tokens) == 2
    assert status(ing, good.pod).decode_errors == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad.pod in warnings[0].getMessage()  # rate-limited


_valid_payload = msgspec.msgpack.encode(
    [1.5, [{"type": "BlockStored", "block_hashes": [7], "token_ids": [1] * BS}]]
)


def _mutations(payload: bytes) -> st.SearchStrategy[bytes]:
    def mutate(r: random.Random) -> bytes:
        b = bytearray(payload)
        for _ in range(r.randint(1, 4)):
            b[r.randrange(len(b))] = r.randrange(256)
        return bytes(b[: r.randint(0, len(b))])

    return st.randoms(use_true_random=False).map(mutate)


_msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_frames = st.one_of(
    st.lists(st.binary(max_size=40), min_size=1, max_size=5),
    st.tuples(
        st.binary(max_size=30),
        st.binary(min_size=8, max_size=8),
        st.one_of(
            st.binary(max_size=200), _mutations(_valid_payload), _msgpack_values.map(msgspec.msgpack.encode)
        ),
    ).map(list),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(_frames, min_size=1, max_size=6))
async def test_random_frames_never_hurt_the_loop_or_other_pods(rig: Rig, frames: list[list[bytes]]) -> None:
    # One rig for all examples (function-scoped fixture): the ingester must survive them all.
    state = rig.state
    if not state:
        raw, endpoint = await rig.raw_publisher()
        pub = rig.publisher()
        state.update(raw=raw, good=tokens(3), seq=itertools.count(2**40))
        state["pods"] = (spec(events=endpoint), spec(pub))
        await rig.ingester(*state["pods"])
        assert await asyncio.wait_for(raw.recv(), 5) == b"\x01"
        await subscribed(pub)
        pub.publish([stored(state["good"])])
    bad, good = state["pods"]
    await eventually(lambda: held(rig.index, good.pod, state["good"]) == 3)
    for message in frames:
        await state["raw"].send_multipart(message)
    await _settled(rig, state["raw"], bad.pod, next(state["seq"]))
    assert held(rig.index, good.pod, state["good"]) == 3
    ing = rig.ingesters[0]
    assert status(ing, good.pod).decode_errors == 0 and status(ing, good.pod).batches == 1
    assert all(not t.done() for t in asyncio.all_tasks() if t.get_name().startswith("kv-events"))


# ---------------------------------------------------------------------------------------------
# Reconciliation and metrics


async def test_set_feeds_purges_removed_and_changed_pods(rig: Rig) -> None:
    pub_a, pub_b = rig.publisher(), rig.publisher()
    a, b = spec(pub_a), spec(pub_b)
    ing = await rig.ingester(a, b)
    await subscribed(pub_a, pub_b)
    ta, tb = tokens(2), tokens(2)
    pub_a.publish([stored(ta)])
    pub_b.publish([stored(tb)])
    await eventually(lambda: held(rig.index, a.pod, ta) == 2 and held(rig.index, b.pod, tb) == 2)
    assert metric("epp_kv_events_batches_total", pod=a.pod) == 1
    b2 = FeedSpec(b.pod, "other-model", b.events)
    ing.set_feeds([b2])
    assert set(ing.status()) == {b.pod}
    assert held(rig.index, a.pod, ta) == 0 and held(rig.index, b.pod, tb) == 0  # a gone, b changed
    assert metric("epp_kv_events_batches_total", pod=a.pod) is None
    await eventually(lambda: pub_b.subscriptions >= 2, "resubscription")
    tb2 = tokens(2)
    pub_b.publish([stored(tb2)])
    await eventually(lambda: held(rig.index, b.pod, tb2, model="other-model") == 2)
    with pytest.raises(ValueError, match="duplicate"):
        ing.set_feeds([b2, b2])


async def test_feeds_replaced_again_and_again_keep_reading(rig: Rig) -> None:
    """The loop watches each feed's socket descriptors. A replaced feed's sockets close at once
    while its reader unwinds later; their descriptor numbers may go to the next feed's sockets, and
    the loop must end up watching the new sockets, whatever order the two happen in."""
    # The selector's registrations (asyncio's own attribute: no public way to list them).
    watched = asyncio.get_running_loop()._selector.get_map()  # type: ignore[attr-defined]
    before = len(watched)
    pub = rig.publisher()
    a = spec(pub)
    ing = await rig.ingester(a)
    await subscribed(pub)
    for round_ in range(6):
        model = f"model-{round_}"
        ing.set_feeds([FeedSpec(a.pod, model, a.events)])  # the pod changed: a new feed
        if round_ % 2:
            await asyncio.sleep(0)  # the old reader unwinds before the next change, or not
        toks = tokens(2)
        for _ in range(250):  # a PUB drops what it sends before the new SUB has joined
            pub.publish([stored(toks)])
            await asyncio.sleep(0.01)
            if held(rig.index, a.pod, toks, model=model) == 2:
                break
        assert held(rig.index, a.pod, toks, model=model) == 2, f"round {round_}: nothing read"
        assert len(watched) == before + 2  # the feed's SUB and its monitor, nothing left over
    await ing.stop()
    assert len(watched) == before


async def test_a_flooding_pod_yields_the_loop_between_turns(rig: Rig) -> None:
    """A backlog is drained at most `zmqread.BUDGET` messages a turn of the event loop, so a flooding pod
    cannot hold the loop (and every request waiting on it) for the whole backlog."""
    pub = rig.publisher()
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    total = 3_000
    for _ in range(total):
        pub.publish([stored(tokens(1))])
    time.sleep(0.5)  # noqa: ASYNC251 - the loop held on purpose: the backlog queues in the SUB
    seen: list[int] = []
    deadline = time.monotonic() + 10.0
    while (n := status(ing, s.pod).batches) < total:
        assert time.monotonic() < deadline, f"{n} of {total} batches after 10 s"
        seen.append(n)
        await asyncio.sleep(0)
    steps = [b - a for a, b in itertools.pairwise([*seen, total])]
    assert max(steps) <= zmqread.BUDGET
    assert len([n for n in seen if 0 < n < total]) >= 3  # drained in several turns, not one


async def test_metrics_are_exposed_and_removed(rig: Rig) -> None:
    pub = rig.publisher()
    s = spec(pub)
    ing = await rig.ingester(s)
    await subscribed(pub)
    toks = tokens(3)
    ev = stored(toks)
    pub.publish([ev])
    pub.publish([BlockRemoved(ev.block_hashes[-1:])])
    await eventually(lambda: status(ing, s.pod).batches == 2)
    assert metric("epp_kv_events_batches_total", pod=s.pod) == 2
    assert metric("epp_kv_events_blocks_total", pod=s.pod, kind="stored") == 3
    assert metric("epp_kv_events_blocks_total", pod=s.pod, kind="removed") == 1
    assert metric("epp_kv_events_gaps_total", pod=s.pod) == 0
    assert metric("epp_kv_events_replays_total", pod=s.pod, outcome="ok") == 0
    age = metric("epp_kv_events_last_event_age_seconds", pod=s.pod)
    assert age is not None and 0 <= age < 5
    assert metric("epp_kv_index_entries") == rig.index.stats().entries == 2
    assert metric("epp_kv_index_keys") == 2
    assert metric("epp_kv_index_evictions_total") == 0
    text = generate_latest(REGISTRY).decode()
    assert f'epp_kv_events_resets_total{{pod="{s.pod}"}} 0.0' in text
    await ing.stop()
    assert metric("epp_kv_events_batches_total", pod=s.pod) is None
    assert metric("epp_kv_events_last_event_age_seconds", pod=s.pod) is None
