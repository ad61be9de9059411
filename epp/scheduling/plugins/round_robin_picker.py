"""`round-robin-picker`: endpoints in turn, by name, ignoring scores (epp's baseline).

What it does: orders the candidates by endpoint name and returns the `maxNumOfEndpoints` that
follow the previous primary in that order (wrapping around), so successive requests start at
successive endpoints. The cursor is the last primary's name, not a position, so it keeps its place
when endpoints come and go or a filter leaves a different subset. Not a GIE plugin: it exists to
measure what score-based picking gains.

Inputs consumed: `Endpoint.name`.

Parameters:
- `maxNumOfEndpoints`: how many endpoints to return at most; default 1.
"""

from __future__ import annotations

import bisect

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry


@registry.register("round-robin-picker")
class RoundRobinPicker(registry.PickerBase):
    def __init__(self, name: str, params: registry.PickerBase.Params, handle: interfaces.Handle) -> None:
        super().__init__(name, params, handle)
        self._last = ""  # name of the previous primary; "" sorts first, so we start at the first name

    def pick(
        self, cycle: interfaces.CycleState, request: InferenceRequest, scored: list[interfaces.ScoredEndpoint]
    ) -> list[Endpoint]:
        if not scored:
            return []
        names = sorted(s.endpoint.name for s in scored)
        by_name = {s.endpoint.name: s.endpoint for s in scored}
        n = len(names)
        start = bisect.bisect_right(names, self._last)
        picked = [by_name[names[(start + i) % n]] for i in range(min(self.max_endpoints, n))]
        self._last = picked[0].name
        return picked
