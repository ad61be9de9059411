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
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)

from epp import __version__

# No `<name>_created` samples: Go's client (GIE's and llm-d's EPP) writes none, and they were a
# line per counter and histogram child (~5% of the page at the label caps).
disable_created_metrics()  # type: ignore[no-untyped-call]
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
model_rewrite_decisions = Counter(
    "inference_extension_model_rewrite_decisions_total",
    "Requests an InferenceModelRewrite sent to another model, by rewrite, requested and target model.",
    ["model_rewrite_name", "model_name", "target_model"],
    registry=REGISTRY,
)
llmd_model_rewrite_decisions = Counter(  # llm-d v0.10's name for the series above (both exported)
    "llm_d_epp_model_rewrite_decisions_total",
    "Requests an InferenceModelRewrite sent to another model, by rewrite, requested and target model.",
    ["model_rewrite_name", "model_name", "target_model"],
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

datalayer_poll_errors = Counter(
    "llm_d_epp_datalayer_poll_errors",
    "Data-source poll errors per source type (llm-d's series): a failed scrape of a model server's "
    "metrics is one of source_type metrics-data-source.",
    ["source_type"],
    registry=REGISTRY,
)
METRICS_DATA_SOURCE = "metrics-data-source"  # llm-d's source type of model-server scrapes

scrapes_inconclusive_total = Counter(
    "epp_metrics_scrapes_inconclusive_total",
    "Scrapes that timed out only because epp's own event loop ran late (the timeout fired long "
    "after it was due): not counted against the endpoint.",
    registry=REGISTRY,
)

scrape_interval = Gauge(
    "epp_metrics_scrape_interval_seconds",
    "The interval at which endpoints with work are scraped now: --refresh-metrics-interval, or "
    "longer while epp's event loop cannot keep the scrapes' timers.",
    registry=REGISTRY,
)

idle_endpoints = Gauge(
    "epp_metrics_idle_endpoints",
    "Endpoints scraped at --idle-metrics-interval: their last scrape showed nothing running or "
    "waiting and epp has booked nothing on them since.",
    registry=REGISTRY,
)

booked_endpoints = Gauge(
    "epp_metrics_booked_endpoints",
    "Endpoints scraped at --booked-metrics-interval: their last scrape showed nothing waiting and "
    "no more requests running than epp has in flight there.",
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
    "How late the event loop woke a sleeper (sampled every --event-loop-lag-interval, 0.25 s): "
    "> 0.1 s means epp is short of CPU.",
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
gc_pause = Histogram(
    "epp_gc_pause_seconds",
    "How long each collection of Python's cyclic garbage collector held the process, by "
    "generation (0 young, 2 full), once epp serves.",
    ["generation"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
    registry=REGISTRY,
)
large_body_waits = Counter(
    "epp_large_body_waits_total",
    "Request bodies over --body-parser-min-bytes that waited for a lane or for the large-body rate "
    "before epp read on.",
    registry=REGISTRY,
)
large_body_wait_seconds = Counter(
    "epp_large_body_wait_seconds_total",
    "Seconds large request bodies waited, unread, for a lane or the large-body rate.",
    registry=REGISTRY,
)
large_body_lanes_yielded = Counter(
    "epp_large_body_lanes_yielded_total",
    "Large-body lanes given back by a stream whose next body message did not come within a "
    "second (a stalled upload), to be taken again when it does.",
    registry=REGISTRY,
)
body_parsers_saturated = Counter(
    "epp_body_parsers_saturated_total",
    "Requests answered 503 because the body-parser processes had --body-parser-processes x 32 "
    "jobs queued or running.",
    registry=REGISTRY,
)
body_parser_restarts = Counter(
    "epp_body_parser_restarts_total",
    "Body-parser process pools replaced after a worker exited (an OOM kill, a crash).",
    registry=REGISTRY,
)
prewarm_requests = Counter(
    "epp_prewarm_requests_total",
    "Prefix pre-warms (a one-token completion of a prompt's first blocks sent to the pod that is "
    "to hold them, in place of moving a request off the pod holding its prefix), by outcome: ok, "
    "failed (an error status, a refused connection, a timeout), skipped (one was already running "
    "there, or too many were).",
    ["outcome"],
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


MAX_LABEL_VALUES = 1000
"""Distinct client-chosen values a label limiter keeps, as llm-d (its `cardinality.go`): model_name and
target_model_name share one limiter (1,000 names between them), fairness_id has its own; later values
are counted as "other". Names of InferenceModelRewrite rules are pinned: always themselves, uncounted."""
MAX_LABEL_PAIRS = 32
"""Distinct (model_name, target_model_name) pairs kept in GIE's per-request series: each pair is a
dozen histograms, ~28 KB of /metrics page and ~4 ms of CPU per scrape (collected a family at a time
on the event loop, written in a thread: epp.observability.exposition), so 1,000 x 1,000
independent names would be gigabytes. Later pairs are ("other", "other"). epp's own
bound on top of llm-d's per-name caps (llm-d has none on pairs). The page budget below binds first
for long names."""
MAX_LABEL_SETS = 32
"""The same for llm-d's per-request series, per (model_name, target_model_name, fairness_id,
priority): later sets are ("other", "other", "other", priority). With both generations written the
page at the caps stays at what GIE's alone took with 64 pairs, ~2 MB (scripts/metrics_page_size.py)."""
PAIR_LABEL_BUDGET = 2_000
SET_LABEL_BUDGET = 2_000
PAIR_LINE_CHARS = 110
"""The page's bound on per-request series: a kept GIE pair costs its two names' length plus
PAIR_LINE_CHARS (the rest of one series line: metric name, label names, bucket, value) from
PAIR_LABEL_BUDGET, a kept llm-d label set its three names' length plus as much from
SET_LABEL_BUDGET, and one that would overdraw its budget is counted as "other". Both generations'
series together stay under 1 MB of /metrics page whatever the names' length: ~15 pairs and sets of
short names, ~5 of 128-character ones (tests/observability/test_bounded_labels.py). (Pairs capped by
count alone let the page grow 1.9 MB with 8-character names and 5.7 MB with 128-character ones.)
Pairs of configured rewrites' names are kept regardless: the configuration bounds them."""
MAX_LABEL_CHARS = 128
"""A longer client-chosen value is counted as "other" (it would be stored in every series)."""
OTHER = "other"


class LabelCap:
    """Bounds a label whose values clients choose (model names, fairness IDs): the first `limit`
    distinct values are kept, every later one (and any longer than MAX_LABEL_CHARS) becomes "other",
    so junk names cannot multiply the series. A pinned value is always itself and uses no slot."""

    __slots__ = ("_limit", "_pinned", "_seen")

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self._limit = limit
        self._seen: set[str] = set()
        self._pinned: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen or value in self._pinned:
            return value
        if not value:
            return "-"
        if len(self._seen) >= self._limit or len(value) > MAX_LABEL_CHARS:
            return OTHER
        self._seen.add(value)
        return value

    def pin(self, value: str) -> None:
        """Keep `value` whatever the count (a configured name), as llm-d's PreAdmitModelLabels."""
        if value and len(value) <= MAX_LABEL_CHARS:
            self._pinned.add(value)

    def pinned(self, value: str) -> bool:
        return value in self._pinned


class ModelLabels:
    """(model_name, target_model_name) label values for a request's series: both names through one
    `LabelCap` (llm-d's shared limiter), and the pairs capped too (`MAX_LABEL_PAIRS`), since the
    series are per pair."""

    __slots__ = ("_budget", "_limit", "_names", "_pairs")

    def __init__(self, limit: int = MAX_LABEL_PAIRS, budget: int = PAIR_LABEL_BUDGET) -> None:
        self._names = LabelCap()
        self._pairs: set[tuple[str, str]] = set()
        self._limit = limit
        self._budget = budget  # what is left of PAIR_LABEL_BUDGET

    def __call__(self, model: str, target: str) -> tuple[str, str]:
        names = self._names
        pair = (names(model), names(target))
        if pair in self._pairs:
            return pair
        cost = len(pair[0]) + len(pair[1]) + PAIR_LINE_CHARS
        pinned = names.pinned(pair[0]) and names.pinned(pair[1])
        if not pinned and (len(self._pairs) >= self._limit or cost > self._budget):
            return (OTHER, OTHER)
        self._pairs.add(pair)
        self._budget -= cost
        return pair

    def name(self, value: str) -> str:
        """A model name alone, capped (series labelled by one model name)."""
        return self._names(value)

    def pin(self, *names: str) -> None:
        for value in names:
            self._names.pin(value)


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
