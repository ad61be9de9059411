"""`load-aware-scorer`: llm-d's waiting-queue scorer with a fixed scale.

What it does: an endpoint with an empty waiting queue scores 0.5; one with `w` waiting requests
scores `0.5 * (1 - min(w, threshold) / threshold)`, down to 0.0 at `threshold` or more. Unlike
`queue-scorer` (min-max over the candidates, so 1 waiting vs 2 is as far apart as 0 vs 100) the
scale is absolute: a uniformly light pool scores nearly the same everywhere, and the scorer's
weight means the same thing at every load. The ceiling is 0.5 rather than 1.0, as in llm-d, so a
weight carried over from an llm-d configuration keeps its effect.

Inputs consumed: `Endpoint.metrics.waiting` (scraped `vllm:num_requests_waiting`).

Parameters (llm-d's):
- `threshold` (128): the queue length that scores 0; > 0. (llm-d replaces a value <= 0 with the
  default and logs it; here it is a configuration error.)
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry

DEFAULT_THRESHOLD = 128  # llm-d's QueueThresholdDefault


@registry.register("load-aware-scorer")
class LoadAwareScorer(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        threshold: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_THRESHOLD

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self.threshold = float(params.threshold)

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        t = self.threshold
        return [0.5 * (1.0 - min(ep.metrics.waiting, t) / t) for ep in endpoints]

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """The input scored: each candidate's scraped queue depth, against the threshold."""
        return framework.explain_inputs(
            cycle, lambda ep: {"waiting": ep.metrics.waiting}, {"threshold": self.threshold}
        )
