"""vLLM KV events into the block index over ZMQ: sockets, framing, pod routing.

`KVEventIngester` knows pods only as `FeedSpec`s (index pod id, model, addresses), never
Kubernetes or the datastore; its owner reconciles them with `set_feeds`. Each pod's sequence
health and replay live in `epp.kvcache.feed`. Wire facts: reference notes kv-events.md 1.1-1.2.

Two ways in, usable together:

- Connect mode: one SUB per pod, connected to the pod's publisher (`FeedSpec.events`) and
  subscribed to every topic (vLLM's default topic is ""). One task per pod rather than one
  poller: zmq.asyncio's Poller registers every socket again on each wait (a future per socket),
  so a poller over N pods costs O(N) per wake-up where a task per pod costs O(1), and a pod's
  task keeps its failures to itself. The event loop watches the sockets' file descriptors itself
  (`epp.kvcache.zmqread`), not through zmq.asyncio's futures, and its reader callback drains up
  to `zmqread.BUDGET` messages a round with non-blocking receives on a plain shadow of the
  socket (no future per message or per wake-up), so a flooding pod cannot starve the loop.
- Bind mode (`bind=`): one SUB bound for every vLLM that connects to epp. The pod comes from the
  topic `kv@<ip>:<port>@<model>` (older guides: `kv@<ip>@<model>`, matched when that IP is one
  pod's) and the batch's `data_parallel_rank` (each DP rank has its own publisher, sequence and
  `FeedSpec.rank`). Messages of unknown topics are counted (`unrouted`) and dropped.
  Only the pool's pods get in (`epp.kvcache.access`): a ZAP handler on the context refuses the
  handshake of a peer whose IP is no pod's (errors reason `peer_denied`; the peer retries every
  2 s, so a pod that publishes before it joins the pool gets in once it has), and a message whose
  topic names a pod at another IP than its sender's is dropped (`peer_mismatch`), so one pod
  cannot write another's entries. `--kv-events-allow` admits networks too, or anyone (`any`).

Every socket refuses messages over `max_message_bytes` (ZMQ_MAXMSGSIZE: libzmq drops the
connection, so nothing that large is ever buffered), and held messages are bounded in count per
pod and in payload bytes over all pods (`epp.kvcache.feed.HoldBudget`).

After a disconnection (socket monitor) the pod is purged when it reconnects, or sooner when its
owner says it serves again (`pod_back`), and its next message is handled as a first one (see
`epp.kvcache.feed`): the publisher may have restarted meanwhile. Bind
mode sees no per-pod disconnection; there a restart shows only as the sequence going back. In
connect mode the SUB dials again at once after every disconnection: libzmq reconnects by itself
after a lost connection, but not after a protocol error, and a frame over the cap is one (one
oversized frame ended the subscription for good, and the pod's entries stayed, stale). So such
a frame costs that frame, the purge and the rebuild (or replay), not the feed.

A message is exactly 3 frames: topic, 8-byte big-endian sequence number, msgpack payload.
Anything else (another frame count, a short sequence frame, an undecodable payload) is counted
for its pod with a reason, logged rate-limited, and dropped: it never reaches the index or
another pod. An undecodable payload does not advance the sequence, so it shows up as a gap: its
events are lost, which is what a gap means.

Everything runs on the event loop, so `BlockIndex.apply` (synchronous) never overlaps a `match`.
Metrics: `epp_kv_events_*` per pod and `epp_kv_index_*` (`epp.observability.collectors.KVCollector`),
computed at scrape time from the feeds' counters: no per-message cost, and a pod's series go
when it leaves. Logs ("epp.kvcache"): an INFO line per connect, disconnect, reset and replay
outcome, at most one per `log_interval` per pod and kind. Throughput: tests/kvcache/bench_ingest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Final

import zmq
import zmq.asyncio
from zmq.utils import monitor as zmq_monitor

from epp import tasks
from epp.kvcache import events, zmqread
from epp.kvcache.access import AccessPolicy, PeerCheck
from epp.kvcache.feed import Feed, FeedSpec, FeedStatus, HoldBudget, Limiter, Settings, parse_topic
from epp.kvcache.index import BlockIndex
from epp.observability import collectors

__all__ = ["FeedSpec", "FeedStatus", "KVEventIngester"]

log = logging.getLogger("epp.kvcache")

# Per-connection receive queue: absorbs bursts while the loop is busy (a batch is ~1-3 KB).
_RCVHWM: Final = 10_000
_MONITOR_EVENTS: Final = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
_TOPIC_CACHE: Final = 1024
# ZMQ's fixed address for the context's authentication handler (ZAP, RFC 27).
_ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
_ZAP_DOMAIN: Final = b"epp-kv-events"  # NULL-mechanism sockets consult ZAP only with a domain
# A refused peer's handshake is left to time out after this long (ZAP status 300, "temporary"),
# so it reconnects and asks again: a pod that publishes before it is Ready, and so before it is
# one of the pool's endpoints, gets in this long after it joins. A final refusal (400) would
# make libzmq's connecting side give up for good.
_HANDSHAKE_MS: Final = 2_000
MAX_MESSAGE_BYTES: Final = 16 << 20  # a vLLM batch is ~1-3 KB; a 1M-token prefill's ~6 MB
HOLD_BYTES: Final = 256 << 20
SILENCE_GRACE: Final = 60.0  # seconds a pod sent work may publish nothing (--kv-events-silence-grace)


class KVEventIngester:
    """Feeds a `BlockIndex` from vLLM KV events; see the module docstring.

    Args:
        index: the index to apply batches to.
        bind: SUB endpoint to bind for vLLMs that connect to epp (e.g. "tcp://*:5557"); None = off.
        default_block_size: stands in for a BlockStored's block_size of 0.
        replay_timeout: seconds without a replay reply before the replay fails.
        max_replays: replays running at once, over all pods.
        replay_cooldown: seconds after a failed replay during which gaps purge without replaying.
        hold_limit: live messages held per pod while its replay runs; past it the replay fails.
        log_interval: seconds between a pod's warnings about rejected messages.
        access: who may publish to the bound socket (default: the pool's pods, each for itself).
        max_message_bytes: larger frames close the sender's connection (ZMQ_MAXMSGSIZE).
        hold_bytes: payload bytes held over all pods while replays run; past it a replay fails.
        routed_tokens: prompt tokens routed to a pod so far (by pod name), for the silence check.
        silence_grace: seconds a pod sent work may publish nothing before it is called silent.
    """

    def __init__(
        self,
        index: BlockIndex,
        *,
        bind: str | None = None,
        default_block_size: int | None = None,
        replay_timeout: float = 5.0,
        max_replays: int = 8,
        replay_cooldown: float = 30.0,
        hold_limit: int = 10_000,
        log_interval: float = 10.0,
        access: AccessPolicy | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        hold_bytes: int = HOLD_BYTES,
        routed_tokens: Callable[[str], int] | None = None,
        silence_grace: float = SILENCE_GRACE,
    ) -> None:
        self._index = index
        # Prompt tokens routed to a pod so far: with it, a pod sent work but publishing nothing is
        # warned about (`epp.kvcache.silence.Silence`); None: no such check.
        self._routed_tokens = routed_tokens
        self._silence_grace = silence_grace
        self._silence_task: asyncio.Task[None] | None = None
        self._bind = bind
        self._settings = Settings(
            default_block_size,
            replay_timeout,
            replay_cooldown,
            hold_limit,
            log_interval,
            max_message_bytes,
        )
        self._replay_slots = asyncio.Semaphore(max_replays)
        self._budget = HoldBudget(hold_bytes)
        self._peers = PeerCheck(access if access is not None else AccessPolicy())
        self._zap_sock: zmq.asyncio.Socket | None = None
        self._zap_task: asyncio.Task[None] | None = None
        self._feeds: dict[str, Feed] = {}
        self._routes: dict[tuple[str, int], Feed] = {}  # bind mode: (ip:port or ip, rank) -> feed
        self._topics: dict[bytes, tuple[str, str, str]] = {}  # topic -> (address, model, host)
        self._ctx: zmq.asyncio.Context | None = None
        self._bind_sock: zmq.asyncio.Socket | None = None
        self._bind_task: asyncio.Task[None] | None = None
        self._retired: set[asyncio.Task[None]] = set()  # cancelled by set_feeds, maybe unwinding
        self._unrouted: dict[str, int] = {}  # reason -> bind-mode messages no pod could be named for
        self._unrouted_limiter = Limiter(log_interval)

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the sockets (bind mode's, each configured pod's) and start reading."""
        if self._ctx is not None:
            raise RuntimeError("ingester already started")
        self._ctx = zmq.asyncio.Context()
        # ZMQ's default cap is 1,023 sockets a context, and each pod takes two or three (its SUB,
        # the SUB's monitor, a replay DEALER): at 1,000 pods the next socket failed with EMFILE
        # ("Too many open files") and epp did not start (`epp bench fleet --pods 1000`). The
        # cap becomes ZMQ's own limit; the process's file-descriptor limit still applies.
        self._ctx.set(zmq.MAX_SOCKETS, self._ctx.get(zmq.SOCKET_LIMIT))
        if self._bind is not None:
            checked = not self._peers.policy.any
            if checked:  # the handler first: a handshake before it is bound would go unchecked
                self._zap_sock = self._ctx.socket(zmq.REP)
                self._zap_sock.setsockopt(zmq.LINGER, 0)
                self._zap_sock.bind(_ZAP_ENDPOINT)
                self._zap_task = tasks.create_guarded_task(
                    self._serve_zap(self._zap_sock), name="kv-events zap", logger=log
                )
            sock = self._sub_socket()
            if checked:
                sock.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN)
                sock.setsockopt(zmq.HANDSHAKE_IVL, _HANDSHAKE_MS)
            try:
                sock.bind(self._bind)
            except zmq.ZMQError:
                sock.close(linger=0)
                await self._close_zap()
                self._ctx.term()
                self._ctx = None
                raise
            self._bind_sock = sock
            self._bind_task = tasks.create_guarded_task(
                self._read_bound(sock), name="kv-events bind", logger=log
            )
            log.info("kv events: listening on %s (publishers: %s)", self.bind_endpoint, self._peers.policy)
        for feed in self._feeds.values():
            self._connect(feed)
        collectors.kv_collector.add(self._snapshot)
        if self._routed_tokens is not None:
            self._silence_task = tasks.create_guarded_task(
                self._watch_silence(), name="kv-events silence", logger=log
            )

    async def stop(self) -> None:
        """Stop reading and close every socket. The index keeps what it has."""
        if self._ctx is None:
            return
        collectors.kv_collector.discard(self._snapshot)
        running = [*self._retired]
        if self._silence_task is not None:
            running.append(self._silence_task)
            self._silence_task = None
        for feed in self._feeds.values():
            running += [t for t in (feed.task, feed.stop_replay()) if t is not None]
            feed.task = None
        if self._bind_task is not None:
            running.append(self._bind_task)
        await tasks.cancel_and_wait(running)
        for feed in self._feeds.values():
            self._close_sockets(feed)
        if self._bind_sock is not None:
            self._bind_sock.close(linger=0)
            self._bind_sock = None
        self._bind_task = None
        await self._close_zap()
        self._ctx.term()
        self._ctx = None

    @property
    def bind_endpoint(self) -> str | None:
        """The bound SUB's address (port 0 resolved), or None when not bound."""
        if self._bind_sock is None:
            return None
        return self._bind_sock.getsockopt_string(zmq.LAST_ENDPOINT)

    # --- configuration --------------------------------------------------------------------------

    def set_feeds(self, specs: Iterable[FeedSpec]) -> None:
        """Reconcile with the current pods: connect new ones; disconnect and purge removed ones;
        a pod whose spec changed (address, model, ...) is purged and reconnected. Call from the
        event loop's thread."""
        wanted: dict[str, FeedSpec] = {}
        for spec in specs:
            if spec.pod in wanted:
                raise ValueError(f"duplicate KV-event feed for pod {spec.pod!r}")
            wanted[spec.pod] = spec
        for pod, feed in list(self._feeds.items()):
            if wanted.get(pod) != feed.spec:
                self._drop(feed)
        for pod, spec in wanted.items():
            if pod not in self._feeds:
                feed = Feed(spec, self._index, self._settings, self._replay_slots, self._budget)
                self._feeds[pod] = feed
                self._connect(feed)
        self._route()

    def pod_back(self, pod: str) -> None:
        """`pod` serves again after its owner stopped routing to it for failing scrapes. If its
        SUB lost the connection meanwhile, the pod most likely restarted with an empty cache:
        purge its entries now (`Feed.came_back`) and dial it at once. Left to itself, libzmq
        retries a refused connection with a backoff that reaches `RECONNECT_IVL_MAX` (5 s) while
        the pod is down, so the purge, and the new process's events, came up to 5 s after the
        pod was back in rotation. Meanwhile the index still showed the old process's prefixes,
        and every request for them went to the one cold pod: in `epp bench --workload
        rolling-restart`, the run's worst first tokens."""
        feed = self._feeds.get(pod)
        if feed is None:
            return
        feed.came_back()
        if feed.sock is not None and not feed.connected:
            self._redial(feed)

    def _drop(self, feed: Feed) -> None:
        del self._feeds[feed.pod]
        for task in (feed.task, feed.stop_replay()):
            if task is not None:
                task.cancel()
                self._retired.add(task)
                task.add_done_callback(self._retired.discard)
        feed.task = None
        self._close_sockets(feed)
        self._index.remove_pod(feed.pod)
        log.info("kv events: pod=%s removed, entries purged", feed.pod)

    def _route(self) -> None:
        self._peers.set_pods(_host(feed.spec.hostport) for feed in self._feeds.values())
        routes: dict[tuple[str, int], Feed] = {}
        by_ip: dict[tuple[str, int], list[Feed]] = {}
        for feed in self._feeds.values():
            address, rank = feed.spec.hostport, feed.spec.rank
            if address:
                routes[(address, rank)] = feed
                by_ip.setdefault((_host(address), rank), []).append(feed)
        for key, feeds in by_ip.items():
            if len(feeds) == 1:  # `kv@<ip>@<model>` names a pod only if the IP is unique
                routes.setdefault(key, feeds[0])
        self._routes = routes

    # --- sockets and readers --------------------------------------------------------------------

    def _sub_socket(self) -> zmq.asyncio.Socket:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, _RCVHWM)
        sock.setsockopt(zmq.MAXMSGSIZE, self._settings.max_message_bytes)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5_000)  # back off to 5 s while a pod is down
        # Heartbeats notice a peer gone without closing TCP (a lost node): `connected` turns
        # false and ZMQ reconnects.
        sock.setsockopt(zmq.HEARTBEAT_IVL, 5_000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 15_000)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        return sock

    def _connect(self, feed: Feed) -> None:
        feed.ctx = self._ctx
        spec = feed.spec
        if self._ctx is None or spec.events is None:
            return
        sock = self._sub_socket()
        feed.sock = sock
        feed.monitor = sock.get_monitor_socket(_MONITOR_EVENTS)  # before connecting: no event missed
        try:
            sock.connect(spec.events)
        except zmq.ZMQError as exc:
            log.error("kv events: pod=%s cannot connect to %r: %s", spec.pod, spec.events, exc)
            feed.zmq_errors["connect"] = feed.zmq_errors.get("connect", 0) + 1
            self._close_sockets(feed)
            return
        feed.task = tasks.create_guarded_task(self._read_feed(feed), name=f"kv-events {spec.pod}", logger=log)
        log.info("kv events: pod=%s subscribing to %s (replay %s)", spec.pod, spec.events, spec.replay)

    def _close_sockets(self, feed: Feed) -> None:
        if feed.unwatch is not None:
            feed.unwatch()
            feed.unwatch = None
        if feed.sock is None:
            return
        if feed.monitor is not None:
            feed.sock.disable_monitor()
            feed.monitor.close(linger=0)
        feed.sock.close(linger=0)
        feed.sock = feed.monitor = None
        feed.connected = False

    async def _read_feed(self, feed: Feed) -> None:
        assert feed.sock is not None and feed.monitor is not None
        sock: zmq.Socket[bytes] = zmq.Socket.shadow(feed.sock.underlying)
        monitor: zmq.Socket[bytes] = zmq.Socket.shadow(feed.monitor.underlying)

        def on_monitor() -> None:
            while zmqread.queued(monitor):
                self._on_monitor(feed, monitor.recv_multipart())

        reader = zmqread.Reader(
            (sock, monitor), sock, lambda: self._on_frames(feed, zmqread.recv(sock)), on_monitor
        )
        # The loop stops watching before the sockets close (`_close_sockets`, or here when the
        # task ends first): a closed descriptor's number can be reused by the next socket.
        feed.unwatch = reader.close
        try:
            await reader.run()
        finally:
            if feed.unwatch is reader.close:
                feed.unwatch = None
                reader.close()

    def _on_monitor(self, feed: Feed, frames: list[bytes]) -> None:
        event = zmq_monitor.parse_monitor_message(frames)["event"]
        connected = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
        if event == zmq.EVENT_DISCONNECTED:
            feed.disconnected()  # the next message may come from a restarted publisher
            self._redial(feed)
        if connected != feed.connected:
            if connected:
                feed.connections += 1
                feed.reconnected()
            feed.connected = connected
            state = "connected to" if connected else "disconnected from"
            feed.note("connection", "kv events: pod=%s %s %s", feed.pod, state, feed.spec.events)

    @staticmethod
    def _redial(feed: Feed) -> None:
        """Dial the pod's publisher again (see the module doc: libzmq does not after a frame over
        the size cap). Replacing the session also replaces any reconnection libzmq had planned,
        so there is never more than one connection to the pod."""
        sock, endpoint = feed.sock, feed.spec.events
        if sock is None or endpoint is None:
            return
        with contextlib.suppress(zmq.ZMQError):  # the session is gone already
            sock.disconnect(endpoint)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            log.warning("kv events: pod=%s cannot connect again to %r: %s", feed.pod, endpoint, exc)

    async def _read_bound(self, asock: zmq.asyncio.Socket) -> None:
        sock: zmq.Socket[bytes] = zmq.Socket.shadow(asock.underlying)
        checked = not self._peers.policy.any

        def on_message() -> None:
            frames, peer = zmqread.recv_from(sock) if checked else (zmqread.recv(sock), None)
            self._on_bound_frames(frames, peer)

        # stop() closes the socket after this task has ended
        await zmqread.Reader((sock,), sock, on_message).run()

    # --- messages -------------------------------------------------------------------------------

    def _on_frames(self, feed: Feed, frames: list[bytes]) -> None:
        """A live message from a connected pod."""
        feed.messages += 1
        if len(frames) != 3:
            feed.reject("frames", f"{len(frames)} frames, expected 3")
            return
        topic, seq, payload = frames
        if len(seq) != 8:
            feed.reject("seq", f"sequence frame of {len(seq)} bytes, expected 8")
            return
        try:
            batch = events.decode_batch(payload)
        except events.EventDecodeError as exc:
            feed.reject("decode", str(exc))
            return
        feed.live(int.from_bytes(seq, "big"), batch, feed.spec.model or self._topic(topic)[1], len(payload))

    def _on_bound_frames(self, frames: list[bytes], peer: str | None = None) -> None:
        """A live message on the bound socket: the pod comes from its topic and DP rank. `peer`:
        the sender's IP, checked against the topic's pod unless the policy admits anyone."""
        address, topic_model, host = self._topic(frames[0])
        if not self._peers.may_publish(peer, host):
            self._reject(address, "peer_mismatch", f"topic {frames[0][:200]!r} from {peer}", unknown=True)
            return
        if len(frames) != 3:
            self._reject(address, "frames", f"{len(frames)} frames, expected 3")
            return
        seq = frames[1]
        if len(seq) != 8:
            self._reject(address, "seq", f"sequence frame of {len(seq)} bytes, expected 8")
            return
        try:
            batch = events.decode_batch(frames[2])
        except events.EventDecodeError as exc:
            self._reject(address, "decode", str(exc))
            return
        feed = self._routes.get((address, batch.data_parallel_rank or 0))
        if feed is None:
            self._reject(address, "unknown_topic", f"topic {frames[0][:200]!r}", unknown=True)
            return
        if not feed.connected:
            feed.connected = True
            feed.connections += 1
            log.info("kv events: pod=%s publishing to %s", feed.pod, self.bind_endpoint)
        feed.messages += 1
        feed.live(int.from_bytes(seq, "big"), batch, feed.spec.model or topic_model, len(frames[2]))

    def _reject(self, address: str, reason: str, detail: str, *, unknown: bool = False) -> None:
        """A bad bound-socket message: counted for the topic's pod (rank 0; the rank is in the
        payload) when the topic names one, else as unrouted."""
        feed = None if unknown else self._routes.get((address, 0))
        if feed is not None:
            feed.reject(reason, detail)
            return
        self._unrouted[reason] = self._unrouted.get(reason, 0) + 1
        self._unrouted_limiter.warn("", reason, detail)

    def _topic(self, topic: bytes) -> tuple[str, str, str]:
        parsed = self._topics.get(topic)
        if parsed is None:
            address, model = parse_topic(topic)
            parsed = (address, model, _host(address))
            if len(self._topics) >= _TOPIC_CACHE:  # garbage topics must not grow it
                self._topics.clear()
            self._topics[topic] = parsed
        return parsed

    # --- access ---------------------------------------------------------------------------------

    async def _serve_zap(self, sock: zmq.asyncio.Socket) -> None:
        """Answer libzmq's authentication requests (ZAP, RFC 27) for the bound socket."""
        while True:
            frames = await sock.recv_multipart()
            await sock.send_multipart(self._zap_reply(frames))

    def _zap_reply(self, frames: list[bytes]) -> list[bytes]:
        # Request: version, request id, domain, peer address, identity, mechanism, credentials.
        if len(frames) < 6:
            return [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", b"malformed request", b"", b""]
        request_id, domain, address = frames[1], frames[2], frames[3].decode("ascii", "replace")
        if domain != _ZAP_DOMAIN or self._peers.admits(address):
            return [b"1.0", request_id, b"200", b"OK", b"", b""]
        self._unrouted["peer_denied"] = self._unrouted.get("peer_denied", 0) + 1
        self._unrouted_limiter.warn("", "peer_denied", f"connection from {address}: not a pod of the pool")
        return [b"1.0", request_id, b"300", b"not a pod of the pool (yet)", b"", b""]

    async def _close_zap(self) -> None:
        if self._zap_task is not None:
            await tasks.cancel_and_wait([self._zap_task])
            self._zap_task = None
        if self._zap_sock is not None:
            self._zap_sock.close(linger=0)
            self._zap_sock = None

    # --- status ---------------------------------------------------------------------------------

    @property
    def unrouted(self) -> int:
        """Bind-mode messages no pod could be named for (unknown topic, or garbage)."""
        return sum(self._unrouted.values())

    def status(self) -> dict[str, FeedStatus]:
        """Each configured pod's ingestion health."""
        now = time.monotonic()
        return {pod: feed.status(now) for pod, feed in self._feeds.items()}

    def _snapshot(self) -> collectors.KVSnapshot:
        now = time.monotonic()
        st = self._index.stats()
        pods = {pod: feed.counts(now) for pod, feed in self._feeds.items()}
        subscribers = sum(feed.sock is not None for feed in self._feeds.values()) + (
            self._bind_sock is not None
        )
        return collectors.KVSnapshot(
            pods,
            dict(self._unrouted),
            st.entries,
            st.keys,
            st.evictions,
            index=st,
            lookup_seconds=self._index.lookup_seconds,
            subscribers=subscribers,
        )

    # --- silence ----------------------------------------------------------------------------------

    async def _watch_silence(self) -> None:
        every = max(0.05, min(self._silence_grace / 2, 10.0))
        while True:
            await asyncio.sleep(every)
            self.check_silence(time.monotonic())

    def check_silence(self, now: float) -> None:
        """Warn, once per silence, about each pod that is sent work but publishes no KV event."""
        assert self._routed_tokens is not None
        for feed in self._feeds.values():
            routed = self._routed_tokens(feed.pod)
            change = feed.silence.check(now, routed, feed.published, self._silence_grace)
            if change is True:
                where = (
                    f"subscribed to {feed.spec.events} ({'connected' if feed.connected else 'no connection'})"
                    if feed.spec.events
                    else f"listening on {self.bind_endpoint} (nothing came from it)"
                )
                log.warning(
                    "kv events: pod=%s has published no KV event in %gs although it was sent %d "
                    "prompt tokens; %s. Its prefix-cache scores stay 0, so requests lose their "
                    "affinity to it: check vLLM's --kv-events-config (enable_kv_cache_events, "
                    "publisher zmq, the endpoint) and that prefix caching is on",
                    feed.pod,
                    self._silence_grace,
                    feed.silence.routed_since(routed),
                    where,
                )
            elif change is False:
                log.info("kv events: pod=%s publishes KV events now (it was silent)", feed.pod)


def _host(address: str) -> str:
    """The host of "ip:port", "[v6]:port", "ip" or "v6", without brackets."""
    if address.count(":") == 1 or "]:" in address:
        address = address.rsplit(":", 1)[0]
    return address.strip("[]")
