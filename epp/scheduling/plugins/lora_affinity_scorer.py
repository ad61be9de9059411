"""`lora-affinity-scorer`: prefer endpoints that have the requested LoRA adapter loaded.

What it does: the request's target model is taken as the adapter name, and each endpoint scores

- 1.0 if the adapter is active (running) there;
- 0.8 if the endpoint has a free adapter slot (running + waiting adapters < max_lora);
- 0.6 if the adapter is waiting to be loaded there;
- 0.0 otherwise (all slots taken by other adapters).

The order of these tests follows GIE: a free slot beats an adapter already waiting to load. When no
candidate reports LoRA support at all (no adapters listed and max_lora 0 everywhere) the request
cannot be for an adapter, and every endpoint scores 1.0: this scorer then prefers none of them, and
1.0 is the value the min-max scorers give when they have nothing to tell apart.

Inputs consumed: `InferenceRequest.target_model`; `Endpoint.metrics.running_loras`,
`waiting_loras` and `max_lora` (scraped `vllm:lora_requests_info`).

Parameters: none.
"""

from __future__ import annotations

from typing import Any

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry


@registry.register("lora-affinity-scorer")
class LoraAffinityScorer(registry.PluginBase):
    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        adapter = request.target_model
        scores: list[float] = []
        lora_capable = False
        for ep in endpoints:
            m = ep.metrics
            running, waiting = m.running_loras, m.waiting_loras
            if m.max_lora or running or waiting:
                lora_capable = True
            if adapter in running:
                scores.append(1.0)
            elif len(running) + len(waiting) < m.max_lora:
                scores.append(0.8)
            elif adapter in waiting:
                scores.append(0.6)
            else:
                scores.append(0.0)
        return scores if lora_capable else [1.0] * len(endpoints)

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """The inputs scored: each candidate's scraped LoRA adapters (vllm:lora_requests_info)."""
        return framework.explain_inputs(
            cycle,
            lambda ep: {
                "running_loras": sorted(ep.metrics.running_loras),
                "waiting_loras": sorted(ep.metrics.waiting_loras),
                "max_lora": ep.metrics.max_lora,
            },
        )
