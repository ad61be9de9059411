"""epp's Prometheus metrics, served on --metrics-port (9090) at /metrics.

One registry per process (`REGISTRY`), not prometheus_client's global one, so tests can read values
without interference and the exposition lists only what epp defines, plus the standard
`process_*` series (CPU seconds, resident memory, open fds: what a capacity plan for epp itself
needs). Where GIE's EPP has a series (`inference_objective_*`, `inference_pool_*`,
`inference_extension_*`), epp's has GIE's name, type, label names and buckets (GIE v1.5.0's
metrics.go; tests/observability compares them), so GIE's dashboards and alert rules work
unchanged; epp-specific series use the `epp_` prefix. docs/metrics.md lists both, and the GIE
series epp does not export, with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epp import __version__

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)

GIE_RELEASE = "v1.5.0"
"""The GIE EPP release whose series (names, types, labels, buckets) the GIE-named ones match."""

# --- Buckets: GIE's for GIE's series (a dashboard's quantiles then read the same bounds) ---------

LATENCY_BUCKETS = (
    *(0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0),
    *(8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0),
    *(900.0, 1200.0, 1800.0, 2700.0, 3600.0),
)
"""5 ms to an hour: long generations stay inside the buckets."""
TPOT_BUCKETS = (
    *(0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5),
    *(0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 12.0, 18.0, 24.0, 30.0, 36.0, 48.0, 60.0, 90.0),
    *(120.0, 180.0, 270.0, 360.0),
)
NTPOT_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
SCHEDULING_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
REQUEST_SIZE_BUCKETS = tuple(float(2**n) for n in range(6, 31))  # 64 B .. 1 GiB
# GIE's lists have 32778 where the doubling gives 32768; kept, so the bounds are GIE's exactly.
RESPONSE_SIZE_BUCKETS = (1.0, *(float(2**n) for n in range(3, 15)), 32778.0, 65536.0)
INPUT_TOKEN_BUCKETS = (
    1.0,
    *(float(2**n) for n in range(3, 15)),
    32778.0,
    *(float(2**n) for n in range(16, 21)),
)
OUTPUT_TOKEN_BUCKETS = (1.0, *(float(2**n) for n in range(3, 14)))

# Sub-millisecond resolution for epp's own decision timing: it is budgeted well under 1 ms.
_FAST_BUCKETS = (
    0.00005,
    0.0001,
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)

_MODEL = ["model_name", "target_model_name"]

# --- GIE's series: inference_objective_* ---------------------------------------------------------

requests_total = Counter(
    "inference_objective_request_total",
    "Requests routed by epp, by model as the client named it, the model the server was asked for, "
    "and the priority of the request's InferenceObjective (0 when none). Counted at routing.",
    ["model_name", "target_model_name", "priority"],
    registry=REGISTRY,
)
request_errors_total = Counter(
    "inference_objective_request_error_total",
    "Requests answered with an error: by epp (error_code BadRequest, ResourceExhausted, "
    "ServiceUnavailable, Internal, ... or the HTTP status where GIE has no name) or by the model "
    "server (ModelServerError, any non-2xx status).",
    [*_MODEL, "error_code"],
    registry=REGISTRY,
)
request_duration = Histogram(
    "inference_objective_request_duration_seconds",
    "From the routing decision to the end of a complete response stream.",
    _MODEL,
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
request_ttft = Histogram(
    "inference_objective_request_ttft_seconds",
    "From the routing decision to the first response body byte (time to first token as epp sees it).",
    _MODEL,
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
request_tpot = Histogram(
    "inference_objective_request_tpot_seconds",
    "Mean time per output token after the first, of streamed responses with usage: (end - first "
    "chunk) / (completion_tokens - 1).",
    _MODEL,
    buckets=TPOT_BUCKETS,
    registry=REGISTRY,
)
ntpot = Histogram(
    "inference_objective_normalized_time_per_output_token_seconds",
    "Request duration divided by the completion tokens, of complete responses with usage.",
    _MODEL,
    buckets=NTPOT_BUCKETS,
    registry=REGISTRY,
)
request_sizes = Histogram(
    "inference_objective_request_sizes",
    "Request body size in bytes, as received from the client.",
    _MODEL,
    buckets=REQUEST_SIZE_BUCKETS,
    registry=REGISTRY,
)
response_sizes = Histogram(
    "inference_objective_response_sizes",
    "Response body size in bytes, of complete responses.",
    _MODEL,
    buckets=RESPONSE_SIZE_BUCKETS,
    registry=REGISTRY,
)
input_tokens = Histogram(
    "inference_objective_input_tokens",
    "Prompt tokens per request, as the model server reported them in usage.",
    _MODEL,
    buckets=INPUT_TOKEN_BUCKETS,
    registry=REGISTRY,
)
output_tokens = Histogram(
    "inference_objective_output_tokens",
    "Completion tokens per request, as the model server reported them in usage.",
    _MODEL,
    buckets=OUTPUT_TOKEN_BUCKETS,
    registry=REGISTRY,
)
cached_tokens = Histogram(
    "inference_objective_prompt_cached_tokens",
    "Prompt tokens per request served from the model server's prefix cache "
    "(usage.prompt_tokens_details.cached_tokens).",
    _MODEL,
    buckets=INPUT_TOKEN_BUCKETS,
    registry=REGISTRY,
)
running_requests = Gauge(
    "inference_objective_running_requests",
    "Requests routed whose response stream has not ended, by model as the client named it.",
    ["model_name"],
    registry=REGISTRY,
)

# --- GIE's series: inference_pool_* (the averages: PoolCollector, below) -------------------------

ready_endpoints = Gauge(
    "inference_pool_ready_pods",
    "Routable endpoints in the pool.",
    ["name"],
    registry=REGISTRY,
)

# --- GIE's series: inference_extension_* ---------------------------------------------------------

scheduler_duration = Histogram(
    "inference_extension_scheduler_e2e_duration_seconds",
    "Time to run all scheduling profiles for one request.",
    buckets=SCHEDULING_BUCKETS,
    registry=REGISTRY,
)
scheduler_attempts = Counter(
    "inference_extension_scheduler_attempts_total",
    "Scheduling attempts by outcome (success, failure) and, on success, the primary endpoint's pod "
    "and port (namespace is empty: endpoints are known by pod name).",
    ["status", "target_model_name", "pod_name", "namespace", "port"],
    registry=REGISTRY,
)
plugin_duration = Histogram(
    "inference_extension_plugin_duration_seconds",
    "Time spent in one plugin call (sampled: one scheduling cycle in 8 is timed).",
    ["extension_point", "plugin_type", "plugin_name"],
    buckets=SCHEDULING_BUCKETS,
    registry=REGISTRY,
)
build_info = Gauge(
    "inference_extension_info",
    "1, labelled with the build: commit (unknown for a build without one) and build_ref (epp's version).",
    ["commit", "build_ref"],
    registry=REGISTRY,
)
build_info.labels(commit="unknown", build_ref=f"epp-{__version__}").set(1)

# --- epp's own -----------------------------------------------------------------------------------

decision_duration = Histogram(
    "epp_decision_duration_seconds",
    "From the end of the request body to the routing answer: parse, schedule, book.",
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
picks_total = Counter(
    "epp_endpoint_picks_total",
    "Routing decisions per primary endpoint.",
    ["endpoint"],
    registry=REGISTRY,
)
inflight_requests = Gauge(
    "epp_endpoint_inflight_requests",
    "Requests routed by epp to the endpoint whose stream has not ended.",
    ["endpoint"],
    registry=REGISTRY,
)
inflight_tokens = Gauge(
    "epp_endpoint_inflight_prompt_tokens",
    "Prompt tokens (estimated until usage arrives) of requests in flight on the endpoint.",
    ["endpoint"],
    registry=REGISTRY,
)
scrape_errors_total = Counter(
    "epp_metrics_scrape_errors_total",
    "Failed scrapes of a model server's /metrics.",
    ["endpoint"],
    registry=REGISTRY,
)
endpoint_excluded = Gauge(
    "epp_endpoint_excluded",
    "1 while the endpoint is excluded from routing after consecutive scrape failures.",
    ["endpoint"],
    registry=REGISTRY,
)

routing_degraded = Gauge(
    "epp_routing_degraded_mode",
    "1 while every endpoint is excluded for failing or stale metrics and epp routes to all of them "
    "on what it still knows (last metrics, in-flight load, KV index) instead of refusing.",
    registry=REGISTRY,
)

routing_degraded_total = Counter(
    "epp_routing_degraded_total",
    "Requests routed in degraded mode: every candidate endpoint was excluded for failing or stale "
    "metrics, so epp picked among them on what it still knows instead of answering 503.",
    registry=REGISTRY,
)

scrapes_inconclusive_total = Counter(
    "epp_metrics_scrapes_inconclusive_total",
    "Scrapes that timed out only because epp's own event loop ran late (the timeout fired long "
    "after it was due): not counted against the endpoint.",
    registry=REGISTRY,
)

# Series labelled by endpoint name, dropped when the endpoint goes (`forget_endpoint`).
_BY_ENDPOINT: tuple[Any, ...] = (
    picks_total,
    inflight_requests,
    inflight_tokens,
    scrape_errors_total,
    endpoint_excluded,
)
extproc_streams = Gauge(
    "epp_extproc_active_streams",
    "ext-proc streams currently open from the proxy.",
    registry=REGISTRY,
)
event_loop_lag = Histogram(
    "epp_event_loop_lag_seconds",
    "How late the event loop woke a sleeper (sampled every 0.25 s): > 0.1 s means epp is short of CPU.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
response_bodies_skipped = Counter(
    "epp_response_bodies_skipped_total",
    "Off-sample responses whose body epp stopped at the response headers (mode override), by "
    "result: skipped (Envoy honoured it), ignored (the body came anyway: the gateway does not "
    "allow mode overrides, and epp read it as usual).",
    ["result"],
    registry=REGISTRY,
)
extproc_stream_errors = Counter(
    "epp_extproc_stream_errors_total",
    "ext-proc streams that ended abnormally, by kind: cancelled (cut before epp answered or mid-response), "
    "protocol, internal.",
    ["kind"],
    registry=REGISTRY,
)

# --- Label values --------------------------------------------------------------------------------

_GIE_ERROR_CODES = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    429: "ResourceExhausted",
    500: "Internal",
    503: "ServiceUnavailable",
}
MODEL_SERVER_ERROR = "ModelServerError"
"""GIE's error_code for a response the model server answered with a non-2xx status."""


