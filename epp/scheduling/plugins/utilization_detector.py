"""`utilization-detector`: how saturated the pool is, from the model servers' scraped metrics.

What it does (GIE's default saturation detector):

- saturation: per endpoint `max(waiting / queueDepthThreshold, kv_usage / kvCacheUtilThreshold)`;
  an endpoint whose metrics are missing (never scraped) or older than `metricsStalenessThreshold`
  (plus the scraper's `grace` for an endpoint it reads less often by design: an idle one at
  `--idle-metrics-interval`, epp.datastore.pacing) counts as 1.0 (saturated: what is not known
  to be free is not offered). The pool's saturation is the **average** over the endpoints; no
  endpoints is 1.0. Admission sheds sheddable requests (priority < 0) while it is >= 1.0.
- filter (when listed in a scheduling profile): keeps endpoints with
  `waiting < queueDepthThreshold * (1 + headroom)` and `kv_usage < kvCacheUtilThreshold * (1 +
  headroom)`; when none passes, all are kept (a filter must not turn load into an outage).

`stale_count` says how many endpoints count as saturated for stale metrics alone: flow control
reports a halt they cause as a metrics problem, not as load.

Inputs consumed: `Endpoint.metrics.waiting`, `.kv_usage`, `.updated_at` and `.grace` (the scraper's).

Parameters (GIE's names and defaults):
- `queueDepthThreshold` (5): waiting requests at which an endpoint counts as saturated; > 0.
- `kvCacheUtilThreshold` (0.8): KV-cache usage at which it counts as saturated; in (0, 1].
- `metricsStalenessThreshold` ("200ms"): a Go duration (`ms`, `s`, `m`, ...; e.g. `1.5s`); > 0.
  epp scrapes every 50 ms by default (`--refresh-metrics-interval`); a longer interval needs a
  longer threshold, or every endpoint reads as saturated.
- `headroom` (0.0): the filter's tolerance above the thresholds, as a fraction; >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from epp import clock
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint, ModelServerMetrics
from epp.scheduling import interfaces, registry
from epp.units import parse_duration


@registry.register("utilization-detector")
class UtilizationDetector(registry.PluginBase):
    reads_scrapes = True  # the pods' /metrics (epp.flowcontrol.controller.dispatch_reads_scrapes)

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        queueDepthThreshold: Annotated[int, msgspec.Meta(gt=0)] = 5
        kvCacheUtilThreshold: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8
        metricsStalenessThreshold: str = "200ms"
        headroom: Annotated[float, msgspec.Meta(ge=0)] = 0.0

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        try:
            self.staleness = parse_duration(params.metricsStalenessThreshold)
        except ValueError as err:
            raise registry.ConfigError(
                f"plugin {name!r} (type {self.type!r}): metricsStalenessThreshold: {err}"
            ) from None
        if self.staleness <= 0:
            raise registry.ConfigError(
                f"plugin {name!r} (type {self.type!r}): metricsStalenessThreshold must be > 0"
            )
        self.queue_threshold = float(params.queueDepthThreshold)
        self.kv_threshold = params.kvCacheUtilThreshold
        self.headroom = params.headroom

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        now = clock.now()
        total = 0.0
        for ep in endpoints:
            m = ep.metrics
            if self._stale(m, now):
                total += 1.0
            else:
                total += max(m.waiting / self.queue_threshold, m.kv_usage / self.kv_threshold)
        return total / len(endpoints)

    def stale_count(self, endpoints: Sequence[Endpoint]) -> int:
        """How many of `endpoints` count as saturated only because their metrics are missing or
        stale (flow control tells a scrape problem from overload by it)."""
        now = clock.now()
        return sum(1 for ep in endpoints if self._stale(ep.metrics, now))

    def _stale(self, m: ModelServerMetrics, now: float) -> bool:
        """Never scraped, or older than the threshold plus the scraper's chosen wait (`grace`)."""
        return not m.updated_at or now - m.updated_at > self.staleness + m.grace

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        queue_limit = self.queue_threshold * (1 + self.headroom)
        kv_limit = self.kv_threshold * (1 + self.headroom)
        kept = [ep for ep in endpoints if ep.metrics.waiting < queue_limit and ep.metrics.kv_usage < kv_limit]
        return kept or endpoints
