"""`random-picker`: endpoints chosen uniformly at random, ignoring scores.

What it does: returns `maxNumOfEndpoints` distinct endpoints drawn uniformly at random; the first
is the primary, the others are fallbacks. A baseline, and a way to spread load when scores carry
no information.

Inputs consumed: the candidate list only.

Parameters:
- `maxNumOfEndpoints`: how many endpoints to return at most; default 1.
"""

from __future__ import annotations

import random

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry


@registry.register("random-picker")
class RandomPicker(registry.PickerBase):
    def pick(
        self, cycle: interfaces.CycleState, request: InferenceRequest, scored: list[interfaces.ScoredEndpoint]
    ) -> list[Endpoint]:
        chosen = random.sample(scored, min(self.max_endpoints, len(scored)))
        return [s.endpoint for s in chosen]
