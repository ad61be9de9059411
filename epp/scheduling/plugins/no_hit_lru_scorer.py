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

Inputs consumed: the prefix match of its producer (llm-d v0.10's `PrefixCacheMatchInfo`): the
producer `prefixMatchInfoProducerName` names, by default `approx-prefix-cache-producer` (which
the configuration loader creates with llm-d's defaults when the configuration has none, as llm-d
does). A hit is a candidate with a whole block matched. The loader gives the scorer its producer
(`source`); when a prefix-cache-scorer reading the same producer already ran in the profile, its
match is reused, else the producer matches the request here. With no source (a scorer built
outside a configuration) every request is cold.

Parameters (llm-d's):
- `prefixMatchInfoProducerName` (""): the producer read ("": `approx-prefix-cache-producer`).
- `prefixPluginName`, `prefixPluginType` (""): accepted; llm-d v0.10 keeps them, deprecated and
  unused, and so does epp (logged).
- `lruSize` (1024): endpoints remembered; > 0 (llm-d replaces <= 0 by the default).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry
from epp.scheduling.plugins.prefix_match_scorer import PrefixProducer

DEFAULT_LRU_SIZE = 1024  # llm-d's defaultLRUSize


@registry.register("no-hit-lru-scorer")
class NoHitLRUScorer(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        prefixPluginName: str = ""  # deprecated in llm-d, unused
        prefixPluginType: str = ""  # deprecated in llm-d, unused
        lruSize: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_LRU_SIZE
        prefixMatchInfoProducerName: str = ""

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self.producer_name = params.prefixMatchInfoProducerName
        # The producer whose match decides cold or warm; set by the configuration loader.
        self.source: PrefixProducer | None = None
        self.config_notes = [
            f"plugin {name!r} (type {self.type!r}): {key} is deprecated and unused (as in llm-d); "
            "prefixMatchInfoProducerName names the producer read"
            for key in ("prefixPluginName", "prefixPluginType")
            if getattr(params, key)
        ]
        self._size = params.lruSize
        self._lru: OrderedDict[str, None] = OrderedDict()  # endpoint name, least recent first
        # pre_request gets no CycleState; the Director calls it right after `schedule` with no
        # await in between, so the last request scored is the one being routed.
        self._last: tuple[InferenceRequest, bool] | None = None

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        cold = not self._warm(cycle, request, endpoints)
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

    def _warm(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> bool:
        source = self.source
        if source is None:
            return False
        if source.name not in cycle:  # no scorer of this producer ran in the profile before
            source.score(cycle, request, endpoints)
        return any(matched >= 1.0 for matched, _, _ in source.match_info(cycle, endpoints))

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
        """Whether its producer found no hit (`cold`), and per candidate the input ranked: its
        place in the record of cold picks (`lru_position`, 0 the least recent; -1 never sent one).
        The record changes in `pre_request`, after the explain call."""
        cold = cycle.get(self.name)
        if not isinstance(cold, bool):
            return {}
        order = {name: i for i, name in enumerate(self._lru)}
        found = framework.explain_inputs(cycle, lambda ep: {"lru_position": order.get(ep.name, -1)})
        return {**found, "request": {"cold": cold}}
