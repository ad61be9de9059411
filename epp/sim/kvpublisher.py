"""A KV-event publisher that speaks vLLM's ZMQ wire format, for tests and the simulator.

It behaves as vLLM's `ZmqEventPublisher` does as seen from the network (reference notes
shared/reference/kv-events.md, sections 1.1-1.5 and 8):

- Live messages are 3 frames `[topic, seq (8 bytes, big-endian), msgpack payload]`; the sequence
  number starts at 0 and goes up by one per batch. The socket binds when the endpoint contains
  `*` or `::` or is `ipc://` / `inproc://` (vLLM's rule) and also when its port is 0 (connecting
  to port 0 means nothing, and tests want ephemeral ports: `tcp://127.0.0.1:0`); otherwise it
  connects, e.g. to an epp that binds. Above `hwm` queued messages per subscriber, messages are
  dropped silently, so a slow subscriber sees a sequence gap.
- The payload is `[ts, events, data_parallel_rank]` (`[ts, events]` when `data_parallel_rank` is
  None, as vLLM 0.9.0 wrote it). Events are tagged maps with defaults left out (`encoding="map"`,
  vLLM >= 0.24) or tagged arrays cut to the field count of `array_version` (`encoding="array"`,
  vLLM <= 0.23). Hashes are uint64 (`hash_form="int"`, vLLM's default) or 32-byte digests
  (`"bytes"`, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`); epp's events carry only the low 64 bits,
  so the digest's other 24 bytes are derived from them (deterministic, digest-looking).
- Fields epp's event structs do not keep are written as vLLM's block pool writes them: `medium`
  upper-cased and "GPU" when None, `extra_keys` one None per block when None, `group_idx` 0 when
  None, `kv_cache_spec_kind` from the constructor. So re-encoding the decoded events of a real
  vLLM 0.32 capture gives back its exact bytes (tests/sim/test_kvpublisher.py).
- Replay (when `replay_endpoint` is set): a ROUTER that always binds and answers
  `[identity, b"", start_seq]` with every buffered batch whose seq >= start_seq, then an end
  marker. `replay_style="current"` (vLLM 0.26+) replies `[topic, seq, payload]` and ends with
  `[b"", END, b""]`; `"legacy"` (0.9-0.25) replies `[seq, payload]` and ends with `[END, b""]`;
  both after the empty delimiter, END being 8 bytes of 0xff. The last `buffer_steps` batches are
  kept.

Gaps, two kinds, because consumers must handle both: `publish(..., deliver=False)` is a batch the
socket dropped at its high-water mark: vLLM buffers every batch it hands to the socket, which
drops silently, so it stays replayable (a gap replay can repair). `drop(n)` consumes n sequence
numbers with nothing sent or buffered (a gap replay cannot repair: as if the batches had already
left the buffer).
`restart()` is a vLLM restart as subscribers see it: the sequence starts again at 0 and the
replay buffer is empty (the sockets stay up; ZMQ reconnects hide a real restart's reconnection).

Threads: like vLLM, one background thread owns the sockets (ZMQ sockets are not thread-safe), so
replay requests are answered while nothing is published. `publish()` encodes and buffers in the
caller's thread and hands the live frames to that thread over an inproc PAIR socket: once
`publish()` returns, the batch is replayable (tests rely on it). Unlike vLLM, which buffers right
after sending in one thread, a replay may therefore return a batch just before it goes out live;
consumers must skip such duplicates anyway (a replay races live messages on the wire too).
The live socket is an XPUB: a PUB on the wire that also reads subscriptions, so `subscriptions`
tells a test when a subscriber is really listening (a PUB drops whatever it sends before that).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import msgspec
import zmq

from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored

Event = BlockStored | BlockRemoved | AllBlocksCleared

END_SEQ: Final = b"\xff" * 8  # vLLM's replay end marker: -1 as a signed 8-byte big-endian int

# Array form: how many fields of BlockStored / BlockRemoved each vLLM version wrote after the tag
# (msgspec writes every declared field of an array_like struct, defaults included).
ARRAY_FIELDS: Final = {
    "0.9": (5, 1),
    "0.10.2": (6, 2),  # + medium
    "0.14": (7, 2),  # + lora_name
    "0.17": (8, 2),  # + extra_keys
    "0.20": (9, 3),  # + group_idx
    "0.22": (11, 3),  # + kv_cache_spec_kind, kv_cache_spec_sliding_window (up to 0.23)
}
ArrayVersion = Literal["0.9", "0.10.2", "0.14", "0.17", "0.20", "0.22"]

_ids = itertools.count()


# Map form (vLLM >= 0.24): field order is the wire order; fields without a default are always
# written (None as nil), fields whose value equals the default None are left out.
class _MapStored(msgspec.Struct, tag="BlockStored", omit_defaults=True, gc=False):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _MapRemoved(msgspec.Struct, tag="BlockRemoved", omit_defaults=True, gc=False):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class _MapCleared(msgspec.Struct, tag="AllBlocksCleared", omit_defaults=True, gc=False):
    pass


def binds(endpoint: str) -> bool:
    """Whether a publisher binds `endpoint` (vLLM's rule, plus port 0) rather than connecting."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        return True
    try:
        return urlsplit(endpoint).port == 0
    except ValueError:
        return False


def _map_event(
    e: Event, digest: Callable[[int], bytes] | None, spec_kind: str | None
) -> _MapStored | _MapRemoved | _MapCleared:
    """`e` as vLLM >= 0.24 writes it (see the module docstring for the fields epp does not keep),
    its hashes as `digest` gives them (None: integers)."""

    def hashes(hs: list[int]) -> list[int | bytes]:
        return [digest(h) for h in hs] if digest is not None else list(hs)

    if isinstance(e, BlockStored):
        parent = e.parent_block_hash
        return _MapStored(
            hashes(e.block_hashes),
            digest(parent) if digest is not None and parent is not None else parent,
            e.token_ids,
            e.block_size,
            e.lora_id,
            _medium(e.medium),
            e.lora_name,
            [None] * len(e.block_hashes) if e.extra_keys is None else e.extra_keys,
            0 if e.group_idx is None else e.group_idx,
            spec_kind,
        )
    if isinstance(e, BlockRemoved):
        return _MapRemoved(hashes(e.block_hashes), _medium(e.medium), e.group_idx or 0)
    return _MapCleared()


_ENCODE = msgspec.msgpack.Encoder().encode


def encode_map_events(events: Sequence[Event], spec_kind: str | None = "full_attention") -> bytes:
    """The msgpack array of `events` in map form with integer hashes, as the second element of a
    vLLM >= 0.24 batch: for a caller that writes the batch around it (`epp.bench.fleet_pods`
    writes the timestamp at send time)."""
    return _ENCODE([_map_event(e, None, spec_kind) for e in events])


def _digest(h: int) -> bytes:
    """A 32-byte digest whose last 8 bytes, big-endian, are `h` (what epp's decoder keeps)."""
    low = h.to_bytes(8, "big")
    return hashlib.blake2b(low, digest_size=24).digest() + low


class KVEventPublisher:
    """Publishes KV-event batches like a vLLM engine; see the module docstring.

    Args:
        endpoint: live PUB endpoint; binds or connects as vLLM decides (plus port 0 binds).
        replay_endpoint: ROUTER endpoint for replay (always bound); None = no replay.
        topic: frame 0 of every message (vLLM's default is "").
        encoding: "map" (vLLM >= 0.24) or "array" (<= 0.23, fields of `array_version`).
        replay_style: "current" (0.26+, replies carry the topic) or "legacy" (0.9-0.25).
        hash_form: "int" (uint64, vLLM's default) or "bytes" (32-byte digests).
        digest_of: with "bytes", the whole digest of an event's hash (the simulator's block pool
            keeps them: `BlockPool.digest_for`); None derives a digest-looking one from the hash.
        data_parallel_rank: third element of every batch; None writes 0.9.0's `[ts, events]`.
        buffer_steps: batches kept for replay.
        hwm: send high-water mark per subscriber (vLLM's default 100,000; 0 = unbounded).
        kv_cache_spec_kind: written in BlockStored from vLLM 0.22 on (None leaves it out).
        array_version: the vLLM version whose array layout `encoding="array"` writes.
    """

    def __init__(
        self,
        endpoint: str = "tcp://*:5557",
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        encoding: Literal["map", "array"] = "map",
        replay_style: Literal["current", "legacy"] = "current",
        hash_form: Literal["int", "bytes"] = "int",
        data_parallel_rank: int | None = 0,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        kv_cache_spec_kind: str | None = "full_attention",
        array_version: ArrayVersion = "0.22",
        digest_of: Callable[[int], bytes] | None = None,
    ) -> None:
        if encoding not in ("map", "array") or replay_style not in ("current", "legacy"):
            raise ValueError(f"unknown encoding {encoding!r} or replay style {replay_style!r}")
        if hash_form not in ("int", "bytes") or array_version not in ARRAY_FIELDS:
            raise ValueError(f"unknown hash form {hash_form!r} or array version {array_version!r}")
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        self._topic = topic.encode()
        self._map = encoding == "map"
        self._legacy = replay_style == "legacy"
        self._digests = hash_form == "bytes"
        self._digest_of = digest_of or _digest
        self._rank = data_parallel_rank
        self._spec_kind = kv_cache_spec_kind
        self._stored_fields, self._removed_fields = ARRAY_FIELDS[array_version]
        self._encode = msgspec.msgpack.Encoder().encode
        self._lock = threading.Lock()  # sequence numbers and the command socket
        self._seq = 0
        # Its own lock, never held while blocking: the thread takes it to answer replays.
        self._buffer_lock = threading.Lock()
        self._buffer: collections.deque[tuple[int, bytes, bytes]] = collections.deque(maxlen=buffer_steps)
        self._subscriptions = 0
        self._closed = False
        self._ctx = zmq.Context()
        self._cmd_address = f"inproc://kv-publisher-{next(_ids)}"
        self._endpoint = ""
        self._replay_endpoint: str | None = None
        self._error: BaseException | None = None
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(endpoint, replay_endpoint, hwm, ready),
            name="kv-publisher",
            daemon=True,
        )
        self._thread.start()
        ready.wait()
        if self._error is not None:
            self._thread.join()
            self._ctx.term()
            raise self._error
        self._cmd = self._ctx.socket(zmq.PAIR)
        self._cmd.connect(self._cmd_address)

    # --- caller side ----------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The live socket's address, as bound (port 0 resolved) or connected."""
        return self._endpoint

    @property
    def topic(self) -> str:
        return self._topic.decode()

    @property
    def replay_endpoint(self) -> str | None:
        """The replay socket's bound address (port 0 resolved), or None without replay."""
        return self._replay_endpoint

    @property
    def subscriptions(self) -> int:
        """Subscriptions received so far that match this publisher's topic (a subscriber on
        another topic receives nothing and is not counted; one that reconnects counts again)."""
        return self._subscriptions

    def publish(self, events: Sequence[Event], ts: float | None = None, *, deliver: bool = True) -> int:
        """Send one batch; returns its sequence number. `deliver=False`: buffered for replay but
        not sent (the socket's high-water mark dropped it)."""
        payload = self.encode(events, time.time() if ts is None else ts)
        with self._lock:
            self._check_open()
            seq = self._seq
            self._seq += 1
            seq8 = seq.to_bytes(8, "big")
            with self._buffer_lock:
                self._buffer.append((seq, seq8, payload))
            if deliver:
                self._cmd.send_multipart((b"p", seq8, payload))
        return seq

    def drop(self, n: int = 1) -> None:
        """Consume `n` sequence numbers, sending and buffering nothing: a gap replay cannot fill."""
        with self._lock:
            self._check_open()
            self._seq += n

    def restart(self) -> None:
        """Behave like a restarted vLLM: sequence numbers from 0 again, replay buffer emptied."""
        with self._lock:
            self._check_open()
            self._seq = 0
            with self._buffer_lock:
                self._buffer.clear()

    def close(self) -> None:
        """Stop the thread and close every socket; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cmd.send(b"q")
        self._thread.join()
        self._cmd.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> KVEventPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("publisher is closed")

    # --- encoding -------------------------------------------------------------------------------

    def encode(self, events: Sequence[Event], ts: float) -> bytes:
        """The msgpack payload vLLM would send for `events` at `ts`."""
        wire = [self._map_event(e) if self._map else self._array_event(e) for e in events]
        batch: list[Any] = [float(ts), wire]
        if self._rank is not None:
            batch.append(self._rank)
        return self._encode(batch)

    def _hashes(self, hashes: list[int]) -> list[int | bytes]:
        return [self._digest_of(h) for h in hashes] if self._digests else list(hashes)

    def _parent(self, parent: int | None) -> int | bytes | None:
        return self._digest_of(parent) if self._digests and parent is not None else parent

    def _map_event(self, e: Event) -> _MapStored | _MapRemoved | _MapCleared:
        return _map_event(e, self._digest_of if self._digests else None, self._spec_kind)

    def _array_event(self, e: Event) -> list[Any]:
        if isinstance(e, BlockStored):
            fields: list[Any] = [
                self._hashes(e.block_hashes),
                self._parent(e.parent_block_hash),
                e.token_ids,
                e.block_size,
                e.lora_id,
                _medium(e.medium),
                e.lora_name,
                [None] * len(e.block_hashes) if e.extra_keys is None else e.extra_keys,
                e.group_idx or 0,
                self._spec_kind,
                None,  # kv_cache_spec_sliding_window
            ]
            return ["BlockStored", *fields[: self._stored_fields]]
        if isinstance(e, BlockRemoved):
            fields = [self._hashes(e.block_hashes), _medium(e.medium), e.group_idx or 0]
            return ["BlockRemoved", *fields[: self._removed_fields]]
        return ["AllBlocksCleared"]

    # --- publisher thread -----------------------------------------------------------------------

    def _run(self, endpoint: str, replay_endpoint: str | None, hwm: int, ready: threading.Event) -> None:
        sockets: list[zmq.Socket[bytes]] = []
        try:
            cmd = self._ctx.socket(zmq.PAIR)
            sockets.append(cmd)
            cmd.bind(self._cmd_address)
            pub = self._ctx.socket(zmq.XPUB)
            sockets.append(pub)
            pub.setsockopt(zmq.XPUB_VERBOSER, 1)  # every subscription, not only a topic's first
            pub.setsockopt(zmq.SNDHWM, hwm)
            pub.setsockopt(zmq.LINGER, 0)
            if binds(endpoint):
                pub.bind(endpoint)
            else:
                pub.connect(endpoint)
            self._endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            router = None
            if replay_endpoint is not None:
                router = self._ctx.socket(zmq.ROUTER)
                sockets.append(router)
                # A whole buffer's replay must not hit the default high-water mark of 1,000,
                # above which a ROUTER drops replies silently.
                router.setsockopt(zmq.SNDHWM, 0)
                router.setsockopt(zmq.LINGER, 0)
                router.bind(replay_endpoint)
                self._replay_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException as exc:
            self._error = exc
            for s in sockets:
                s.close(linger=0)
            ready.set()
            return
        ready.set()
        try:
            self._serve(cmd, pub, router)
        finally:
            for s in sockets:
                s.close(linger=0)

    def _serve(
        self, cmd: zmq.Socket[bytes], pub: zmq.Socket[bytes], router: zmq.Socket[bytes] | None
    ) -> None:
        poller = zmq.Poller()
        poller.register(cmd, zmq.POLLIN)
        poller.register(pub, zmq.POLLIN)
        if router is not None:
            poller.register(router, zmq.POLLIN)
        while True:
            ready = dict(poller.poll())
            if pub in ready:
                while pub.poll(0):
                    message = pub.recv()
                    # Only a subscription whose prefix the topic starts with gets these messages.
                    if message[:1] == b"\x01" and self._topic.startswith(message[1:]):
                        self._subscriptions += 1
            if router is not None and router in ready:
                while router.poll(0):
                    self._replay(router, router.recv_multipart())
            while cmd in ready and cmd.poll(0):
                frames = cmd.recv_multipart()
                kind = frames[0]
                if kind == b"p":
                    pub.send_multipart((self._topic, frames[1], frames[2]))
                elif kind == b"q":
                    return

    def _replay(self, router: zmq.Socket[bytes], frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[2]) != 8:
            return  # vLLM logs and ignores malformed requests
        identity = frames[0]
        start = int.from_bytes(frames[2], "big")
        with self._buffer_lock:
            batches = [(seq, payload) for n, seq, payload in self._buffer if n >= start]
        head = (identity, b"", self._topic) if not self._legacy else (identity, b"")
        for seq, payload in batches:
            router.send_multipart((*head, seq, payload))
        end_head = (identity, b"") if self._legacy else (identity, b"", b"")
        router.send_multipart((*end_head, END_SEQ, b""))


def _medium(medium: str | None) -> str:
    return "GPU" if medium is None else medium.upper()
