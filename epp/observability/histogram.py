"""A histogram as plain numbers: bucket counts, a sum and a count, exported at scrape time.

What an observation costs is a bisect and three adds, no lock and no label lookup: for series
recorded on the request path and exported by a collector (flow control's, llm-d's per-request
series). prometheus_client's `Histogram` takes a lock per observation and a child per label set
(~1.5 us to look one up); these are looked up once per request and only touched on the loop.
"""

from __future__ import annotations

import bisect

from prometheus_client.utils import floatToGoString

INF = float("inf")


class Histogram:
    """Bucket counts, a sum and a count: what an observation costs is a bisect and two adds."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, +Inf last: `HistogramMetricFamily.add_metric`'s shape."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, INF), self.counts, strict=True):
            running += n
            le: str = floatToGoString(bound)  # type: ignore[no-untyped-call]  # Histogram's le text
            out.append((le, float(running)))
        return out

    def add(self, other: Histogram) -> None:
        """Fold `other` (same bounds) into this one."""
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.total += other.total
        self.count += other.count
