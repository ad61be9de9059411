"""`inflight-load-scorer`: prefer endpoints with less load that epp itself has sent.

What it does: min-max normalises each endpoint's in-flight load as booked by epp, fewer is better:
`(max - x) / (max - min)`; when all are equal every endpoint scores 1.0. epp books a request at
pick time and releases it when the response stream ends, so unlike scraped metrics (up to one scrape
interval old) this count is exact and already includes the previous request of a burst. It counts
only epp's own traffic, so it complements rather than replaces `queue-scorer`.

Inputs consumed: `Endpoint.inflight_requests` (mode `requests`) or `Endpoint.inflight_tokens`
(mode `tokens`, prompt tokens of the requests in flight).

Parameters:
- `mode`: `requests` (default) or `tokens`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry


@registry.register("inflight-load-scorer")
class InflightLoadScorer(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        mode: Literal["requests", "tokens"] = "requests"

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self._tokens = params.mode == "tokens"

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        if self._tokens:
            return framework.lower_is_better([ep.inflight_tokens for ep in endpoints])
        return framework.lower_is_better([ep.inflight_requests for ep in endpoints])

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """The input scored: each candidate's in-flight requests or prompt tokens booked by epp."""
        if self._tokens:
            return framework.explain_inputs(cycle, lambda ep: {"inflight_tokens": ep.inflight_tokens})
        return framework.explain_inputs(cycle, lambda ep: {"inflight_requests": ep.inflight_requests})
