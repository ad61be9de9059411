"""`queue-scorer`: prefer endpoints with shorter waiting queues.

What it does: min-max normalises each endpoint's waiting-queue length over the candidates,
`(max - q) / (max - min)`, so the shortest queue scores 1.0 and the longest 0.0; when all queues
are equal every endpoint scores 1.0.

Inputs consumed: `Endpoint.metrics.waiting` (scraped `vllm:num_requests_waiting`).

Parameters: none.
"""

from __future__ import annotations

from typing import Any

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry


@registry.register("queue-scorer")
class QueueScorer(registry.PluginBase):
    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        return framework.lower_is_better([ep.metrics.waiting for ep in endpoints])

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """The input scored: each candidate's scraped queue depth."""
        return framework.explain_inputs(cycle, lambda ep: {"waiting": ep.metrics.waiting})
