"""The queues: one per flow (fairness ID x priority), grouped in priority bands, with their counts.

A flow's queue is a heap ordered by its band's ordering policy (`ordering.py`); an item the
client gave up on is taken out at once (its slot, its bytes and its count go back immediately),
and its heap entry is dropped lazily (compacted when the dead entries outnumber the live ones).
A flow whose queue empties is removed, so flows cost nothing once idle: fairness IDs come from
clients, and a client sending a new one per request must not grow epp's memory.

A band holds the flows of one priority and its limits (`maxRequests`, `maxBytes`); the registry
holds the bands, highest priority first, and the global totals checked against the global limits.
Counts include every item still queued, so a limit is never overcommitted.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from epp.api.requests import InferenceRequest

if TYPE_CHECKING:
    from epp.flowcontrol.fairness import FairnessPolicy
    from epp.flowcontrol.ordering import OrderingPolicy

DEFAULT_FLOW = "default-flow"  # llm-d's fairness ID for a request that names none


class FlowItem:
    """One queued request. `future` is what its stream awaits: an `Outcome` once it leaves."""

    __slots__ = (
        "enqueued",
        "flow",
        "future",
        "key",
        "labels",
        "priority",
        "queue",
        "request",
        "seq",
        "size",
        "timer",
        "ttl",
    )

    def __init__(
        self,
        request: InferenceRequest,
        flow: str,
        priority: int,
        size: int,
        enqueued: float,
        ttl: float,
        seq: int,
        future: asyncio.Future[Any],
    ) -> None:
        self.request = request
        self.flow = flow
        self.priority = priority
        self.size = size
        self.enqueued = enqueued
        self.ttl = ttl  # the queue-wait budget while the pool has endpoints (0: no limit)
        self.seq = seq
        self.future = future
        self.key: tuple[float, float, int] = (0.0, 0.0, seq)
        self.labels: tuple[str, str, str, str] = ("", "", "", "")  # (fairness ID, priority, model, target)
        self.queue: FlowQueue | None = None  # None once it has left its queue
        self.timer: Any = None  # its expiry timer (a handle with cancel())


class FlowQueue:
    """The queued items of one flow, in its band's order."""

    __slots__ = ("_dead", "_heap", "band", "bytes", "flow", "len")

    def __init__(self, band: Band, flow: str) -> None:
        self.band = band
        self.flow = flow
        self._heap: list[tuple[tuple[float, float, int], FlowItem]] = []
        self._dead = 0
        self.len = 0
        self.bytes = 0

    def push(self, item: FlowItem) -> None:
        item.key = self.band.ordering.key(item)
        item.queue = self
        heapq.heappush(self._heap, (item.key, item))
        self.len += 1
        self.bytes += item.size

    def head(self) -> FlowItem | None:
        """The item this flow dispatches next (None when empty)."""
        heap = self._heap
        while heap and heap[0][1].queue is not self:
            heapq.heappop(heap)
            self._dead -= 1
        return heap[0][1] if heap else None

    def take(self, item: FlowItem) -> None:
        """Remove `item` (dispatched, expired or abandoned) from the counts; its heap entry goes
        when it reaches the top, or at the next compaction."""
        item.queue = None
        self.len -= 1
        self.bytes -= item.size
        if self._heap and self._heap[0][1] is item:
            heapq.heappop(self._heap)
        else:
            self._dead += 1
            if self._dead > 64 and self._dead > self.len:
                self._heap = [e for e in self._heap if e[1].queue is self]
                heapq.heapify(self._heap)
                self._dead = 0

    def items(self) -> Iterator[FlowItem]:
        return (item for _, item in self._heap if item.queue is self)


class Band:
    """The flows of one priority level and the policies and limits that apply to them."""

    __slots__ = (
        "bytes",
        "fairness",
        "flow_ids",
        "flows",
        "idle_since",
        "len",
        "max_bytes",
        "max_requests",
        "ordering",
        "priority",
        "state",
        "static",
    )

    def __init__(
        self,
        priority: int,
        *,
        max_bytes: int,
        max_requests: int,
        fairness: FairnessPolicy,
        ordering: OrderingPolicy,
        static: bool,
    ) -> None:
        self.priority = priority
        self.max_bytes = max_bytes
        self.max_requests = max_requests
        self.fairness = fairness
        self.ordering = ordering
        self.state = fairness.new_state()  # the fairness policy's cursor for this band
        self.static = static  # configured (or priority 0): never collected
        self.flows: dict[str, FlowQueue] = {}  # non-empty flows only
        self.flow_ids: list[str] = []  # their IDs, sorted (round-robin visits them in order)
        self.len = 0
        self.bytes = 0
        self.idle_since = 0.0


class Registry:
    """Every band, highest priority first, and the totals across them."""

    def __init__(self, max_bytes: int = 0, max_requests: int = 0) -> None:
        self.max_bytes = max_bytes  # 0: no global limit
        self.max_requests = max_requests
        self.bands: dict[int, Band] = {}
        self.ordered: list[Band] = []  # highest priority first
        self.priorities: list[int] = []  # the same, as numbers (the usage-limit policy's input)
        self.len = 0
        self.bytes = 0

    def add_band(self, band: Band) -> None:
        self.bands[band.priority] = band
        self.ordered = sorted(self.bands.values(), key=lambda b: -b.priority)
        self.priorities = [b.priority for b in self.ordered]

    def drop_band(self, priority: int) -> None:
        del self.bands[priority]
        self.ordered = [b for b in self.ordered if b.priority != priority]
        self.priorities = [b.priority for b in self.ordered]

    def fits(self, band: Band, size: int) -> bool:
        """Whether one more request of `size` bytes stays within the band's and global limits."""
        if self.max_bytes and self.bytes + size > self.max_bytes:
            return False
        if self.max_requests and self.len + 1 > self.max_requests:
            return False
        return band.bytes + size <= band.max_bytes and band.len + 1 <= band.max_requests

    def add(self, band: Band, item: FlowItem) -> None:
        queue = band.flows.get(item.flow)
        if queue is None:
            queue = band.flows[item.flow] = FlowQueue(band, item.flow)
            bisect.insort(band.flow_ids, item.flow)
        queue.push(item)
        band.len += 1
        band.bytes += item.size
        self.len += 1
        self.bytes += item.size

    def remove(self, item: FlowItem, now: float) -> None:
        """Take a queued item out of every count; drop its flow if that emptied it."""
        queue = item.queue
        assert queue is not None
        queue.take(item)
        band = queue.band
        band.len -= 1
        band.bytes -= item.size
        self.len -= 1
        self.bytes -= item.size
        if queue.len == 0:
            del band.flows[queue.flow]
            del band.flow_ids[bisect.bisect_left(band.flow_ids, queue.flow)]
        if band.len == 0:
            band.idle_since = now

    def items(self) -> Iterator[FlowItem]:
        for band in self.ordered:
            for queue in band.flows.values():
                yield from queue.items()
