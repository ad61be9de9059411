"""Eviction of in-flight sheddable requests (`flowControl.enableEviction`), llm-d's reclamation.

When dispatch stops at a band (head-of-line blocking) that has requests queued, and requests of
a lower, negative priority are being served, some of those are cut to make room: their stream is
answered 429 with `x-llm-d-request-dropped-reason: evicted` (Envoy then resets the request to the
model server, which frees its slot and KV cache).

- Victims: requests of priority < 0 only (`eviction-sheddable-filter`), the lowest priority first
  and, within a priority, the one dispatched last (`eviction-priority-then-time-ordering`: it has
  cost the least so far). A victim's priority must be below the waiting band's.
- How many: the deficit in the saturation signal's own units over a request's mean share of it,
  `ceil((saturation - ceiling) / (saturation / in flight))`, at least 1, at most 2 a decision.
- Pacing: stop and wait. A new decision waits until every request cut has ended its stream and
  then `grace` more (the time the freed capacity takes to show: one scrape and its staleness
  window plus the engine's abort for the utilization detector, a few dispatch ticks for the
  concurrency detector, which counts epp's own bookings); an eviction whose stream never ends is
  taken as done after 10 s.

A request can be cut only where the gateway lets epp answer while the response flows: its ext-proc
stream must still be open to epp (a response body passing through epp). Where it is not (an
off-sample response whose body skips epp under the mode-override gateway), the request is passed
over.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

DEFAULT_TIMEOUT = 10.0
MAX_PER_DECISION = 2


class InFlight:
    """One dispatched request, tracked until its stream ends."""

    __slots__ = ("dispatched", "evict", "evicted_at", "gone", "priority")

    def __init__(self, priority: int, dispatched: float, evict: Callable[[], bool]) -> None:
        self.priority = priority
        self.dispatched = dispatched
        self.evict = evict  # True when the cut was delivered to its stream
        self.evicted_at = 0.0
        self.gone = False


class Reclaimer:
    def __init__(self, grace: float, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.grace = grace
        self.timeout = timeout
        self.in_flight = 0
        self._victims: list[tuple[int, float, int, InFlight]] = []  # (priority, -dispatched, seq, entry)
        self._seq = 0
        self._outstanding: dict[InFlight, float] = {}  # cut, stream not ended yet: -> when cut
        self._cooling_until = -math.inf
        self.issued: dict[int, int] = {}  # cuts made, by the waiting band's priority
        self.confirmed = 0
        self.timed_out = 0

    def track(self, priority: int, now: float, evict: Callable[[], bool]) -> InFlight:
        entry = InFlight(priority, now, evict)
        self.in_flight += 1
        if priority < 0:
            self._seq += 1
            heapq.heappush(self._victims, (priority, -now, self._seq, entry))
        return entry

    def untrack(self, entry: InFlight, now: float) -> None:
        """Its stream ended."""
        if entry.gone:
            return
        entry.gone = True
        self.in_flight -= 1
        if self._outstanding.pop(entry, None) is not None:
            self.confirmed += 1
            self._cooling_until = max(self._cooling_until, now + self.grace)

    def gate_open(self, now: float) -> bool:
        for entry, at in list(self._outstanding.items()):
            if now - at >= self.timeout:
                del self._outstanding[entry]
                self.timed_out += 1
                self._cooling_until = max(self._cooling_until, now + self.grace)
        return not self._outstanding and now >= self._cooling_until

    def victim_priority(self) -> int | None:
        victims = self._victims
        while victims and victims[0][3].gone:
            heapq.heappop(victims)
        return victims[0][0] if victims else None

    def reclaim(self, saturation: float, ceiling: float, demand_priority: int, now: float) -> int:
        """Cut up to the deficit's worth of victims below `demand_priority`; how many were cut."""
        if self.in_flight <= 0 or saturation <= 0:
            return 0
        credit = saturation / self.in_flight
        n = min(MAX_PER_DECISION, max(1, math.ceil((saturation - ceiling) / credit)))
        cut = 0
        victims = self._victims
        while cut < n and victims:
            priority, _, _, entry = victims[0]
            if entry.gone:
                heapq.heappop(victims)
                continue
            if priority >= demand_priority:
                break
            heapq.heappop(victims)
            if entry.evict():  # else: its stream cannot be cut (the response skips epp)
                entry.evicted_at = now
                self._outstanding[entry] = now
                self.issued[demand_priority] = self.issued.get(demand_priority, 0) + 1
                cut += 1
        return cut
