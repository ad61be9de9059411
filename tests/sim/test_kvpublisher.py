"""epp.sim.kvpublisher: vLLM's KV-event wire format, byte for byte, over real ZMQ sockets.

- conformance: the decoded events of frames captured from a real vLLM 0.32
  (tests/kvcache/data/vllm-0.32-cpu-capture-1.json) re-encode to the captured bytes, and are sent
  as the captured frames; the byte example of the reference notes (kv-events.md, section 8);
- every array layout from vLLM 0.9 to 0.23, both hash forms, decoded back by epp's decoder;
- transport: bind/connect rule, live frames, replay in both reply styles, replayable vs lost gaps,
  restart, buffer bound, malformed replay requests.

Sockets are blocking with receive timeouts: nothing waits on a fixed sleep.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest
import zmq

from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch
from epp.sim import kvpublisher
from epp.sim.kvpublisher import END_SEQ, KVEventPublisher

VECTORS = Path(__file__).resolve().parents[1] / "kvcache" / "data" / "vllm-0.32-cpu-capture-1.json"
LOCAL = "tcp://127.0.0.1:0"
TS = 1767225600.5
TIMEOUT_MS = 5_000


@cache
def captures() -> dict[str, list[dict[str, Any]]]:
    data = json.loads(VECTORS.read_text())
    return {c["name"]: c["messages"] for c in data["captures"]}


class Sockets:
    """Test-side sockets, all closed at teardown (a socket collected unclosed is a
    ResourceWarning, an error here)."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.open: list[zmq.Socket[bytes]] = []

    def socket(self, kind: int) -> zmq.Socket[bytes]:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self.open.append(sock)
        return sock

    def close(self) -> None:
        for sock in self.open:
            sock.close()
        self.ctx.term()


@pytest.fixture
def ctx() -> Iterator[Sockets]:
    sockets = Sockets()
    yield sockets
    sockets.close()


