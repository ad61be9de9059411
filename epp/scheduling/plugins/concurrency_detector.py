"""`concurrency-detector`: how saturated the pool is, from the load epp itself has in flight.

What it does (GIE's concurrency saturation detector):

- saturation: the pool's aggregate in-flight load over its aggregate capacity,
  `sum(inflight) / (len(endpoints) * limit)`, where in-flight is what epp booked at pick time and
  has not yet seen finish (exact for epp's own traffic, blind to anyone else's); no endpoints is
  1.0. Mode `hybrid`: per endpoint the larger of its request and token ratios, averaged over the
  endpoints (an endpoint full on either count shows). Admission sheds sheddable requests
  (priority < 0) while it is >= 1.0; flow control holds requests then.
- filter (when listed in a scheduling profile): keeps endpoints with
  `inflight < limit * (1 + headroom)` (in `hybrid`, both counts under their limits); when none
  passes, all are kept.

Inputs consumed: `Endpoint.inflight_requests` (mode `requests`) or `Endpoint.inflight_tokens`
(mode `tokens`: prompt tokens of the requests in flight).

Parameters (GIE's names and defaults):
- `concurrencyMode` ("requests"): `requests`, `tokens` or `hybrid`.
- `maxConcurrency` (100): in-flight requests per endpoint at capacity (mode `requests`); > 0.
- `maxTokenConcurrency` (1000000): in-flight prompt tokens per endpoint at capacity (mode
  `tokens`); > 0.
- `headroom` (0.0): the filter's tolerance above the limit, as a fraction; >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry


@registry.register("concurrency-detector")
class ConcurrencyDetector(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        concurrencyMode: Literal["requests", "tokens", "hybrid"] = "requests"
        maxConcurrency: Annotated[int, msgspec.Meta(gt=0)] = 100
        maxTokenConcurrency: Annotated[int, msgspec.Meta(gt=0)] = 1_000_000
        headroom: Annotated[float, msgspec.Meta(ge=0)] = 0.0

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self.tokens = params.concurrencyMode == "tokens"
        self.hybrid = params.concurrencyMode == "hybrid"
        self.limit = float(params.maxTokenConcurrency if self.tokens else params.maxConcurrency)
        self.token_limit = float(params.maxTokenConcurrency)
        self.headroom = params.headroom

    def _load(self, ep: Endpoint) -> int:
        return ep.inflight_tokens if self.tokens else ep.inflight_requests

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        if self.hybrid:
            limit, tokens = self.limit, self.token_limit
            return sum(
                max(ep.inflight_requests / limit, ep.inflight_tokens / tokens) for ep in endpoints
            ) / len(endpoints)
        return sum(self._load(ep) for ep in endpoints) / (len(endpoints) * self.limit)

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        limit = self.limit * (1 + self.headroom)
        if self.hybrid:
            tokens = self.token_limit * (1 + self.headroom)
            kept = [ep for ep in endpoints if ep.inflight_requests < limit and ep.inflight_tokens < tokens]
            return kept or endpoints
        return [ep for ep in endpoints if self._load(ep) < limit] or endpoints
