"""`running-requests-size-scorer`: prefer endpoints running fewer requests.

What it does: min-max normalises each endpoint's count of running requests over the candidates,
`(max - r) / (max - min)`, so the least busy endpoint scores 1.0 and the busiest 0.0; when all are
equal every endpoint scores 1.0.

Inputs consumed: `Endpoint.metrics.running` (scraped `vllm:num_requests_running`).

Parameters: none.
"""

from __future__ import annotations

from typing import Any

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry


@registry.register("running-requests-size-scorer")
class RunningRequestsSizeScorer(registry.PluginBase):
    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        return framework.lower_is_better([ep.metrics.running for ep in endpoints])

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """The input scored: each candidate's scraped running requests."""
        return framework.explain_inputs(cycle, lambda ep: {"running": ep.metrics.running})
