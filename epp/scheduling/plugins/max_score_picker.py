"""`max-score-picker`: the endpoints with the highest total score, ties broken at random.

What it does: returns the `maxNumOfEndpoints` best-scored endpoints, best first (the primary,
then the fallbacks in order). Endpoints with equal scores are ordered uniformly at random, so that
equally good endpoints share the load instead of the first one in the list taking it all.

For one endpoint (the default) a single pass keeps the best so far and replaces it by a tied one
with probability 1/(ties seen) (reservoir sampling), which is uniform over the tied endpoints
without shuffling or sorting; for more, a shuffle followed by a stable descending sort.

Inputs consumed: the total scores from the framework.

Parameters:
- `maxNumOfEndpoints`: how many endpoints to return at most; default 1.
"""

from __future__ import annotations

import random

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry


def _score(scored: interfaces.ScoredEndpoint) -> float:
    return scored.score


@registry.register("max-score-picker")
class MaxScorePicker(registry.PickerBase):
    def pick(
        self, cycle: interfaces.CycleState, request: InferenceRequest, scored: list[interfaces.ScoredEndpoint]
    ) -> list[Endpoint]:
        if self.max_endpoints == 1:
            return [self._best(scored)] if scored else []
        order = scored.copy()
        random.shuffle(order)
        order.sort(key=_score, reverse=True)  # stable, so the shuffle decides among equal scores
        return [s.endpoint for s in order[: self.max_endpoints]]

    @staticmethod
    def _best(scored: list[interfaces.ScoredEndpoint]) -> Endpoint:
        rest = iter(scored)
        first = next(rest)
        best, top, ties = first.endpoint, first.score, 1
        rand = random.random
        for s in rest:
            score = s.score
            if score > top:
                best, top, ties = s.endpoint, score, 1
            elif score == top:
                ties += 1
                if rand() * ties < 1.0:
                    best = s.endpoint
        return best