def error_code(status: int) -> str:
    """GIE's error_code for an answer epp gave with HTTP `status` (the number where GIE has none)."""
    return _GIE_ERROR_CODES.get(status) or str(status)


MAX_LABEL_VALUES = 256
"""Distinct client-chosen values (model names) kept per label; later ones are counted as "other"."""
MAX_LABEL_PAIRS = 64
"""Distinct (model_name, target_model_name) pairs kept: each pair is a dozen histograms, ~10 KB of
/metrics page and ~4 ms of rendering per scrape, so 256 x 256 independent names would be gigabytes.
Later pairs are counted as ("other", "other")."""
MAX_LABEL_CHARS = 128
"""A longer client-chosen value is counted as "other" (it would be stored in every series)."""
OTHER = "other"


class LabelCap:
    """Bounds a label whose values clients choose (model names): the first `limit` distinct values
    are kept, every later one (and any longer than MAX_LABEL_CHARS) becomes "other", so junk names
    cannot multiply the series."""

    __slots__ = ("_limit", "_seen")

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if not value:
            return "-"
        if len(self._seen) >= self._limit or len(value) > MAX_LABEL_CHARS:
            return OTHER
        self._seen.add(value)
        return value


class ModelLabels:
    """(model_name, target_model_name) label values for a request's series: each name capped
    (`LabelCap`) and the pairs capped too (`MAX_LABEL_PAIRS`), since the series are per pair."""

    __slots__ = ("_limit", "_model", "_pairs", "_target")

    def __init__(self, limit: int = MAX_LABEL_PAIRS) -> None:
        self._model = LabelCap()
        self._target = LabelCap()
        self._pairs: set[tuple[str, str]] = set()
        self._limit = limit

    def __call__(self, model: str, target: str) -> tuple[str, str]:
        pair = (self._model(model), self._target(target))
        if pair in self._pairs:
            return pair
        if len(self._pairs) >= self._limit:
            return (OTHER, OTHER)
        self._pairs.add(pair)
        return pair

    def target(self, target: str) -> str:
        """The target_model_name value alone (series labelled by target only)."""
        return self._target(target)


