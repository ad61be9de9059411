"""`kv-cache-utilization-scorer`: prefer endpoints with more free KV cache.

What it does: scores `1 - kv_usage`; an endpoint with an empty cache scores 1.0, a full one 0.0.

Inputs consumed: `Endpoint.metrics.kv_usage`, a fraction 0..1 (scraped `vllm:kv_cache_usage_perc`).

Parameters: none.
"""

from __future__ import annotations

from typing import Any

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry


@registry.register("kv-cache-utilization-scorer")
class KvCacheUtilizationScorer(registry.PluginBase):
    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        # A scrape reporting usage above 1 gives a negative score; the framework clamps it to 0.
        return [1.0 - ep.metrics.kv_usage for ep in endpoints]

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """The input scored: each candidate's scraped KV-cache usage (0-1)."""
        return framework.explain_inputs(cycle, lambda ep: {"kv_usage": ep.metrics.kv_usage})
