"""`topology-affinity-filter` and `topology-affinity-scorer` (llm-d, Alpha): in P/D, keep or prefer
the prefill endpoints close to the decode endpoint already picked (or, prefill first, the decode
endpoints close to the prefill pick), so KV-cache transfer takes NVLink or one switch hop.

An endpoint's locality is read by a `topology-extractor` (`topologyProducerName`, default the
plugin named `topology-extractor`; its pod labels: epp.scheduling.datalayer.TopologyLabels): the
hostname label (`kubernetes.io/hostname`, else the pod's `spec.hostname`), rack, zone, region. Two
endpoints share the tightest level at which both have the same non-empty value. The peer is the
pick of the other stage (`epp.scheduling.disagg`); without one (no P/D, the first stage) or
without an extractor, the filter keeps every candidate and the scorer gives 0, as llm-d's.

Filter: keeps candidates sharing `minAffinity` (host, default; rack, zone, region) or tighter;
none left -> every candidate. Scorer: host 1.0, rack 0.2, zone 0.05, region 0.02, none 0 (llm-d's
fixed curve).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry
from epp.scheduling.datalayer import TopologyLabels

DEFAULT_EXTRACTOR = "topology-extractor"
# Where epp.scheduling.disagg's runner leaves the other stage's pick for the running profile (its
# PEER_KEY; not imported: disagg imports the plugins package, tests keep the two equal).
PEER_KEY = "epp.disagg/peer"
LEVELS = ("host", "rack", "zone", "region")
SCORES = (1.0, 0.2, 0.05, 0.02)
NONE = len(LEVELS)


def locality(ep: Endpoint, labels: TopologyLabels) -> tuple[str, str, str, str]:
    spec = ep.spec
    tags = spec.labels
    return (
        tags.get(labels.hostname) or spec.hostname,
        tags.get(labels.rack, ""),
        tags.get(labels.zone, ""),
        tags.get(labels.region, ""),
    )


def level(peer: Sequence[str], candidate: Sequence[str]) -> int:
    """The tightest level index both share (0 host .. 3 region), NONE if none."""
    for i, (a, b) in enumerate(zip(peer, candidate, strict=True)):
        if a and a == b:
            return i
    return NONE


class _TopologyBase(registry.PluginBase):
    def __init__(self, name: str, producer: str) -> None:
        self.name = name
        self.producer = producer or DEFAULT_EXTRACTOR
        # The extractor's labels; set by the configuration loader (None: no such extractor).
        self.labels: TopologyLabels | None = None

    def _peer(self, cycle: interfaces.CycleState) -> tuple[str, str, str, str] | None:
        peer = cycle.get(PEER_KEY)
        if self.labels is None or not isinstance(peer, Endpoint):
            return None
        found = locality(peer, self.labels)
        return found if any(found) else None


@registry.register("topology-affinity-filter")
class TopologyAffinityFilter(_TopologyBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        minAffinity: str = "host"
        topologyProducerName: str = ""

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        super().__init__(name, params.topologyProducerName)
        if params.minAffinity not in LEVELS:
            raise registry.ConfigError(
                f"plugin {name!r} (type {self.type!r}): parameter minAffinity {params.minAffinity!r} must be "
                "one of host, rack, zone, region"
            )
        self._min = LEVELS.index(params.minAffinity)

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        peer = self._peer(cycle)
        if peer is None or self.labels is None:
            return endpoints
        labels = self.labels
        kept = [ep for ep in endpoints if level(peer, locality(ep, labels)) <= self._min]
        return kept or endpoints


@registry.register("topology-affinity-scorer")
class TopologyAffinityScorer(_TopologyBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        topologyProducerName: str = ""

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        super().__init__(name, params.topologyProducerName)

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        peer = self._peer(cycle)
        if peer is None or self.labels is None:
            return [0.0] * len(endpoints)
        labels = self.labels
        return [(*SCORES, 0.0)[level(peer, locality(ep, labels))] for ep in endpoints]

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        peer = self._peer(cycle)
        labels = self.labels

        def shared(ep: Endpoint) -> dict[str, Any]:
            found = NONE if peer is None or labels is None else level(peer, locality(ep, labels))
            return {"shared_level": LEVELS[found] if found < NONE else "none"}

        return framework.explain_inputs(cycle, shared)
