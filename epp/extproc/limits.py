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

Every answer here is counted in epp_request_errors_total like other early answers. Envoy's own
limits (epp.gateway.envoy: request timeouts, per-connection buffer limits) catch most of this
first; these keep epp bounded behind any proxy.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class StreamLimits:
    max_buffered_body_bytes: int = 1 << 30
    max_concurrent_streams: int = 10_000
    request_body_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.max_buffered_body_bytes < 1 or self.max_concurrent_streams < 1:
            raise ValueError("max_buffered_body_bytes and max_concurrent_streams must be at least 1")
        if self.request_body_timeout < 0:
            raise ValueError("request_body_timeout must be >= 0")


class StreamGuard:
    """The counters shared by every stream of one server (one event loop: no locks needed)."""

    __slots__ = ("buffered", "limits", "streams")

    def __init__(self, limits: StreamLimits = StreamLimits()) -> None:
        self.limits = limits
        self.buffered = 0  # request-body bytes held by streams now
        self.streams = 0  # streams admitted and not yet closed

    def admit(self) -> bool:
        if self.streams >= self.limits.max_concurrent_streams:
            return False
        self.streams += 1
        return True

    def leave(self) -> None:
        self.streams -= 1

    def reserve(self, n: int) -> bool:
        if self.buffered + n > self.limits.max_buffered_body_bytes:
            return False
        self.buffered += n
        return True

    def release(self, n: int) -> None:
        self.buffered -= n

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
