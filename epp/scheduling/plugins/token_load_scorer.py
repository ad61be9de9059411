"""`token-load-scorer`: penalise endpoints by the prompt tokens in flight on them (GIE semantics).

What it does: scores `1 - inflight_tokens / queueThresholdTokens`, floored at 0: an idle endpoint
scores 1.0, one with the threshold or more in flight 0.0. Unlike `inflight-load-scorer` in `tokens`
mode the scale is absolute, so two lightly loaded endpoints score nearly the same.

Inputs consumed: `Endpoint.inflight_tokens` (epp's own booking; GIE's `inflight-load-producer`).

Parameters:
- `queueThresholdTokens`: tokens in flight at which the score reaches 0; default 4194304.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry


@registry.register("token-load-scorer")
class TokenLoadScorer(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        queueThresholdTokens: Annotated[int, msgspec.Meta(gt=0)] = 4194304

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self._inverse = 1.0 / params.queueThresholdTokens

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        inverse = self._inverse
        return [max(0.0, 1.0 - ep.inflight_tokens * inverse) for ep in endpoints]

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """The input scored: each candidate's in-flight prompt tokens, against the threshold."""
        return framework.explain_inputs(
            cycle,
            lambda ep: {"inflight_tokens": ep.inflight_tokens},
            {"queue_threshold_tokens": round(1.0 / self._inverse)},
        )