def forget_endpoint(name: str, pod: str = "") -> None:
    """Drop every series labelled with a removed endpoint: `name` in the `endpoint` label, `pod`
    (or `name` for a static endpoint) in GIE's `pod_name`. Pods come and go with every rollout,
    and their series would otherwise be exported (and kept in memory) forever."""
    for metric, label, value in (
        *((m, "endpoint", name) for m in _BY_ENDPOINT),
        (scheduler_attempts, "pod_name", pod or name),
    ):
        at = metric._labelnames.index(label)
        with metric._lock:
            doomed = [labels for labels in metric._metrics if labels[at] == value]
        for labels in doomed:
            with contextlib.suppress(KeyError):  # removed meanwhile
                metric.remove(*labels)


# --- Pool averages (epp.datastore.scraper) -------------------------------------------------------
# Computed at scrape time from the endpoints' latest scraped metrics, so they are as fresh as the
# scrape loop and need no refresh timer (GIE's --refresh-prometheus-metrics-interval).


class PodLoad(NamedTuple):
    """What one endpoint's model server last reported."""

    name: str  # GIE's model_server_pod: the endpoint's name ("<pod>-rank-<n>", or host:port)
    waiting: int
    running: int
    kv_usage: float  # 0..1
    routable: bool  # counted in the averages (GIE averages its fresh, ready pods)


