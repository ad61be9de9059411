"""`bounded-load-filter`: drop endpoints whose in-flight load is far above the pool's median.

What it does: Ranvier's load-aware override (peers.md section 5.2: divert from the preferred
backend when its load exceeds `median * load_imbalance_factor + load_imbalance_floor`, defaults
2.0 and 2). As a filter it removes every endpoint over that bound, so the scorers after it (a
prefix scorer for affinity) choose among the rest: a preferred endpoint within the bound keeps its
traffic, one over it loses it to the best remaining. The least-loaded endpoint is never over the
bound (it is at or below the median), so the filter never empties the list.

Inputs consumed: `Endpoint.inflight_requests` (epp's own booking, as Ranvier's local in-flight count).

Parameters:
- `loadImbalanceFactor` (2.0): multiple of the median in-flight count an endpoint may carry; >= 1.
- `loadImbalanceFloor` (2): requests allowed above that in any case (keeps a near-idle pool,
  median 0, from bouncing between endpoints); >= 0.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry


@registry.register("bounded-load-filter")
class BoundedLoadFilter(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        loadImbalanceFactor: Annotated[float, msgspec.Meta(ge=1.0)] = 2.0
        loadImbalanceFloor: Annotated[int, msgspec.Meta(ge=0)] = 2

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self._factor = params.loadImbalanceFactor
        self._floor = params.loadImbalanceFloor

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        if not endpoints:
            return endpoints
        bound = self.bound([ep.inflight_requests for ep in endpoints])
        return [ep for ep in endpoints if ep.inflight_requests <= bound]

    def bound(self, loads: list[int]) -> float:
        """The most in-flight requests an endpoint may have and stay: median * factor + floor."""
        ordered = sorted(loads)
        n = len(ordered)
        median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
        return median * self._factor + self._floor
