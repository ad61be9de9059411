"""Response sampling: which responses still pass through epp where the gateway lets epp skip them.

Where the gateway lets epp stop a response's streaming (Envoy's `allow_mode_override`, epp's own
gateway config), only `response_sample_ratio` of the requests (and every request whose model name
is rewritten back) keep passing their body through epp. The decision is made at routing time
(`RequestContext.sampled`); the ext-proc layer acts on it.

The ratio alone would leave a quiet endpoint without samples for minutes (1 in 100 of a few
requests a second). The per-endpoint rates predicted-ttft-scorer and request-latency-scorer learn
come from a vLLM pod's own latency histograms where its /metrics page has them
(`epp.scheduling.plugins.metrics_learning`); for an endpoint whose page does not (another server,
an older vLLM) they come from sampled responses only, so such an endpoint with no sampled
response started within `response_sample_min_interval` gets its next request sampled (a
per-endpoint floor). The floor is not needed, and not applied, where the page reports the pod's
time to first token: its samples (the next request once the interval passed, not random ones)
taught the prefill rate worse than the histogram does (docs/bench/overhead.md#sampled-routing).
The floor's samples count toward the ratio, so at high rates, where the ratio already samples
every endpoint that often, it adds nothing. Once an endpoint has had `SETTLE_SAMPLES` sampled
responses, its floor widens to `response_sample_settled_interval`: a sampled stream costs epp
and Envoy ~50 ms of CPU (one gRPC round trip per chunk), so a 2 s floor on every endpoint was a
third of epp's CPU per request on 8 pods and grows with the pool, while the learners by then
weigh each new sample at their floor rate (predicted-ttft-scorer's default prior is worth 20
observations and its step reaches `minLearningRate` 0.02 at the 29th): later samples track
drift, not the rate.

With `response_sample_headers` "sampled" (`--response-sample-headers=sampled`) a request can be
off-sample from its headers on (`early`): the ext-proc layer then answers the request headers
with a mode override that skips the response's headers too, one ext-proc round trip less per
request (docs/bench/fleet-cost.md#rust-routers). That decision comes before the body is parsed or
an endpoint picked, so it is taken only where routing could not ask for a sample: no model name
to rewrite back (no InferenceModelRewrite rules, no rewrite header), no response-header plugin,
no detector that needs the first byte, and no endpoint due for its floor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from epp import clock
from epp.datastore.endpoints import Datastore, Endpoint

SETTLE_SAMPLES = 32
"""Sampled responses after which an endpoint's floor widens to the settled interval: past the
29th, predicted-ttft-scorer's default step weight is at its floor (module docstring)."""

FLOOR_RECHECK_S = 1.0
"""How long `early` trusts its last look at the floors (an endpoint that starts or stops
reporting its latency histograms is seen within this; one that joins or leaves, at once)."""


class ResponseSampler:
    """The ratio's credit and each endpoint's floor, for one Director."""

    def __init__(
        self, datastore: Datastore, *, ratio: float, min_interval: float, settled_interval: float
    ) -> None:
        self._datastore = datastore
        self.ratio = ratio
        self.min_interval = min_interval
        self.settled_interval = settled_interval
        # Deterministic sampling: every request adds the ratio, a whole unit buys one sample.
        self._credit = 1.0 - ratio if ratio > 0.0 else 0.0  # the first request is sampled
        # Each endpoint's floor: when it last had a sampled response and how many it has had.
        self._floors: dict[Endpoint, _Floor] = {}
        # `early`: no floor is due before this time (0: look again).
        self._none_due_until = 0.0

    def sample(self, endpoint: Endpoint, required: bool) -> bool:
        """Whether this request's response is read through: `required` (a rewritten model name),
        `endpoint`'s first request after its floor's interval without a sample (an endpoint whose
        /metrics lacks vLLM's latency histograms: module docstring), or a share of the ratio,
        spread evenly rather than at random so a low ratio still samples steadily. Every sample
        but a required one spends a unit of the ratio's credit (never below 0): the floor's
        samples count toward the ratio."""
        interval = self.min_interval
        floor = self._floors.get(endpoint) if interval > 0.0 else None
        now = clock.now() if interval > 0.0 else 0.0
        if required:
            sampled = True
        else:
            credit = self._credit + self.ratio
            sampled = credit >= 1.0
            if not sampled and interval > 0.0 and not reports_latency(endpoint):
                sampled = floor is None or now - floor.at >= self._wait(floor)
            self._credit = max(0.0, credit - 1.0) if sampled else credit
        if sampled and interval > 0.0:
            if floor is None:
                floor = self._floors[endpoint] = _Floor()
            floor.at = now
            floor.count += 1
        return sampled

    def early(self) -> bool:
        """Whether the next request is off-sample whatever its endpoint turns out to be: its share
        of the ratio is spent here (True) or left for `sample` (False). The caller has ruled out
        a required sample (module docstring)."""
        credit = self._credit + self.ratio
        if credit >= 1.0 or self._floor_due():
            return False
        self._credit = credit
        return True

    def forget(self, removed: Iterable[Endpoint]) -> None:
        for ep in removed:
            self._floors.pop(ep, None)
        self._none_due_until = 0.0  # a new endpoint has no floor yet: due at once

    def _wait(self, floor: _Floor) -> float:
        return self.settled_interval if floor.count >= SETTLE_SAMPLES else self.min_interval

    def _floor_due(self) -> bool:
        """Whether some endpoint would take its request as a floor sample now. The answer "none"
        holds until the earliest floor falls due (or `FLOOR_RECHECK_S`): a pool of 1,000 is not
        walked per request."""
        if self.min_interval <= 0.0:
            return False
        now = clock.now()
        if now < self._none_due_until:
            return False
        earliest = math.inf
        for ep in self._datastore.endpoints():
            if reports_latency(ep):
                continue
            floor = self._floors.get(ep)
            if floor is None:
                return True
            due = floor.at + self._wait(floor)
            if due <= now:
                return True
            earliest = min(earliest, due)
        self._none_due_until = min(earliest, now + FLOOR_RECHECK_S)
        return False


class _Floor:
    """One endpoint's sample floor: when its last sampled response started, and how many."""

    __slots__ = ("at", "count")

    def __init__(self) -> None:
        self.at = 0.0
        self.count = 0


def reports_latency(endpoint: Endpoint) -> bool:
    """Whether `endpoint`'s last scrape had vLLM's latency histograms with a first token counted:
    the latency scorers learn its rates from them (no floor needed)."""
    latency = endpoint.metrics.latency
    return latency is not None and latency.ttfts > 0.0