class PoolSnapshot(NamedTuple):
    name: str  # the InferencePool's name (or "standalone")
    pods: list[PodLoad]


S = TypeVar("S")  # a source's snapshot type


class _SourcesCollector(Collector, Generic[S]):
    """Families built at scrape time from the snapshots of registered sources (one per pool, per
    ingester...); subclasses write `_families`, which must yield every family for an empty list."""

    def __init__(self) -> None:
        self._sources: list[Callable[[], S]] = []

    def add(self, source: Callable[[], S]) -> None:
        self._sources.append(source)

    def discard(self, source: Callable[[], S]) -> None:
        with contextlib.suppress(ValueError):
            self._sources.remove(source)

    def describe(self) -> list[Metric]:
        return list(self._families([]))

    def collect(self) -> list[Metric]:
        return list(self._families([source() for source in self._sources]))

    @staticmethod
    def _families(snaps: list[S]) -> Iterator[Metric]:
        raise NotImplementedError


class PoolCollector(_SourcesCollector[PoolSnapshot]):
    """GIE's `inference_pool_average_{kv_cache_utilization,queue_size,running_requests}{name}` and
    `inference_pool_per_pod_queue_size{name,model_server_pod}`, from registered sources.

    The averages are over routable endpoints and absent while there is none (a stale average of
    gone pods would keep an alert firing); the per-pod queue covers every endpoint, as GIE's does.
    """

    @staticmethod
    def _families(snaps: list[PoolSnapshot]) -> Iterator[Metric]:
        name = ["name"]
        kv = GaugeMetricFamily(
            "inference_pool_average_kv_cache_utilization",
            "Mean KV-cache utilization (0..1) the pool's routable model servers last reported.",
            labels=name,
        )
        queue = GaugeMetricFamily(
            "inference_pool_average_queue_size",
            "Mean number of requests waiting in the queues of the pool's routable model servers.",
            labels=name,
        )
        running = GaugeMetricFamily(
            "inference_pool_average_running_requests",
            "Mean number of requests running on the pool's routable model servers.",
            labels=name,
        )
        per_pod = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size",
            "Requests waiting in each model server's queue, as it last reported.",
            labels=["name", "model_server_pod"],
        )
        for snap in snaps:
            live = [p for p in snap.pods if p.routable]
            if live:
                n = len(live)
                kv.add_metric([snap.name], sum(p.kv_usage for p in live) / n)
                queue.add_metric([snap.name], sum(p.waiting for p in live) / n)
                running.add_metric([snap.name], sum(p.running for p in live) / n)
            for p in snap.pods:
                per_pod.add_metric([snap.name, p.name], p.waiting)
        yield from (kv, queue, running, per_pod)


pool_collector = PoolCollector()
REGISTRY.register(pool_collector)


