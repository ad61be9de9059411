"""Every plugin type llm-d Router v0.10 registers, with the stability level and deprecation llm-d
gives it (`cmd/epp/runner/runner.go`, `registerInTreePlugins`, at llm-d-router `ebab687`).

llm-d refuses to start with an Alpha plugin unless `--allow-experimental-plugins` is given (its
`ValidatePluginStability`, over every plugin the configuration instantiates); epp does the same
for these types, with the plugin's line. epp's own plugin types (`request-latency-scorer`,
`dynamo-cost-scorer`, ...) are not llm-d's and have no stability level here.

Which of them epp builds, accepts as work it does another way, or refuses is decided elsewhere
(the registry, `config_compat`, flow control, the token producers and parsers);
tests/scheduling/test_catalog.py keeps every type below handled by one of them.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Stability = Literal["alpha", "beta"]


@dataclasses.dataclass(frozen=True, slots=True)
class LlmdType:
    stability: Stability
    replaced_by: str = ""  # deprecated in llm-d: the type it names instead


_A: LlmdType = LlmdType("alpha")
_B: LlmdType = LlmdType("beta")


def _deprecated(replacement: str) -> LlmdType:
    return LlmdType("beta", replacement)


LLMD_TYPES: dict[str, LlmdType] = {
    # scheduling: filters, scorers, pickers, profile handlers, deciders
    "active-request-scorer": _B,
    "always-disagg-multimodal-decider": _B,
    "always-disagg-pd-decider": _B,
    "by-label": _deprecated("label-selector-filter"),
    "by-label-selector": _deprecated("label-selector-filter"),
    "context-length-aware": _B,
    "data-parallel-profile-handler": _B,
    "decode-filter": _B,
    "disagg-headers-handler": _deprecated("disagg-profile-handler"),
    "disagg-profile-handler": _B,
    "encode-filter": _B,
    "endpoint-attribute-filter": _A,
    "endpoint-attribute-scorer": _A,
    "header-based-testing-filter": _B,
    "header-label-affinity-scorer": _A,
    "header-profile-handler": _A,
    "kv-cache-utilization-scorer": _B,
    "label-selector-filter": _B,
    "latency-scorer": _B,
    "load-aware-scorer": _B,
    "lora-affinity-scorer": _B,
    "max-score-picker": _B,
    "mm-embeddings-cache-scorer": _B,
    "multicluster-kv-cache-utilization-scorer": _A,
    "multicluster-prefix-cache-scorer": _A,
    "multicluster-queue-scorer": _A,
    "multicluster-session-affinity-filter": _A,
    "no-hit-lru-scorer": _B,
    "pd-profile-handler": _deprecated("disagg-profile-handler"),
    "precise-prefix-cache-scorer": _B,
    "prefill-filter": _B,
    "prefill-header-handler": _deprecated("disagg-profile-handler"),
    "prefix-based-pd-decider": _B,
    "prefix-cache-affinity-filter": _B,
    "prefix-cache-scorer": _B,
    "queue-scorer": _B,
    "random-picker": _B,
    "running-requests-size-scorer": _B,
    "session-affinity-filter": _A,
    "session-affinity-scorer": _A,
    "single-profile-handler": _B,
    "slo-headroom-tier-filter": _B,
    "token-load-scorer": _B,
    "topology-affinity-filter": _A,
    "topology-affinity-scorer": _A,
    "utilization-filter": _A,
    "weighted-random-picker": _B,
    # request control: producers, admitters, screeners, header processors, reporters
    "agent-identity": _A,
    "approx-prefix-cache-producer": _B,
    "burst-prefix-cache-producer": _A,
    "destination-endpoint-served-verifier": _B,
    "disaggregatedset-rollout-screener": _A,
    "inflight-load-producer": _B,
    "latency-slo-admitter": _B,
    "mm-embeddings-cache-producer": _B,
    "multicluster-approx-prefix-cache-producer": _A,
    "p2p-source-producer": _A,
    "precise-prefix-cache-producer": _B,
    "predicted-latency-producer": _B,
    "probabilistic-admitter": _B,
    "request-attribute-reporter": _B,
    "session-id-producer": _B,
    "token-producer": _B,
    "tokenizer": _deprecated("token-producer"),
    # request handling: parsers
    "anthropic-parser": _B,
    "openai-parser": _B,
    "passthrough-parser": _B,
    "sglanghttp-parser": _B,
    "vertexai-parser": _B,
    "vllmgrpc-parser": _B,
    "vllmhttp-parser": _B,
    # data layer: sources, extractors, discovery
    "core-metrics-extractor": _B,
    "dcgm-data-source": _A,
    "dcgm-extractor": _A,
    "endpoint-notification-source": _B,
    "file-discovery": _B,
    "k8s-notification-source": _B,
    "metrics-data-source": _B,
    "models-data-extractor": _B,
    "models-data-source": _B,
    "multicluster-file-discovery": _A,
    "multicluster-metrics-data-source": _A,
    "multicluster-metrics-extractor": _A,
    "topology-extractor": _A,
    # flow control: saturation detectors, fairness, ordering, usage limits, eviction
    "concurrency-detector": _B,
    "edf-ordering-policy": _B,
    "fcfs-ordering-policy": _B,
    "global-strict-fairness-policy": _B,
    "priority-holdback-policy": _A,
    "priority-then-time-eviction-order-policy": _A,
    "program-aware-fairness": _B,
    "round-robin-fairness-policy": _B,
    "sheddable-eviction-filter": _A,
    "slo-deadline-ordering-policy": _B,
    "soft-reflective-ceiling-policy": _A,
    "static-usage-limit-policy": _B,
    "utilization-detector": _B,
}

# Names epp also accepts for llm-d types (earlier llm-d releases): the same stability.
ALIASES = {
    "eviction-sheddable-filter": "sheddable-eviction-filter",
    "eviction-priority-then-time-ordering": "priority-then-time-eviction-order-policy",
}


def is_experimental(type_name: str) -> bool:
    """Whether llm-d registers `type_name` as Alpha (it then needs --allow-experimental-plugins)."""
    known = LLMD_TYPES.get(ALIASES.get(type_name, type_name))
    return known is not None and known.stability == "alpha"


def experimental_refusal(name: str, type_name: str) -> str:
    """The start-up error for an Alpha plugin without the flag, in llm-d's words."""
    return (
        f"plugin {name!r} (type {type_name!r}) has Alpha stability level, but command line flag "
        "--allow-experimental-plugins is not set (llm-d refuses it alike; add the flag to use it)"
    )
