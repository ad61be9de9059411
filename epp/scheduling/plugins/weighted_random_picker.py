"""`weighted-random-picker`: endpoints drawn at random with probability proportional to score.

What it does: weighted sampling without replacement by A-Res (Efraimidis and Spirakis): each
endpoint with a positive score draws the key `U ** (1 / score)`, U uniform in (0, 1], and the
`maxNumOfEndpoints` largest keys win, largest first. The first draw picks an endpoint with
probability score / sum of scores. The key is computed as its logarithm, `log(U) / score`, which
orders the same way but does not underflow to 0 for small scores.

Endpoints scoring 0 or less are never picked, so fewer than `maxNumOfEndpoints` may be returned.
When no endpoint has a positive score, all are equally likely (uniform sampling).

Inputs consumed: the total scores from the framework.

Parameters:
- `maxNumOfEndpoints`: how many endpoints to return at most; default 1.
"""

from __future__ import annotations

import heapq
import math
import random

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry


def _key(keyed: tuple[float, Endpoint]) -> float:
    return keyed[0]


@registry.register("weighted-random-picker")
class WeightedRandomPicker(registry.PickerBase):
    def pick(
        self, cycle: interfaces.CycleState, request: InferenceRequest, scored: list[interfaces.ScoredEndpoint]
    ) -> list[Endpoint]:
        rand, log = random.random, math.log
        # 1.0 - random() lies in (0, 1], so log() is defined.
        keyed = [(log(1.0 - rand()) / s.score, s.endpoint) for s in scored if s.score > 0.0]
        if not keyed:
            chosen = random.sample(scored, min(self.max_endpoints, len(scored)))
            return [s.endpoint for s in chosen]
        if self.max_endpoints == 1:
            return [max(keyed, key=_key)[1]]
        return [endpoint for _, endpoint in heapq.nlargest(self.max_endpoints, keyed, key=_key)]