def subscriber(ctx: Sockets, pub: KVEventPublisher) -> zmq.Socket[bytes]:
    """A SUB connected to `pub`, returned once `pub` has its subscription (a PUB drops whatever
    it sends before). Polling the SUB is what lets it send the subscription."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    sub.connect(pub.endpoint)
    for _ in range(TIMEOUT_MS // 5):
        if pub.subscriptions:
            return sub
        sub.poll(5)
    raise TimeoutError("no subscription reached the publisher")


def dealer(ctx: Sockets, pub: KVEventPublisher) -> zmq.Socket[bytes]:
    assert pub.replay_endpoint is not None
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    sock.connect(pub.replay_endpoint)
    return sock


def replay(sock: zmq.Socket[bytes], start: int) -> list[list[bytes]]:
    """Every reply to a replay request from `start`, end marker included."""
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    replies = [sock.recv_multipart()]
    while END_SEQ not in replies[-1]:
        replies.append(sock.recv_multipart())
    return replies


def stored(first_hash: int, n: int = 2, parent: int | None = None) -> BlockStored:
    return BlockStored(
        list(range(first_hash, first_hash + n)),
        parent,
        list(range(n * 16)),
        16,
        medium="gpu",
        extra_keys=[None] * n,
        group_idx=0,
    )


# ---------------------------------------------------------------------------------------------
# Conformance


@pytest.mark.parametrize("capture", ["A_sha256_default", "B_sha256_cbor_seed0"])
def test_decoded_real_frames_reencode_to_the_same_bytes(capture: str) -> None:
    pub = KVEventPublisher(LOCAL, topic="kv-events")
    try:
        for m in captures()[capture]:
            raw = bytes.fromhex(m["payload_hex"])
            batch = decode_batch(raw)
            assert pub.encode(batch.events, batch.ts) == raw
    finally:
        pub.close()


def test_real_frames_are_sent_as_captured(ctx: Sockets) -> None:
    messages = captures()["A_sha256_default"]
    with KVEventPublisher(LOCAL, topic="kv-events") as pub:
        sub = subscriber(ctx, pub)
        for m in messages:
            batch = decode_batch(bytes.fromhex(m["payload_hex"]))
            pub.publish(batch.events, batch.ts)
        for m in messages:
            topic, seq, payload = sub.recv_multipart()
            assert (topic.hex(), seq.hex(), payload.hex()) == (m["topic_hex"], m["seq_hex"], m["payload_hex"])


def _digest_shape(value: Any) -> Any:
    """A decoded msgpack value with each bytes value reduced to (length, last 8 bytes)."""
    if isinstance(value, bytes):
        return (len(value), value[-8:])
    if isinstance(value, list):
        return [_digest_shape(v) for v in value]
    if isinstance(value, dict):
        return {k: _digest_shape(v) for k, v in value.items()}
    return value


def test_bytes_hash_form_matches_real_digest_frames_but_for_the_unknowable_bytes() -> None:
    # epp keeps the low 64 bits of a digest, so the other 24 bytes cannot be reproduced; all else is.
    with KVEventPublisher(LOCAL, topic="kv-events", hash_form="bytes") as pub:
        for m in captures()["C_sha256_default_bytes_hashes"]:
            raw = bytes.fromhex(m["payload_hex"])
            batch = decode_batch(raw)
            ours = pub.encode(batch.events, batch.ts)
            assert len(ours) == len(raw)
            assert _digest_shape(msgspec.msgpack.decode(ours)) == _digest_shape(msgspec.msgpack.decode(raw))
            assert decode_batch(ours) == batch


REFERENCE_EVENT = BlockStored(
    block_hashes=[8392945856873723412],
    parent_block_hash=13356853646056301512,
    token_ids=list(range(2000, 2016)),
    block_size=16,
    medium="gpu",
    extra_keys=[None],
    group_idx=0,
)


def test_reference_byte_example_map_and_array_forms() -> None:
    # kv-events.md section 8: 242 bytes in map form, 121 in the 0.22-0.23 array form.
    with KVEventPublisher(LOCAL) as pub:
        payload = pub.encode([REFERENCE_EVENT], TS)
    assert len(payload) == 242
    assert payload[:12].hex() == "93cb41da556e40200000918b"
    assert payload[43:52].hex() == "cf7479bbca020b7614" and payload[-1] == 0
    with KVEventPublisher(LOCAL, encoding="array") as pub:
        payload = pub.encode([REFERENCE_EVENT], TS)
    assert len(payload) == 121
    assert payload[:12].hex() == "93cb41da556e40200000919c"
    assert payload.endswith(bytes.fromhex("91c000ae") + b"full_attention" + bytes.fromhex("c000"))


@pytest.mark.parametrize("version", sorted(kvpublisher.ARRAY_FIELDS))
@pytest.mark.parametrize("hash_form", ["int", "bytes"])
def test_array_layouts_of_each_vllm_version(
    version: kvpublisher.ArrayVersion, hash_form: Literal["int", "bytes"]
) -> None:
    n_stored, n_removed = kvpublisher.ARRAY_FIELDS[version]
    event = BlockStored([1, 2], 7, list(range(32)), 16, lora_id=3, medium="cpu", lora_name="ad", group_idx=1)
    sent: list[kvpublisher.Event] = [event, BlockRemoved([2], "cpu", 1), AllBlocksCleared()]
    with KVEventPublisher(LOCAL, encoding="array", array_version=version, hash_form=hash_form) as pub:
        payload = pub.encode(sent, TS)
    wire = msgspec.msgpack.decode(payload)
    assert [len(e) for e in wire[1]] == [1 + n_stored, 1 + n_removed, 1]
    assert [e[0] for e in wire[1]] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert all(isinstance(h, bytes) and len(h) == 32 for h in wire[1][0][1]) == (hash_form == "bytes")
    got = decode_batch(payload).events
    expected_stored = BlockStored(
        [1, 2],
        7,
        list(range(32)),
        16,
        lora_id=3,
        medium="cpu" if n_stored >= 6 else None,
        lora_name="ad" if n_stored >= 7 else None,
        extra_keys=[None, None] if n_stored >= 8 else None,
        group_idx=1 if n_stored >= 9 else None,
    )
    removed = BlockRemoved([2], "cpu" if n_removed >= 2 else None, 1 if n_removed >= 3 else None)
    assert got == [expected_stored, removed, AllBlocksCleared()]


def test_without_rank_the_batch_has_two_elements() -> None:
    with KVEventPublisher(LOCAL, data_parallel_rank=None) as pub:
        assert len(msgspec.msgpack.decode(pub.encode([], TS))) == 2
    with KVEventPublisher(LOCAL, data_parallel_rank=3) as pub:
        assert decode_batch(pub.encode([], TS)).data_parallel_rank == 3


# ---------------------------------------------------------------------------------------------
# Transport


@pytest.mark.parametrize(
    ("endpoint", "binds"),
    [
        ("tcp://*:5557", True),
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/kv", True),
        ("inproc://kv", True),
        ("tcp://127.0.0.1:0", True),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://epp-svc:5557", False),
    ],
)
def test_bind_or_connect_rule(endpoint: str, binds: bool) -> None:
    assert kvpublisher.binds(endpoint) is binds


def test_live_frames_carry_topic_and_consecutive_sequence_numbers(ctx: Sockets) -> None:
    with KVEventPublisher(LOCAL, topic="kv@10.0.0.5:8000@m") as pub:
        assert pub.endpoint.startswith("tcp://127.0.0.1:") and not pub.endpoint.endswith(":0")
        sub = subscriber(ctx, pub)
        assert [pub.publish([stored(10 * i)]) for i in range(3)] == [0, 1, 2]
        for i in range(3):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv@10.0.0.5:8000@m" and seq == i.to_bytes(8, "big")
            assert decode_batch(payload).events == [stored(10 * i)]


def test_connects_to_a_bound_subscriber(ctx: Sockets) -> None:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    with KVEventPublisher(f"tcp://127.0.0.1:{port}") as pub:
        while not pub.subscriptions:
            sub.poll(5)
        pub.publish([AllBlocksCleared()])
        assert sub.recv_multipart()[1] == bytes(8)


def _subscribe(ctx: Sockets, pub: KVEventPublisher, topic: bytes) -> zmq.Socket[bytes]:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(pub.endpoint)
    return sub


def test_only_subscriptions_that_match_the_topic_count(ctx: Sockets) -> None:
    """A router subscribed to another topic receives nothing (vllm-router's kv_aware once did
    against llm-d's topic): `subscriptions`, which benchmarks wait on, must not count it."""
    for topic, wrong, right in (("", b"kv@", b""), ("kv@10.0.0.5:8000@m", b"kv@x", b"kv@")):
        with KVEventPublisher(LOCAL, topic=topic) as pub:
            subs = [_subscribe(ctx, pub, wrong), _subscribe(ctx, pub, right)]
            for _ in range(TIMEOUT_MS // 5):
                if pub.subscriptions:
                    break
                for sub in subs:
                    sub.poll(5)
            for _ in range(20):  # the wrong one's subscription has had every chance to arrive
                subs[0].poll(5)
            assert pub.subscriptions == 1, topic


@pytest.mark.parametrize("style", ["current", "legacy"])
def test_replay_reply_shapes(ctx: Sockets, style: Literal["current", "legacy"]) -> None:
    with KVEventPublisher(LOCAL, replay_endpoint=LOCAL, topic="t", replay_style=style) as pub:
        payloads = [pub.encode([stored(i)], TS) for i in range(3)]
        for i in range(3):
            pub.publish([stored(i)], TS)
        replies = replay(dealer(ctx, pub), 1)
    if style == "current":  # vLLM 0.26+: [b"", topic, seq, payload]; end [b"", b"", END, b""]
        assert replies == [[b"", b"t", i.to_bytes(8, "big"), payloads[i]] for i in (1, 2)] + [
            [b"", b"", END_SEQ, b""]
        ]
    else:  # vLLM 0.9-0.25: [b"", seq, payload]; end [b"", END, b""]
        assert replies == [[b"", i.to_bytes(8, "big"), payloads[i]] for i in (1, 2)] + [[b"", END_SEQ, b""]]


def test_undelivered_batches_are_replayable_dropped_ones_are_not(ctx: Sockets) -> None:
    with KVEventPublisher(LOCAL, replay_endpoint=LOCAL) as pub:
        sub = subscriber(ctx, pub)
        pub.publish([stored(0)])
        pub.publish([stored(10)], deliver=False)  # an HWM drop: buffered first, as vLLM does
        pub.drop(2)  # gone for good
        assert pub.publish([stored(20)]) == 4
        assert [sub.recv_multipart()[1] for _ in range(2)] == [bytes(8), (4).to_bytes(8, "big")]
        seqs = [int.from_bytes(r[2], "big") for r in replay(dealer(ctx, pub), 0)[:-1]]
        assert seqs == [0, 1, 4]


def test_restart_starts_again_at_zero_with_an_empty_buffer(ctx: Sockets) -> None:
    with KVEventPublisher(LOCAL, replay_endpoint=LOCAL) as pub:
        for i in range(3):
            pub.publish([stored(i)])
        pub.restart()
        assert replay(dealer(ctx, pub), 0) == [[b"", b"", END_SEQ, b""]]
        assert pub.publish([stored(9)]) == 0


def test_replay_buffer_keeps_the_last_buffer_steps(ctx: Sockets) -> None:
    with KVEventPublisher(LOCAL, replay_endpoint=LOCAL, buffer_steps=2) as pub:
        for i in range(4):
            pub.publish([stored(i)])
        assert [int.from_bytes(r[2], "big") for r in replay(dealer(ctx, pub), 0)[:-1]] == [2, 3]


def test_malformed_replay_requests_are_ignored(ctx: Sockets) -> None:
    with KVEventPublisher(LOCAL, replay_endpoint=LOCAL) as pub:
        pub.publish([stored(0)])
        sock = dealer(ctx, pub)
        sock.send_multipart([b"", b"short"])
        sock.send_multipart([b"", bytes(8), b"extra"])
        assert len(replay(sock, 0)) == 2  # only the valid request was answered: 1 batch + end


def test_closed_publisher_refuses_to_publish() -> None:
    pub = KVEventPublisher(LOCAL)
    pub.close()
    pub.close()  # idempotent
    with pytest.raises(RuntimeError):
        pub.publish([])


def test_bad_endpoint_raises_from_the_constructor() -> None:
    with pytest.raises(zmq.ZMQError):
        KVEventPublisher("tcp://*:notaport")