# --- KV events (epp.kvcache.ingest) ---------------------------------------------------------------
# Computed at scrape time from the ingester's own counters (`KVCollector`), not kept in Counter
# objects: ingestion runs at ~10k batches/s and a Counter costs a lock per increment (a label
# lookup too, unless cached), for values read every few seconds. The numbers `status()` shows are
# then exactly the ones exported, and a pod's series disappear with the pod.


class KVPodCounts(NamedTuple):
    """One pod's KV-event counters since it was configured."""

    batches: int
    blocks_stored: int
    blocks_removed: int
    gaps: int
    resets: int
    replays: Mapping[str, int]  # outcome (ok, partial, failed) -> replays
    errors: Mapping[str, int]  # reason -> messages (events for invalid_event)
    last_event_age: float  # seconds since the last applied batch; inf if none


class KVSnapshot(NamedTuple):
    """What `KVCollector` exposes, from one source (an ingester and its index)."""

    pods: Mapping[str, KVPodCounts]
    unrouted: Mapping[str, int]  # reason -> messages no pod could be named for (label pod="")
    entries: int
    keys: int
    evictions: int


class KVCollector(_SourcesCollector[KVSnapshot]):
    """The `epp_kv_events_*` and `epp_kv_index_*` series, read from registered sources."""

    @staticmethod
    def _families(snaps: list[KVSnapshot]) -> Iterator[Metric]:
        pod = ["pod"]
        batches = CounterMetricFamily(
            "epp_kv_events_batches_total", "KV-event batches applied to the block index.", labels=pod
        )
        blocks = CounterMetricFamily(
            "epp_kv_events_blocks_total",
            "Blocks recorded (kind=stored) or dropped (kind=removed) in the block index by KV events.",
            labels=["pod", "kind"],
        )
        errors = CounterMetricFamily(
            "epp_kv_events_errors_total",
            "KV-event messages rejected, by reason: frames, seq, decode, replay_frames, apply, "
            "unknown_topic, out_of_order (at or below the applied sequence), peer_denied (bind "
            "mode: connections refused), peer_mismatch (bind mode: a topic naming another "
            "sender's pod); invalid_event counts events dropped from decodable batches. pod is "
            "empty when no pod could be named.",
            labels=["pod", "reason"],
        )
        gaps = CounterMetricFamily(
            "epp_kv_events_gaps_total",
            "Sequence gaps in a pod's KV-event stream (messages lost on the way).",
            labels=pod,
        )
        replays = CounterMetricFamily(
            "epp_kv_events_replays_total",
            "Replays asked of a pod, by outcome: ok; partial (the start was gone: pod purged, the rest "
            "applied); failed (timeout or error: pod purged).",
            labels=["pod", "outcome"],
        )
        resets = CounterMetricFamily(
            "epp_kv_events_resets_total",
            "Sequence numbers going back (the publisher restarted): the pod's entries were purged.",
            labels=pod,
        )
        ages = GaugeMetricFamily(
            "epp_kv_events_last_event_age_seconds",
            "Seconds since the pod's last KV-event batch was applied (+Inf if none yet).",
            labels=pod,
        )
        entries = GaugeMetricFamily("epp_kv_index_entries", "Block records (key, pod, tier) in the index.")
        keys = GaugeMetricFamily("epp_kv_index_keys", "Distinct block keys in the index.")
        evictions = CounterMetricFamily(
            "epp_kv_index_evictions", "Block records evicted by the index's max_entries cap."
        )
        for snap in snaps:
            for name, c in snap.pods.items():
                batches.add_metric([name], c.batches)
                blocks.add_metric([name, "stored"], c.blocks_stored)
                blocks.add_metric([name, "removed"], c.blocks_removed)
                gaps.add_metric([name], c.gaps)
                resets.add_metric([name], c.resets)
                ages.add_metric([name], c.last_event_age)
                for outcome, n in c.replays.items():
                    replays.add_metric([name, outcome], n)
                for reason, n in c.errors.items():
                    errors.add_metric([name, reason], n)
            for reason, n in snap.unrouted.items():
                errors.add_metric(["", reason], n)
        if snaps:
            entries.add_metric([], sum(s.entries for s in snaps))
            keys.add_metric([], sum(s.keys for s in snaps))
            evictions.add_metric([], sum(s.evictions for s in snaps))
        yield from (batches, blocks, errors, gaps, replays, resets, ages, entries, keys, evictions)


