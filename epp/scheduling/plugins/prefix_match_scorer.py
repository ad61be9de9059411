"""llm-d v0.9+'s `prefix-cache-scorer`: scores the prefix match a named producer found.

In llm-d v0.9+ the prefix-cache index lives in a data producer (`approx-prefix-cache-producer`,
`precise-prefix-cache-producer`, `burst-prefix-cache-producer`) and `prefix-cache-scorer` only
reads the match it attaches to each endpoint (`PrefixCacheMatchInfo`: blocks matched, request
blocks, block size). epp's producers are its prefix scorers (`PrefixCacheScorer`,
`PrecisePrefixCacheScorer`) under the producer's name; this scorer asks its producer to match
the request (`score`, which leaves the match in the cycle state under the producer's name) and
scores each endpoint as llm-d's does:

    score = (1 - matchLengthWeight) * matched / total
          + matchLengthWeight * min(1, matched * blockSize / matchLengthScaleTokens) ** 2

Parameters (llm-d's, decoded in `epp.scheduling.producers`): `prefixMatchInfoProducerName` (the
producer; default `approx-prefix-cache-producer`, created with llm-d's defaults when the
configuration has no plugin of that name, as llm-d creates its default producer),
`matchLengthWeight` (0, in [0, 1]), `matchLengthScaleTokens` (8192, > 0 when the weight is).

GIE v1.x's `prefix-cache-scorer` (parameters `blockSizeTokens`, `lruCapacityPerServer`, ...) is
`prefix_cache_scorer.PrefixCacheScorer` itself; `epp.scheduling.producers` says which form a
configuration's scorer is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final, Protocol

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces


class PrefixProducer(interfaces.Scorer, Protocol):
    """A prefix producer: matches the request in `score`, then tells what it matched."""

    def match_info(
        self, cycle: interfaces.CycleState, endpoints: Sequence[Endpoint]
    ) -> list[tuple[float, int, int]]: ...

    def explain(self, cycle: interfaces.CycleState) -> Mapping[str, Any]: ...


class PrefixMatchScorer:
    type: ClassVar[str] = "prefix-cache-scorer"
    consumes_tokens: Final = True

    def __init__(
        self,
        name: str,
        source: PrefixProducer,
        *,
        match_length_weight: float = 0.0,
        match_length_scale_tokens: int = 8192,
    ) -> None:
        self.name = name
        self.source = source
        self._weight = match_length_weight
        self._scale = match_length_scale_tokens

    def __repr__(self) -> str:
        return f"{self.name}/{self.type}"

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        self.source.score(cycle, request, endpoints)
        weight = self._weight
        out: list[float] = []
        for matched, total, block in self.source.match_info(cycle, endpoints):
            if total <= 0:
                out.append(0.0)
                continue
            score = (1.0 - weight) * matched / total
            if weight > 0.0 and block > 0:
                length = min(1.0, matched * block / self._scale)
                score += weight * length * length
            out.append(score)
        return out

    def explain(self, cycle: interfaces.CycleState) -> Mapping[str, Any]:
        return self.source.explain(cycle)
