"""`no-hit-lru-scorer`: spread requests no endpoint has cached over the endpoints used least
recently for such requests (llm-d's scorer of the same name).

Why: a prompt no endpoint holds any block of is a cache miss wherever it goes, so the prefix scorer
gives every endpoint 0 and load alone decides; bursts of new prompts then pile onto whichever
endpoint looks least loaded at that instant. Sending each new ("cold") prompt to the endpoint that
received a cold prompt longest ago spreads the new prefixes, and so future cache hits, evenly.

What it does, per request:
- warm (the prefix plugin found a match on some candidate): every endpoint scores 0.5, neutral;
- cold: endpoints are ranked never-used first (in candidate order), then by the age of their last
  cold request, oldest first; rank `r` of `n` scores `1 - r / (n - 1)` (one endpoint: 1.0).
- `pre_request`: after a cold request, its primary endpoint becomes the most recently used. The
  LRU holds at most `lruSize` endpoints; the oldest falls out (and counts as never used again).

Differences from llm-d: ranks are taken among the candidates, not over every endpoint the LRU has
seen (llm-d's scores can fall to 0 for candidates ranked behind endpoints that left the pool).

Inputs consumed: what the prefix scorers earlier in the profile left in the cycle (the
configuration loader refuses a profile listing one after this scorer):
`precise-prefix-cache-scorer`'s `PrefixMatch` (a hit is any matched endpoint), or
`prefix-cache-scorer`'s count of matched endpoints. llm-d reads the match any prefix plugin
attached to the endpoints, whatever the names; so does epp unless `prefixPluginName` is given.
Without any, the request is cold, as in llm-d when no prefix plugin runs.

Parameters (llm-d's):
- `prefixPluginName` (""): only this prefix plugin's match decides cold or warm ("": any).
- `prefixPluginType` (""): accepted; llm-d keeps it beside the name and does not use it to score.
- `lruSize` (1024): endpoints remembered; > 0 (llm-d replaces <= 0 by the default).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry
from epp.scheduling.plugins import prefix_cache_scorer
from epp.scheduling.plugins.precise_prefix_cache_scorer import PrefixMatch

DEFAULT_LRU_SIZE = 1024  # llm-d's defaultLRUSize


def is_warm(cycle: interfaces.CycleState, prefix_plugin: str) -> bool:
    """Whether the prefix plugin named `prefix_plugin` (any prefix plugin, if "") found a
    candidate holding a block of the request."""
    if prefix_plugin:
        found = cycle.get(prefix_plugin)
        if isinstance(found, PrefixMatch):
            return bool(found.matches)
        return bool(cycle.get(prefix_cache_scorer.matched_key(prefix_plugin), 0))
    return any(
        bool(value.matches) if isinstance(value, PrefixMatch) else key.endswith("/matched") and bool(value)
        for key, value in cycle.items()
    )


@registry.register("no-hit-lru-scorer")
class NoHitLRUScorer(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        prefixPluginName: str = ""
        prefixPluginType: str = ""
        lruSize: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_LRU_SIZE

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self.prefix_plugin = params.prefixPluginName
        self.prefix_type = params.prefixPluginType
        self._size = params.lruSize
        self._lru: OrderedDict[str, None] = OrderedDict()  # endpoint name, least recent first
        # pre_request gets no CycleState; the Director calls it right after `schedule` with no
        # await in between, so the last request scored is the one being routed.
        self._last: tuple[InferenceRequest, bool] | None = None

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        cold = not is_warm(cycle, self.prefix_plugin)
        self._last = (request, cold)
        cycle[self.name] = cold
        n = len(endpoints)
        if not cold:
            return [0.5] * n
        if n == 1:
            return [1.0]
        order = {name: i for i, name in enumerate(self._lru)}
        never = [i for i, ep in enumerate(endpoints) if ep.name not in order]
        used = sorted(
            (i for i, ep in enumerate(endpoints) if ep.name in order), key=lambda i: order[endpoints[i].name]
        )
        scores = [0.0] * n
        for rank, i in enumerate(never + used):
            scores[i] = 1.0 - rank / (n - 1)
        return scores

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        last, self._last = self._last, None
        if last is None or last[0] is not request or not last[1] or not result.targets:
            return
        name = result.targets[0].name
        self._lru[name] = None
        self._lru.move_to_end(name)
        while len(self._lru) > self._size:
            self._lru.popitem(last=False)

    def explain(self, cycle: interfaces.CycleState) -> dict[str, object]:
        """Whether no prefix scorer found a hit (`cold`), and per candidate the input ranked: its
        place in the record of cold picks (`lru_position`, 0 the least recent; -1 never sent one).
        The record changes in `pre_request`, after the explain call."""
        cold = cycle.get(self.name)
        if not isinstance(cold, bool):
            return {}
        order = {name: i for i, name in enumerate(self._lru)}
        found = framework.explain_inputs(cycle, lambda ep: {"lru_position": order.get(ep.name, -1)})
        return {**found, "request": {"cold": cold}}
