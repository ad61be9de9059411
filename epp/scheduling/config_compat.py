"""The parts of GIE's and llm-d's EndpointPickerConfig vocabulary that epp accepts without building
a plugin from them, or refuses with a reason: used by `config`.

Three groups of plugin types:

- `GIE_ONLY`: types naming work epp does another way (it scrapes metrics and
  follows the pool's endpoints itself). They are accepted, not built, and reported as warnings; the
  ones whose parameters are known (`metrics-data-source`, `core-metrics-extractor`, ...) have them
  decoded strictly, and a value that would make GIE behave differently from epp (another metrics
  path, another engine's metric names) is a `ConfigError`.
- `REFUSED`: types of features epp does not have (admitters, the
  latency-predictor sidecar, CEL reporters): a `ConfigError` saying what is missing and why.
- (llm-d's token producers and parsers have modules of their own: `token_producer`,
  `request_handler`.)

The inline sections are decoded as strictly as plugin parameters: `saturationDetector` (a
`pluginRef`, or GIE v1.0-1.3's inline thresholds), `featureGates` (GIE's and llm-d's gate names)
and `dataLayer`. `flowControl` and the flow-control plugin types (`FLOW_CONTROL`) are
passed on undecoded to `epp.flowcontrol.config`, which decodes them as strictly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

import msgspec

from epp.scheduling import registry

# GIE/llm-d plugin types epp accepts but does not build, by kind; and why, by kind.
GIE_ONLY = {
    "inflight-load-producer": "data producer",
}
# Flow-control plugin types: handed to epp.flowcontrol.config, which builds them (this package
# sits below it, so it knows only their names; a test keeps the two lists equal).
FLOW_CONTROL = frozenset(
    {
        "global-strict-fairness-policy",
        "round-robin-fairness-policy",
        "fair-share-fairness-policy",
        "program-aware-fairness",
        "fcfs-ordering-policy",
        "edf-ordering-policy",
        "slo-deadline-ordering-policy",
        "static-usage-limit-policy",
        "soft-reflective-ceiling-policy",
        "priority-holdback-policy",
        "eviction-sheddable-filter",
        "sheddable-eviction-filter",
        "eviction-priority-then-time-ordering",
        "priority-then-time-eviction-order-policy",
    }
)
WHY = {
    "data producer": "epp's scorers gather their own inputs",
}
_PREDICTOR = (
    "GIE's latency predictor (a trained-model sidecar) is not supported; epp's in-process "
    "equivalent is predicted-ttft-scorer"
)
_MULTICLUSTER = (
    "llm-d's multi-cluster routing (other clusters' pools as endpoints) is not built: an epp serves "
    "one pool; run one epp per cluster"
)
_MM_HASHES = (
    "its items are the multimodal content hashes vLLM's /render returns through llm-d's "
    "token-producer, which epp's token producer does not pass on"
)
REFUSED = {
    "latency-slo-admitter": _PREDICTOR,
    "request-attribute-reporter": "epp has no CEL request-attribute reporter (Envoy dynamic metadata)",
    "predicted-latency-scorer": _PREDICTOR,
    "predicted-latency-producer": _PREDICTOR,
    "latency-scorer": _PREDICTOR,
    "slo-headroom-tier-filter": _PREDICTOR,
    "prefix-cache-affinity-filter": _PREDICTOR,
    "mm-embeddings-cache-producer": _MM_HASHES,
    "mm-embeddings-cache-scorer": "it scores mm-embeddings-cache-producer's matches; " + _MM_HASHES,
    "p2p-source-producer": (
        "llm-d's P2P KV pull (x-kv-cache-source-host-port for vLLM's OffloadingConnector peers) is not "
        "built: vLLM 0.32 runs the OffloadingConnector on CUDA and XPU only, so no pod epp is tested "
        "against could serve a pull"
    ),
    "disaggregatedset-rollout-screener": (
        "it pairs prefill and decode pods by llm-d's DisaggregatedSet revision labels during a "
        "rollout; epp's disaggregation has no screener stage"
    ),
    "multicluster-approx-prefix-cache-producer": _MULTICLUSTER,
    "multicluster-file-discovery": _MULTICLUSTER,
    "multicluster-kv-cache-utilization-scorer": _MULTICLUSTER,
    "multicluster-metrics-data-source": _MULTICLUSTER,
    "multicluster-metrics-extractor": _MULTICLUSTER,
    "multicluster-prefix-cache-scorer": _MULTICLUSTER,
    "multicluster-queue-scorer": _MULTICLUSTER,
    "multicluster-session-affinity-filter": _MULTICLUSTER,
}
# Refused types whose parameters are decoded first, so that a published configuration llm-d
# itself refuses for a parameter is refused for that parameter here too.
REFUSED_PARAMS: dict[str, type[msgspec.Struct]] = {}


class _MMProducerParams(msgspec.Struct, forbid_unknown_fields=True):
    cacheSizeInMBPerServer: int = 0


REFUSED_PARAMS["mm-embeddings-cache-producer"] = _MMProducerParams

# Parameters llm-d's own published configurations give where llm-d's decoder silently drops them
# (so llm-d runs on its defaults, not on what they say): (plugin type, dotted parameter) -> advice.
STALE = {
    ("precise-prefix-cache-scorer", "indexerConfig.tokenProcessorConfig"): (
        "llm-d ignores it there too (its decoder drops unknown fields, so its block size stays 16); "
        "give it as parameters.tokenProcessorConfig"
    ),
    ("precise-prefix-cache-scorer", "indexerConfig.kvBlockIndexConfig.maxPrefixBlocksToMatch"): (
        "llm-d ignores it there too (not a field of kvBlockIndexConfig); epp's parameter is "
        "maxPrefixBlocksToMatch"
    ),
}

# Feature gates: name -> what epp does about it (each is accepted with this note; None: honoured).
FEATURE_GATES: dict[str, str | None] = {
    "dataLayer": "epp's data layer (scraping, /v1/models) is always on",
    "enableLegacyMetrics": "epp always exports its metrics",
    "flowControl": None,  # epp.flowcontrol
    # llm-d's (default true): non-leader replicas keep their datastore populated. epp's replicas
    # always list the pool, leading or not; `=false` (empty until leading) has no effect.
    "haPopulateNonLeaderDatastore": "epp's replicas always keep the pool listed, leading or not",
    "prepareDataPlugins": "epp's scorers gather their own inputs",
}

_GO_BOOLS = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}


def feature_gates(
    entries: Sequence[str], error_at: Callable[[tuple[str | int, ...], str], Exception]
) -> tuple[bool, list[str]]:
    """(flow control on, notes for the log) of `featureGates`: llm-d's `name` or `name=value`,
    the value read as Go's ParseBool reads it lower-cased and trimmed; an unknown gate or value
    raises `error_at(path, message)`."""
    flow = False
    notes: list[str] = []
    for i, entry in enumerate(entries):
        gate, *value = entry.split("=")
        if gate not in FEATURE_GATES:
            raise error_at(
                ("featureGates", i), f"unknown feature gate {gate!r}; known gates: {', '.join(FEATURE_GATES)}"
            )
        raw = value[0].strip().lower() if value else "true"
        if raw not in _GO_BOOLS:
            raise error_at(
                ("featureGates", i), f"{value[0]!r} is not a valid value for the feature gate {gate}"
            )
        on = _GO_BOOLS[raw]
        if gate == "flowControl":
            flow = on
        elif gate == "haPopulateNonLeaderDatastore" and on:
            pass  # llm-d's default, and what epp does: every replica keeps the pool listed
        elif FEATURE_GATES[gate] is not None:
            notes.append(f"featureGates {entry!r} has no effect: {FEATURE_GATES[gate]}")
    return flow, notes


# ---- parameters of accepted plugins -----------------------------------------------------------------


class _NoParams(msgspec.Struct, forbid_unknown_fields=True):
    pass


class _InflightLoadParams(msgspec.Struct, forbid_unknown_fields=True):
    addEstimatedOutputTokens: bool = False
    outputRatio: Annotated[float, msgspec.Meta(ge=0)] = 1.5
    maxEstimatedOutputTokens: Annotated[int, msgspec.Meta(ge=0)] | None = None


_PARAMS: dict[str, type[msgspec.Struct]] = {
    "inflight-load-producer": _InflightLoadParams,
}


def check_gie_only(name: str, type_name: str, parameters: dict[str, Any] | None) -> None:
    """Decode an accepted plugin's parameters strictly; raise ConfigError for an unknown or
    mistyped one, or a value epp would not honour."""
    schema = _PARAMS.get(type_name)
    if schema is None:
        return
    label = f"plugin {name!r} (type {type_name!r})"
    try:
        params = msgspec.convert(parameters or {}, schema)
    except msgspec.ValidationError as err:
        raise registry.ConfigError(f"{label}: invalid parameters: {err}") from None
    if isinstance(params, _InflightLoadParams) and params.addEstimatedOutputTokens:
        raise registry.ConfigError(
            f"{label}: parameter addEstimatedOutputTokens: epp books each request's prompt tokens "
            "only (its own in-flight accounting, read by token-load-scorer and concurrency-detector); "
            "drop it or use epp's inflight-load-scorer"
        )


# ---- inline sections -----------------------------------------------------------------------------


class Ref(msgspec.Struct, forbid_unknown_fields=True):
    pluginRef: str = ""


class SaturationDetectorSection(msgspec.Struct, forbid_unknown_fields=True):
    """`pluginRef` (GIE v1.4+), or GIE v1.0-1.3's inline utilization-detector thresholds."""

    pluginRef: str = ""
    queueDepthThreshold: Annotated[int, msgspec.Meta(gt=0)] | None = None
    kvCacheUtilThreshold: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    metricsStalenessThreshold: str | None = None

    def inline(self) -> dict[str, Any]:
        """The inline thresholds given, as utilization-detector parameters."""
        return {
            key: getattr(self, key)
            for key in ("queueDepthThreshold", "kvCacheUtilThreshold", "metricsStalenessThreshold")
            if getattr(self, key) is not None
        }