kv_collector = KVCollector()
REGISTRY.register(kv_collector)


# --- Tokenizers (epp.tokenize) --------------------------------------------------------------------


_PREFIX_COUNTERS = (
    ("hits", "whole texts found cached"),
    ("partial_hits", "texts whose leading part was found cached"),
    ("misses", "texts with nothing cached"),
    ("fallbacks", "reuses abandoned because the seam did not re-encode identically"),
    ("evictions", "cached chunks evicted by the byte budget"),
    ("reused_tokens", "token ids taken from the cache"),
    ("encoded_tokens", "token ids computed by the tokenizer"),
    ("engine_mismatches", "texts fastokens encoded unlike tokenizers (it is then turned off)"),
)
_PREFIX_GAUGES = (("cached_bytes", "bytes held (estimated)"), ("cached_tokens", "token ids held"))


def _counts(name: str, doc: str, label: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    """A counter family with one sample per key of `counts`, in key order."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(counts.items()):
        family.add_metric([key], n)
    return family


class TokenizerCollector(Collector):
    """`epp_tokenizer_missing_total{model}`, `epp_tokenizer_truncated_total{tokenizer}`,
    `epp_tokenizer_engine_info{tokenizer,engine}`, and the prefix-tokenization caches'
    `epp_tokenizer_prefix_cache_*{tokenizer}`, read at scrape time from
    the tokenizer registry's plain counters (they count on the event loop and in worker threads; a
    Counter there would add a lock and a label lookup per request)."""

    def __init__(
        self,
        missing: Callable[[], Mapping[str, int]],
        truncated: Callable[[], Mapping[str, int]],
        prefix_caches: Callable[[], Mapping[str, Any]] = dict,
        engines: Callable[[], Mapping[str, str]] = dict,
        commits_dropped: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._missing = missing
        self._truncated = truncated
        self._prefix_caches = prefix_caches
        self._engines = engines
        self._commits_dropped = commits_dropped

    def describe(self) -> list[Metric]:
        return list(self._families({}, {}, {}, {}, {}))

    def collect(self) -> list[Metric]:
        return list(
            self._families(
                dict(self._missing()),
                dict(self._truncated()),
                dict(self._prefix_caches()),
                dict(self._engines()),
                dict(self._commits_dropped()),
            )
        )

    @staticmethod
    def _families(
        missing: Mapping[str, int],
        truncated: Mapping[str, int],
        caches: Mapping[str, Any],
        engines: Mapping[str, str],
        dropped: Mapping[str, int],
    ) -> Iterator[Metric]:
        yield _counts(
            "epp_tokenizer_missing",
            "Requests that needed token ids for a model with no tokenizer (routed without them).",
            "model",
            missing,
        )
        yield _counts(
            "epp_tokenizer_truncated",
            "Prompts cut to the tokenizer's max_chars before tokenizing (only leading blocks matter).",
            "tokenizer",
            truncated,
        )
        e = GaugeMetricFamily(
            "epp_tokenizer_engine_info",
            "What each tokenizer encodes with: fastokens, or tokenizers (fastokens refused/disagreed/off).",
            labels=["tokenizer", "engine"],
        )
        for name, engine in sorted(engines.items()):
            e.add_metric([name, engine], 1)
        yield e
        yield _counts(
            "epp_tokenizer_prefix_cache_commits_dropped",
            "Texts not cached because too many commit steps were waiting (overload).",
            "tokenizer",
            dropped,
        )
        label = ["tokenizer"]
        prefix = "epp_tokenizer_prefix_cache_"
        for field, text in _PREFIX_COUNTERS:
            c = CounterMetricFamily(prefix + field, f"Prefix cache: {text}.", labels=label)
            for name, cache in sorted(caches.items()):
                c.add_metric([name], getattr(cache, field))
            yield c
        for field, text in _PREFIX_GAUGES:
            g = GaugeMetricFamily(prefix + field, f"Prefix cache: {text}.", labels=label)
            for name, cache in sorted(caches.items()):
                g.add_metric([name], getattr(cache, field))
            yield g
