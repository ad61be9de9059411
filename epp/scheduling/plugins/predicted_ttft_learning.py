"""How predicted-ttft-scorer learns its model online (the model, and why each rule: the scorer's
module docstring): from the time to first token of each response epp reads (`learn`), and from
the pods' own latency histograms between scrapes (`metrics_learning`).

`TTFTLearning` is a mixin of the scorer: the state it reads and moves (the per-endpoint rates, the
shared overhead and decode interference, the mean decode time) is the scorer's, set up in its
`__init__`; this module holds the learning rules, the scorer the pricing and the bookings.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from prometheus_client import Counter

from epp.datastore.endpoints import Endpoint
from epp.scheduling.plugins.metrics_learning import FirstTokens, Growth, ScrapedLatency
from epp.scheduling.plugins.predicted_ttft_terms import Rate, prefill_rate


class TTFTLearning:
    """The learning half of `PredictedTTFTScorer` (its attributes, declared here for the rules)."""

    name: str
    _rates: dict[str, Rate]
    _k_decode: float
    _overhead: float
    _decode_s: float
    _decode_seen: float
    _min_rate: float
    _max_step: float
    _prior_n: float
    _learn: bool
    _first: FirstTokens
    _scraped_check: float
    _from_metrics: Counter
    _endpoints: Callable[[], list[Endpoint]]
    _prior_cost: float

    def _rate(self, name: str) -> Rate:
        """`name`'s learned rate, the prior's until it has one."""
        rate = self._rates.get(name)
        if rate is None:
            rate = self._rates[name] = Rate(self._prior_cost, 0.0)
        return rate

    def _learn_from_pods(self, scraped: ScrapedLatency, now: float) -> None:
        """Learn from each pod's latency histograms' growth since the last window (module
        docstring of `metrics_learning`)."""
        self._scraped_check = now + scraped.window / 4.0
        learned = False
        for ep in self._endpoints():
            growth = scraped.growth(ep)
            if growth is not None:
                self._learn_growth(ep, growth)
                learned = True
        if learned:
            self._learned_from_pods()

    def _learned_from_pods(self) -> None:
        """After a pass that learned from some pods' growth (a subclass's hook)."""

    def _learn_growth(self, ep: Endpoint, growth: Growth) -> None:
        """One pod's growth: the mean decode time of the requests it finished meanwhile, and its
        prefill rate from the mean TTFT where few responses taught it (`FirstTokens`)."""
        self._from_metrics.inc()
        if growth.decodes >= 1.0 and growth.decode_seconds > 0.0:
            self._learn_decode(growth.decode_seconds / growth.decodes, growth.decodes)
        first = self._first.sample(ep.name, growth, ep.metrics.updated_at)
        if first is not None:
            self.learn(ep.name, first.ttft, first.tokens, first.decodes, first.requests)

    def _learn_decode(self, seconds: float, count: float = 1.0) -> None:
        """The time from first token to the end of a response, or the mean of `count` of them."""
        self._decode_seen += count
        weight = min(max(count / (self._decode_seen + 1.0), self._min_rate * count), 0.5)
        self._decode_s += weight * (seconds - self._decode_s)

    def learn(self, endpoint: str, ttft: float, tokens: float, decodes: int = 0, count: float = 1.0) -> None:
        """One observation: `tokens` of prefill (queued ahead plus its own) took `ttft` seconds
        beside `decodes` running requests; or the means of `count` such (a /metrics window).

        A gradient step on the squared log error of `(overhead + tokens * cost) * (1 + k *
        decodes)`, clipped (robust: `predicted_ttft_scorer`'s docstring): each parameter moves by
        its share of the prediction (d log ttft / d log parameter), the endpoint's cost with a
        weight decaying from the prior's to `minLearningRate`, the shared overhead and
        interference at that floor; a mean of `count` weighs as `count` observations (at most half
        of the whole).
        """
        rate = self._rate(endpoint)
        k, overhead = self._k_decode, self._overhead
        slowdown = 1.0 + k * decodes
        work = tokens * rate.cost
        error = self._clip(math.log(max(ttft, 1e-9) / ((overhead + work) * slowdown)))
        floor = min(self._min_rate * count, 0.5)
        if self._learn and decodes > 0:
            self._k_decode = min(max(k * math.exp(floor * error * k * decodes / slowdown), 1e-4), 1.0)
        if self._learn:
            self._overhead = min(
                max(overhead * math.exp(floor * error * overhead / (overhead + work)), 1e-4), 10.0
            )
        if tokens < 1.0:
            return
        weight = min(max(count / (rate.seen + count + self._prior_n), floor), 0.5)
        rate.cost *= math.exp(weight * error * work / (overhead + work))
        rate.seen += count
        prefill_rate.labels(self.name, endpoint).set(1.0 / rate.cost)

    def _clip(self, step: float) -> float:
        return max(-self._max_step, min(self._max_step, step))

    @property
    def decode_interference(self) -> float:
        """The prefill slowdown per running request, as learned so far."""
        return self._k_decode

    @property
    def overhead_seconds(self) -> float:
        """The time to first token of a full hit on an idle endpoint, as learned so far."""
        return self._overhead

    @property
    def decode_seconds(self) -> float:
        """The mean time from first token to the end of a response, as learned so far."""
        return self._decode_s
