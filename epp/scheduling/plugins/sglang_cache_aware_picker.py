"""`sglang-cache-aware-picker`: SGLang router's `cache_aware` rule, as a picker over a prefix score.

What it does (sglang-router / SMG `cache_aware`, peers.md section 2.2; CLI defaults 0.3 / 64 / 1.5):

1. Load is the router's own in-flight request count per endpoint. The pool is *imbalanced* when
   `max - min > balanceAbsThreshold` and `max > min * balanceRelThreshold`; then the least-loaded
   endpoint wins, whatever the cache says.
2. Otherwise the best prefix match wins if its match ratio is above `cacheThreshold`; endpoints
   matching equally well are told apart by load (SGLang takes "the first tenant" of the deepest
   matched node, which is arbitrary; load is a fair stand-in for arbitrary that does not pile up).
3. Otherwise (no match worth following) the least-loaded endpoint wins, ties broken by fewest
   requests picked so far and then by candidate order (SMG's `(load, processed, index)`, smg #1714).

Fallbacks (`maxNumOfEndpoints > 1`) follow the primary, least loaded first.

Inputs consumed: the total score of each endpoint, read as its prefix match ratio in [0, 1]. So the
profile must hold exactly one scorer, a prefix scorer at weight 1 (`prefix-cache-scorer` is SGLang's
approximate tree: it learns each decision, as SGLang inserts the request under the chosen worker).
`Endpoint.inflight_requests` (epp's booking) is the load.

Parameters:
- `cacheThreshold` (0.3): match ratio above which the cache decides; in [0, 1].
- `balanceAbsThreshold` (64): in-flight difference (max - min) beyond which load may decide; >= 0.
- `balanceRelThreshold` (1.5): ratio max / min beyond which load may decide; >= 1.
- `maxNumOfEndpoints` (1): as every picker.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry


@registry.register("sglang-cache-aware-picker")
class SglangCacheAwarePicker(registry.PickerBase):
    class Params(registry.PickerBase.Params, forbid_unknown_fields=True):
        cacheThreshold: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.3
        balanceAbsThreshold: Annotated[int, msgspec.Meta(ge=0)] = 64
        balanceRelThreshold: Annotated[float, msgspec.Meta(ge=1.0)] = 1.5

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        super().__init__(name, params, handle)
        self._threshold = params.cacheThreshold
        self._abs = params.balanceAbsThreshold
        self._rel = params.balanceRelThreshold
        self._processed: dict[str, int] = {}  # endpoint name -> times picked as primary

    def pick(
        self, cycle: interfaces.CycleState, request: InferenceRequest, scored: list[interfaces.ScoredEndpoint]
    ) -> list[Endpoint]:
        if not scored:
            return []
        processed = self._processed
        # Candidate order is the last tie-break, so a stable min over (load, processed) suffices.
        by_load = sorted(
            (s.endpoint for s in scored), key=lambda ep: (ep.inflight_requests, processed.get(ep.name, 0))
        )
        primary = by_load[0]
        if not self.imbalanced([ep.inflight_requests for ep in by_load]):
            best = max(s.score for s in scored)
            if best > self._threshold:
                holders = {id(s.endpoint) for s in scored if s.score == best}
                primary = next(ep for ep in by_load if id(ep) in holders)
        processed[primary.name] = processed.get(primary.name, 0) + 1
        if self.max_endpoints == 1:
            return [primary]
        return [primary, *(ep for ep in by_load if ep is not primary)][: self.max_endpoints]

    def imbalanced(self, loads: list[int]) -> bool:
        """SGLang's gate: both the absolute and the relative spread of load exceed their bounds."""
        lo, hi = min(loads), max(loads)
        return hi - lo > self._abs and hi > lo * self._rel
