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

epp's addition, `maxPrefillTokens` (0: off): the prompt tokens per endpoint epp has sent and not
yet seen the first byte of the answer for (`Endpoint.prefill_tokens`), i.e. prefill work queued
or running on the pod. When set, saturation is the larger of the above and the pool's prefill
tokens over `len(endpoints) * maxPrefillTokens`, and the filter also keeps only endpoints under
`maxPrefillTokens * (1 + headroom)`. Why: vLLM runs every request it is sent (256 at once by
default) and prefills them first come, first served, so a critical request sent to a pod behind
others' prefills waits for them there, where no priority reorders them. Counting requests in
flight does not see this: a pod decoding many requests takes a new prompt's prefill in its next
step, one with several prompts just sent does not. With the limit, the prefills wait in epp's
queues, in priority and fairness order (docs/bench/flow-control.md#flow-control). It
learns a prefill ended from the first byte of the answer, so every response body passes through
epp while it is set (`--response-sample-ratio` is then 1 in effect).

Inputs consumed: `Endpoint.inflight_requests` (mode `requests`), `Endpoint.inflight_tokens`
(mode `tokens`: prompt tokens of the requests in flight), `Endpoint.prefill_tokens`
(`maxPrefillTokens`).

Parameters (GIE's names and defaults):
- `concurrencyMode` ("requests"): `requests`, `tokens` or `hybrid`.
- `maxConcurrency` (100): in-flight requests per endpoint at capacity (mode `requests`); > 0.
- `maxTokenConcurrency` (1000000): in-flight prompt tokens per endpoint at capacity (mode
  `tokens`); > 0.
- `headroom` (0.0): the filter's tolerance above the limit, as a fraction; >= 0.
- `maxPrefillTokens` (0, epp's): prompt tokens awaiting their first byte per endpoint at
  capacity; 0 turns it off; >= 0.
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
    reads_scrapes = False  # epp's own bookings (epp.flowcontrol.controller.dispatch_reads_scrapes)

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        concurrencyMode: Literal["requests", "tokens", "hybrid"] = "requests"
        maxConcurrency: Annotated[int, msgspec.Meta(gt=0)] = 100
        maxTokenConcurrency: Annotated[int, msgspec.Meta(gt=0)] = 1_000_000
        headroom: Annotated[float, msgspec.Meta(ge=0)] = 0.0
        maxPrefillTokens: Annotated[int, msgspec.Meta(ge=0)] = 0

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self.tokens = params.concurrencyMode == "tokens"
        self.hybrid = params.concurrencyMode == "hybrid"
        self.limit = float(params.maxTokenConcurrency if self.tokens else params.maxConcurrency)
        self.token_limit = float(params.maxTokenConcurrency)
        self.headroom = params.headroom
        self.prefill_limit = float(params.maxPrefillTokens)

    @property
    def counts_prefill(self) -> bool:
        """Whether it reads `Endpoint.prefill_tokens` (the Director then reads every first byte)."""
        return self.prefill_limit > 0

    def _load(self, ep: Endpoint) -> int:
        return ep.inflight_tokens if self.tokens else ep.inflight_requests

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        base = self._saturation(endpoints)
        if not self.prefill_limit:
            return base
        prefill = sum(ep.prefill_tokens for ep in endpoints) / (len(endpoints) * self.prefill_limit)
        return max(base, prefill)

    def _saturation(self, endpoints: Sequence[Endpoint]) -> float:
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
        else:
            kept = [ep for ep in endpoints if self._load(ep) < limit]
        if self.prefill_limit:
            prefill = self.prefill_limit * (1 + self.headroom)
            kept = [ep for ep in kept if ep.prefill_tokens < prefill]
        return kept or endpoints
