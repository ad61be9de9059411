"""llm-d's request-control plugins that are neither filters, scorers nor pickers:
`probabilistic-admitter` and GIE's conformance `destination-endpoint-served-verifier`.

- `probabilistic-admitter` (llm-d, an Admitter): requests of priority >= 0 are always admitted;
  a sheddable one (priority < 0) is refused with probability min(saturation ** power * k, 1),
  saturation being the candidates' mean of max(waiting / queueDepthThreshold, KV usage /
  kvCacheUtilThreshold). Parameters (defaults): queueDepthThreshold (5), kvCacheUtilThreshold
  (0.8), power (5), k (300), each > 0. llm-d's director wraps the refusal as an internal error,
  so the client gets 500 with "request cannot be admitted: probabilistic-admitter: rejected,
  saturation=... prob=..."; epp answers the same.
- `destination-endpoint-served-verifier` (GIE's conformance suite): writes the endpoint Envoy
  reports it served the request from (`envoy.lb` metadata `x-gateway-destination-endpoint-served`)
  into the response header `x-conformance-test-served-endpoint`, or "fail: ..." when Envoy
  reported none.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Annotated

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry

SERVED_HEADER = "x-conformance-test-served-endpoint"
_Positive = Annotated[float, msgspec.Meta(gt=0.0)]


@registry.register("probabilistic-admitter")
class ProbabilisticAdmitter(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        queueDepthThreshold: Annotated[int, msgspec.Meta(gt=0)] = 5
        kvCacheUtilThreshold: _Positive = 0.8
        power: _Positive = 5.0
        k: _Positive = 300.0

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self._queue = float(params.queueDepthThreshold)
        self._kv = params.kvCacheUtilThreshold
        self._power = params.power
        self._k = params.k
        self.random = random.random  # tests replace it

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        total = 0.0
        for ep in endpoints:
            m = ep.metrics
            total += max(m.waiting / self._queue, m.kv_usage / self._kv)
        return total / len(endpoints)

    def admit(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> str | None:
        if request.priority >= 0 or not endpoints:
            return None
        saturation = self.saturation(endpoints)
        probability = min(saturation**self._power * self._k, 1.0)
        if self.random() < probability:
            return f"probabilistic-admitter: rejected, saturation={saturation:.3f} prob={probability:.2f}"
        return None


@registry.register("destination-endpoint-served-verifier")
class DestinationEndpointServedVerifier(registry.PluginBase):
    def response_headers(
        self,
        request: InferenceRequest,
        result: interfaces.SchedulingResult,
        served: str | None,
        headers: Mapping[str, str],
    ) -> Mapping[str, str]:
        if served is None:
            return {SERVED_HEADER: "fail: missing destination endpoint served metadata"}
        return {SERVED_HEADER: served}
