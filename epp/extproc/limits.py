"""Bounds on what ext-proc streams may hold at once: buffered body bytes, streams, body time.

Before these, a request body was buffered without a total bound and without a deadline: 48
unfinished 15 MiB bodies took epp to 929 MB, and 1,000 slowloris bodies (headers sent, the body
never finished) were held indefinitely. One `StreamGuard` per ext-proc server holds the counters;
each `Stream` asks it before it buffers (`reserve`) and gives back (`release`) once the routing
answer carrying the body has been written to the gateway (`Stream.answered`: epp keeps no copy
for the rest of the response), or when the stream ends before that (an error, a reset, a timeout).

    max_buffered_body_bytes  request-body bytes buffered across all streams; a chunk that would
                             pass it is answered 503 (the proxy may retry elsewhere)
    max_concurrent_streams   requests epp is deciding or following at once; more are 503
    request_body_timeout     from the request headers to the body's end; a body still arriving
                             then is answered 408 and its buffer dropped (0: no deadline)
    large_body_lanes         requests with a body over `large_body_bytes` (once that much has
                             arrived: a declared Content-Length takes nothing) read, parsed and
                             answered at once; the others wait for a lane without reading on, so
                             HTTP/2 flow control slows their senders (0: no bound). The wait
                             counts against the body timeout. A stream whose next body message
                             has not come within a second gives its lane back until it does
                             (`epp.extproc.stream.LANE_IDLE_S`): two stalled uploads that
                             declared 2 MiB held both lanes for the whole body timeout before.
    large_body_rate          bytes a second of large bodies read, across streams (a token
                             bucket holding one second's worth): a large body waits, unread,
                             until its bytes are within the rate (0: no bound).

Why: every large body costs epp's own process a few copies of itself, each holding the GIL
(gRPC's message, the body field, the hand-offs to a body parser: epp.requestcontrol.offload) and,
in FULL_DUPLEX_STREAMED, one answer per 62000 bytes sent back. Unpaced, clients sending 16 MiB
bodies back to back got 25-40 of them a second through, and other requests' routing p99 went from
3 ms to 25-250 ms. The lanes bound how many are in progress (and queued at the parsers); the rate
bounds the copying, which is what the rest of the traffic feels
(docs/bench/overhead.md#large-bodies, by rate).

Every answer here is counted in epp_request_errors_total like other early answers. Envoy's own
limits (epp.gateway.envoy: request timeouts, per-connection buffer limits) catch most of this
first; these keep epp bounded behind any proxy.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from epp.observability import metrics


@dataclasses.dataclass(frozen=True, slots=True)
class StreamLimits:
    max_buffered_body_bytes: int = 1 << 30
    max_concurrent_streams: int = 10_000
    request_body_timeout: float = 60.0
    large_body_bytes: int = 1 << 20
    large_body_lanes: int = 2
    large_body_rate: int = 64 << 20
    # Per client connection, when the gateway names it (Envoy's `connection.id` attribute):
    # request bodies still arriving, and the bytes they hold (0: no bound).
    max_unfinished_bodies_per_connection: int = 16
    max_buffered_body_bytes_per_connection: int = 64 << 20

    def __post_init__(self) -> None:
        if self.max_buffered_body_bytes < 1 or self.max_concurrent_streams < 1:
            raise ValueError("max_buffered_body_bytes and max_concurrent_streams must be at least 1")
        if min(self.max_unfinished_bodies_per_connection, self.max_buffered_body_bytes_per_connection) < 0:
            raise ValueError("the per-connection bounds must be >= 0")
        if self.request_body_timeout < 0:
            raise ValueError("request_body_timeout must be >= 0")
        if min(self.large_body_lanes, self.large_body_bytes, self.large_body_rate) < 0:
            raise ValueError("large_body_lanes, large_body_bytes and large_body_rate must be >= 0")


# --- Defaults sized from the memory limit (docs/security.md#memory-the-default-limits) -----------

MiB = 1 << 20
PROCESS_RESERVE = 512 * MiB
"""What one routing process holds besides streams and bodies: its own ~120 MB idle (Python,
gRPC, the tokenizer), the tokenizer prefix cache (64 MiB) and the KV index as it fills, and up to
256 MiB of freed body buffers glibc keeps (epp.malloc)."""
PARSER_RESERVE = 160 * MiB
"""A body-parser process: ~80 MB of its own, the chat bodies it keeps for the render (64 MiB)."""
HEADROOM = 0.8
"""The share of the limit planned for: the rest absorbs what is not counted (a burst's garbage)."""
BUFFERED_COST = 1.5
"""RSS per buffered body byte: the chunks as received, and the copy made when the body is whole
(1,000 unfinished 1 MB bodies took 1.56 GB)."""
STREAM_COST = 32 << 10
"""RSS per open stream without a body: gRPC's call, the handler's task and state (~24 KB
measured with 2,000 idle streams, rounded up)."""
MAX_BUFFERED_CAP = 1 << 30
MAX_STREAMS_CAP = 10_000


def sized_limits(memory: int, processes: int = 1, parsers: int = 1) -> tuple[int, int]:
    """(max_buffered_body_bytes, max_concurrent_streams) for one of `processes` routing processes
    sharing `memory` bytes with `parsers` body-parser processes each: the part of the share left
    after the reserves, half for buffered bodies and half for streams, each capped (1 GiB, 10,000)
    and never below one largest body (16 MiB) or 100 streams."""
    share = memory * HEADROOM / max(1, processes) - PROCESS_RESERVE - parsers * PARSER_RESERVE
    usable = max(0.0, share)
    buffered = int(min(MAX_BUFFERED_CAP, max(16 * MiB, usable / 2 / BUFFERED_COST)))
    streams = int(min(MAX_STREAMS_CAP, max(100, usable / 2 / STREAM_COST)))
    return buffered, streams


class StreamGuard:
    """The counters shared by every stream of one server (one event loop: no locks needed)."""

    __slots__ = ("_bucket", "_lanes", "buffered", "connections", "limits", "streams")

    def __init__(self, limits: StreamLimits = StreamLimits()) -> None:
        self.limits = limits
        self.buffered = 0  # request-body bytes held by streams now
        self.streams = 0  # streams admitted and not yet closed
        # Client connection id -> [unfinished bodies, their buffered bytes] (`open_body`).
        self.connections: dict[float, list[int]] = {}
        lanes, rate = limits.large_body_lanes, limits.large_body_rate
        self._lanes = asyncio.Semaphore(lanes) if lanes else None
        self._bucket = _Bucket(rate) if rate else None

    def is_large(self, body_bytes: int) -> bool:
        """Whether a body of this size is paced (`take_lane`, `pace`)."""
        return (
            self._lanes is not None or self._bucket is not None
        ) and body_bytes > self.limits.large_body_bytes

    async def take_lane(self, started: float, size: int) -> bool:
        """Wait for a large-body lane and for `size` bytes of the rate; False once the body
        timeout (from `started`) has passed. A True must be matched by one `give_lane`."""
        return await self._until_timeout(started, self._lane_and_rate(size))

    async def pace(self, started: float, size: int) -> bool:
        """Wait for `size` more bytes of the rate (a large body of unknown length, chunk by
        chunk); False once the body timeout has passed."""
        return await self._until_timeout(started, self._wait_rate(size))

    async def _until_timeout(self, started: float, waiting: Coroutine[Any, Any, None]) -> bool:
        """Await `waiting` within the body timeout from `started`, counting the time waited."""
        timeout = self.limits.request_body_timeout
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            async with asyncio.timeout_at(started + timeout if timeout else None):
                await waiting
        except TimeoutError:
            return False
        finally:
            _count_wait(loop.time() - t0)
        return True

    async def _lane_and_rate(self, size: int) -> None:
        if self._lanes is not None:
            await self._lanes.acquire()
        try:
            await self._wait_rate(size)
        except BaseException:
            self.give_lane()
            raise

    async def _wait_rate(self, size: int) -> None:
        if self._bucket is not None and size:
            delay = self._bucket.reserve(size, asyncio.get_running_loop().time())
            if delay > 0:
                await asyncio.sleep(delay)

    def lane_free(self) -> bool:
        """Whether a lane (and the rate) would be had without waiting."""
        lanes, bucket = self._lanes, self._bucket
        return (lanes is None or not lanes.locked()) and (bucket is None or bucket.tokens > 0)

    def give_lane(self) -> None:
        if self._lanes is not None:
            self._lanes.release()

    def admit(self) -> bool:
        if self.streams >= self.limits.max_concurrent_streams:
            return False
        self.streams += 1
        return True

    def leave(self) -> None:
        self.streams -= 1

    def reserve(self, n: int, connection: float | None = None) -> str | None:
        """Take `n` buffered bytes (of a body on `connection`, when the gateway named it); the
        bound that refuses them ("bytes", "connection bytes"), or None."""
        if self.buffered + n > self.limits.max_buffered_body_bytes:
            return "bytes"
        if connection is not None:
            held = self.connections[connection]
            bound = self.limits.max_buffered_body_bytes_per_connection
            if bound and held[1] + n > bound:
                return "connection bytes"
            held[1] += n
        self.buffered += n
        return None

    def release(self, n: int, connection: float | None = None) -> None:
        self.buffered -= n
        if connection is not None and n:
            self.connections[connection][1] -= n

    def open_body(self, connection: float) -> bool:
        """A body begins arriving on a client connection: False past the per-connection bound of
        unfinished bodies (one client must not hold what all clients share)."""
        held = self.connections.get(connection)
        if held is None:
            held = self.connections[connection] = [0, 0]
        bound = self.limits.max_unfinished_bodies_per_connection
        if bound and held[0] >= bound:
            if not held[0]:
                del self.connections[connection]
            return False
        held[0] += 1
        return True

    def close_body(self, connection: float) -> None:
        """The body is whole (or the stream ended): its bytes must have been released first."""
        held = self.connections[connection]
        held[0] -= 1
        if held[0] <= 0:
            del self.connections[connection]

    async def read_body(self, read: Callable[[], Awaitable[Any]], started: float) -> Any:
        """The stream's next message while its body is still arriving, or None when the body
        timeout (counted from `started`, the loop time of the request headers) has passed."""
        timeout = self.limits.request_body_timeout
        if not timeout:
            return await read()
        try:
            async with asyncio.timeout_at(started + timeout):
                return await read()
        except TimeoutError:
            return None


def _count_wait(seconds: float) -> None:
    if seconds > 0.001:  # waited, rather than passed straight through
        metrics.large_body_waits.inc()
        metrics.large_body_wait_seconds.inc(seconds)


class _Bucket:
    """A token bucket of bytes, one second's worth deep. `reserve` takes the bytes at once (the
    balance may go negative) and says how long until the balance is back at zero: callers
    waiting that long are served at the rate, in order."""

    __slots__ = ("at", "rate", "tokens")

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.tokens = float(rate)
        self.at = 0.0

    def reserve(self, size: int, now: float) -> float:
        if self.at:
            self.tokens = min(float(self.rate), self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= size
        return -self.tokens / self.rate if self.tokens < 0 else 0.0
