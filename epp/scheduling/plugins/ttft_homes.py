"""Where predicted-ttft-scorer sends a prompt no endpoint holds (the endpoints where it would queue
are ruled out first: `predicted_ttft_terms.unqueued`), which endpoints it prices as warming up (both
read the recent requests per endpoint, which this keeps), and when a near-tie keeps a prompt on the
endpoint holding most of it (the rules and why: `predicted_ttft_scorer`'s docstring).
"""

from __future__ import annotations

import zlib
from typing import Final

from epp.datastore.endpoints import Endpoint
from epp.scheduling.plugins.prefix_popularity import MASK64, Popularity, mix64

WARMUP_SHARE: Final = 0.5
"""An endpoint below this fraction of the mean recent requests per endpoint is warming up."""

WARMUP_MIN_REQUESTS: Final = 4.0
"""Recent requests per endpoint (decayed) before anyone counts as warming up."""


class Homes:
    """The recent requests per endpoint and the new KV they wrote there (both decaying over
    `window` seconds; 0 keeps none, and then nobody warms up and homes go by the hash alone), and
    the two rules that read them."""

    __slots__ = ("_ids", "_inflow", "_traffic")

    def __init__(self, window: float) -> None:
        self._traffic = Popularity(window) if window > 0 else None
        self._inflow = Popularity(window) if window > 0 else None
        self._ids: dict[str, int] = {}  # endpoint name -> crc32: the same in every process

    def routed(self, endpoint: str, now: float, tokens: float) -> None:
        """A request was routed to `endpoint`, where it writes `tokens` of new KV (its prompt's
        uncached tokens)."""
        if self._traffic is not None:
            self._traffic.add(endpoint, now)
        self.written(endpoint, now, tokens)

    def written(self, endpoint: str, now: float, tokens: float) -> None:
        """`tokens` of new KV are to be written on `endpoint` (a request's, or a pre-warm's)."""
        if self._inflow is not None and tokens > 0.0:
            self._inflow.add(endpoint, now, tokens)

    def warming(self, endpoints: list[Endpoint], now: float) -> frozenset[str]:
        """Endpoints that got less than `WARMUP_SHARE` of the mean of the recent requests (a
        restarted, readmitted or new pod, its cache empty): a miss there costs the fleet no lost
        affinity, so they are priced without the miss penalty until they carry their share.
        Empty until the window has seen a few requests per endpoint."""
        traffic = self._traffic
        if traffic is None or len(endpoints) < 2:
            return frozenset()
        counts = [traffic.count(ep.name, now) for ep in endpoints]
        fair = sum(counts) / len(counts)
        if fair < WARMUP_MIN_REQUESTS:
            return frozenset()
        return frozenset(ep.name for ep, c in zip(endpoints, counts, strict=True) if c < WARMUP_SHARE * fair)

    def home(
        self, digest: int, endpoints: list[Endpoint], objectives: list[float], limit: float, now: float
    ) -> int:
        """Index of the rendezvous home of the prompt whose first block is `digest` among the
        endpoints whose objective is at most `limit` that wrote the least new KV recently."""
        near = [i for i, objective in enumerate(objectives) if objective <= limit]
        inflow = self._inflow
        if inflow is not None and len(near) > 1:
            # The prompt's KV evicts the least recently used blocks of its home. Where the least
            # new KV was written lately those blocks are the oldest, so the least likely to be
            # asked for again; and homes spread as the prefill work does. Homes went to the
            # endpoints with at most their share of the recent requests before: the pods holding
            # hot prefixes serve many requests, mostly hits, so cold prompts crowded onto the
            # others, whose caches turned over faster and lost what they held (kv-pressure, seed
            # 2: 134k to 997k tokens of cold prompts per pod; 188k to 825k by new KV;
            # docs/bench/routing.md#kv-pressure-hit-rate).
            written = [inflow.count(endpoints[i].name, now) for i in near]
            least = min(written)
            near = [i for i, w in zip(near, written, strict=True) if w <= least]
        ids = self._ids
        top, home = -1, -1
        for i in near:
            ep = endpoints[i]
            name_id = ids.get(ep.name)
            if name_id is None:
                name_id = ids[ep.name] = zlib.crc32(ep.name.encode())
            h = mix64(digest ^ (name_id * 0x9E3779B97F4A7C15 & MASK64))
            if h > top:
                top, home = h, i
        return home


def holder(uncached: list[float], objectives: list[float], limit: float) -> int:
    """The index of the endpoint with the fewest `uncached` tokens among those whose objective is
    at most `limit` (of several holding as much, the one of the least objective), if it holds more
    of the prompt than the endpoint of the least objective; else -1 (that endpoint holds the most
    there already)."""
    best = objectives.index(min(objectives))
    keep, least = -1, uncached[best]
    for i, objective in enumerate(objectives):
        if objective <= limit:
            u = uncached[i]
            if u < least or (u == least and keep >= 0 and objective < objectives[keep]):
                keep, least = i, u
    return keep
