"""llm-d's load plugins that read in-flight counts and scraped metrics: `active-request-scorer` and
`utilization-filter` (Alpha).

In-flight requests are epp's own count per endpoint (booked at pick time, released at the end of
the response stream), what llm-d's `inflight-load-producer` counts for these plugins.

- `active-request-scorer`: endpoints with at most `idleThreshold` (0) requests in flight score
  1.0; the others `(max - n) / max * maxBusyScore` (1.0; a value outside [0, 1] is refused where
  llm-d ignores it). `requestTimeout` is accepted and unused (deprecated in llm-d, which ignores
  it too); `inFlightLoadProducerName` names the in-flight producer (epp has one count).
- `utilization-filter`: keeps endpoints meeting every condition `{metric, maxValue}`, metric one
  of active-requests, running-requests, waiting-queue, kv-cache-utilization (a fraction, <= 1);
  `fallbackOnEmpty` returns every candidate when none is left.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry

_Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


@registry.register("active-request-scorer")
class ActiveRequestScorer(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        requestTimeout: str = ""
        idleThreshold: Annotated[int, msgspec.Meta(ge=0)] = 0
        maxBusyScore: _Fraction = 1.0
        inFlightLoadProducerName: str = ""

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self._idle = params.idleThreshold
        self._busy = params.maxBusyScore
        self.config_notes = (
            [f"plugin {name!r} (type {self.type!r}): requestTimeout is deprecated and unused (as in llm-d)"]
            if params.requestTimeout
            else []
        )

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        counts = [ep.inflight_requests for ep in endpoints]
        most = max(counts, default=0)
        return [1.0 if n <= self._idle else (most - n) / most * self._busy for n in counts]

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        return framework.explain_inputs(cycle, lambda ep: {"inflight_requests": ep.inflight_requests})


class _Condition(msgspec.Struct, forbid_unknown_fields=True):
    metric: Literal["active-requests", "running-requests", "waiting-queue", "kv-cache-utilization"]
    maxValue: Annotated[float, msgspec.Meta(ge=0.0)] | None = None


def _value(ep: Endpoint, metric: str) -> float:
    if metric == "active-requests":
        return ep.inflight_requests
    if metric == "running-requests":
        return ep.metrics.running
    if metric == "waiting-queue":
        return ep.metrics.waiting
    return ep.metrics.kv_usage


@registry.register("utilization-filter")
class UtilizationFilter(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        conditions: list[_Condition] = []
        fallbackOnEmpty: bool = False
        inFlightLoadProducerName: str = ""

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        label = f"plugin {name!r} (type {self.type!r})"
        if not params.conditions:
            raise registry.ConfigError(f"{label}: at least one condition is required")
        limits: list[tuple[str, float]] = []
        for i, cond in enumerate(params.conditions):
            if cond.maxValue is None:
                raise registry.ConfigError(f"{label}: parameter conditions[{i}].maxValue is required")
            if cond.metric == "kv-cache-utilization" and cond.maxValue > 1:
                raise registry.ConfigError(
                    f"{label}: parameter conditions[{i}].maxValue is a fraction for kv-cache-utilization "
                    "(<= 1)"
                )
            limits.append((cond.metric, cond.maxValue))
        self._limits = limits
        self._fallback = params.fallbackOnEmpty

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        kept = [ep for ep in endpoints if all(_value(ep, m) <= limit for m, limit in self._limits)]
        return endpoints if not kept and self._fallback else kept
