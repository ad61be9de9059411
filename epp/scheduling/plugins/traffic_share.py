"""This scheduler's share of the fleet's traffic, learned online: how much of the work reaching
the pods it booked itself.

Why: a scheduler's fluid queue per endpoint (`predicted-ttft-scorer`'s "busy until") holds the
prefill work it booked, and a queued prefill shows in the scraped queue depth only until it
starts: prefills already running are in no scrape. Alone, the scheduler books all the work. With
N active-active replicas (or N worker processes in one pod, or other gateways sending to the same
pods), each books about 1/N of it, so its queues run about N times too short and it piles
requests onto pods already busy (docs/bench/routing-live.md#replicas: epp-ttft on hotspot at N=4,
TTFT p99 +3.0%, worst seed +17.5%). Under round robin every replica sees statistically the same
traffic, so booking each prefill 1/share times restores the fleet's queue in every replica, with
no shared state.

The estimate: the requests this scheduler routed, against the growth of the pods' own counters of
finished requests (`vllm:request_success_total`, scraped), summed over the pods, both as sums
decaying with time constant `window_s` (an EWMA of the two rates), sampled at most every
`sample_s` when a request is booked:

    share = own / fleet,   booking scale = clamp(fleet / own, 1, MAX_SCALE)

- Until `min_evidence` own requests (decayed) and some fleet growth have been seen, or when no pod
  exports the counter, the scale is 1: the single-scheduler behaviour.
- The counter grows at completion and bookings at routing, so while traffic rises the fleet side
  lags and the scale reads low (at start it is clamped to 1); in steady state the lag cancels.
- A counter that went down (a restarted pod, an engine behind its port restarted) counts nothing
  for that interval; a pod's first sighting only sets its baseline; a pod gone is forgotten.
- A pinned share (`trafficShare: 0.25`) skips the learning: scale 1/share.

Explain (`/debug/score`, request-level `traffic_share`): `booking_scale`, `share`, `source`
(`learned`, `default` while evidence is short, `pinned`), the decayed rates it came from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Final

from epp.datastore.endpoints import Endpoint

MAX_SCALE: Final = 64.0
"""At most this many times the booked work: a share below 1/64 is taken as 1/64."""

WINDOW_S: Final = 30.0
"""Time constant of the decaying sums: a few dozen requests per replica at modest rates."""

SAMPLE_S: Final = 1.0
"""Counters are read at most this often (reading walks every endpoint)."""

MIN_EVIDENCE: Final = 20.0
"""Own requests (decayed) before the learned scale is used."""


class TrafficShare:
    """Learns this scheduler's share of the fleet's requests; see the module docstring.

    `book(now)` once per routed request returns the booking scale to apply to it."""

    __slots__ = (
        "_at",
        "_endpoints",
        "_fleet",
        "_last",
        "_own",
        "_pending",
        "_pinned",
        "_scale",
        "_source",
        "_window",
    )

    def __init__(
        self,
        endpoints: Callable[[], Iterable[Endpoint]],
        pinned: float | None = None,
        *,
        window_s: float = WINDOW_S,
    ) -> None:
        """`endpoints`: every endpoint of the pool (called only when a sample is due);
        `pinned`: a fixed share in [1/MAX_SCALE, 1] instead of learning it."""
        if pinned is not None and not 1.0 / MAX_SCALE <= pinned <= 1.0:
            raise ValueError(f"traffic share must be in [1/{MAX_SCALE:g}, 1], got {pinned}")
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self._endpoints = endpoints
        self._pinned = pinned
        self._window = window_s
        self._at: float | None = None  # time of the last sample
        self._pending = 0  # own bookings since the last sample
        self._own = 0.0  # decayed sums
        self._fleet = 0.0
        self._last: dict[str, float] = {}  # endpoint -> counter at the last sample
        self._scale = 1.0 if pinned is None else 1.0 / pinned
        self._source = "default" if pinned is None else "pinned"

    @property
    def scale(self) -> float:
        """How many times its own booked work this scheduler books (1 / share)."""
        return self._scale

    def book(self, now: float) -> float:
        """Count one routed request; sample the pods' counters if due; the current scale."""
        if self._pinned is not None:
            return self._scale
        self._pending += 1
        if self._at is None or now - self._at >= SAMPLE_S:
            self.sample(now)
        return self._scale

    def sample(self, now: float) -> None:
        """Fold the own bookings and the pods' counter growth since the last sample in."""
        grown = 0.0
        seen: dict[str, float] = {}
        last = self._last
        for ep in self._endpoints():
            total = ep.metrics.requests_total
            if total is None or not math.isfinite(total):
                continue
            seen[ep.name] = total
            before = last.get(ep.name)
            if before is not None and total >= before:
                grown += total - before  # a decrease is a reset: nothing counted this interval
        self._last = seen  # endpoints gone (or no longer exporting) are forgotten
        if self._at is None:
            # First sample: baselines only, the bookings so far have no counter growth to meet.
            self._at, self._pending = now, 0
            return
        decay = math.exp(-max(now - self._at, 0.0) / self._window)
        self._own = self._own * decay + self._pending
        self._fleet = self._fleet * decay + grown
        self._at, self._pending = now, 0
        if self._own >= MIN_EVIDENCE and self._fleet > 0.0:
            self._scale = min(max(self._fleet / self._own, 1.0), MAX_SCALE)
            self._source = "learned"
        else:
            self._scale, self._source = 1.0, "default"

    def explain(self) -> dict[str, Any]:
        """The scale, where it came from and the decayed rates behind it (requests per second)."""
        out: dict[str, Any] = {
            "booking_scale": self._scale,
            "share": 1.0 / self._scale,
            "source": self._source,
        }
        if self._pinned is None:
            out["own_requests_per_s"] = self._own / self._window
            out["fleet_requests_per_s"] = self._fleet / self._window
            out["window_s"] = self._window
        return out
