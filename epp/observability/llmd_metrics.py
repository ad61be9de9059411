"""llm-d Router's canonical `llm_d_epp_*` series (v0.10 `pkg/epp/metrics`), in `metrics.REGISTRY`.

llm-d renamed GIE's `inference_objective_*`, `inference_pool_*` and `inference_extension_*` series
to `llm_d_epp_*` and still emits the old names beside them (deprecated twins): epp does the same,
so both generations of dashboards and alerts read epp. The names, types, label names and
buckets here are llm-d's (tests/observability/llmd_metrics.py holds the table they are checked
against); docs/metrics.md lists them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from prometheus_client import Counter, Gauge
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.observability import metrics
from epp.observability.histogram import Histogram
from epp.observability.metrics import REGISTRY

LLMD = "llm_d_epp_"

# --- ext_proc streams (--enable-grpc-stream-metrics) ----------------------------------------------
# Registered only when the flag is given, as llm-d does (a dashboard tells them apart by absence).

extproc_streams_inflight = Gauge(
    LLMD + "extproc_streams_inflight", "Number of ext_proc gRPC streams currently open.", registry=None
)
extproc_stream_duration = PromHistogram(
    LLMD + "extproc_stream_duration_seconds",
    "Duration an ext_proc gRPC stream stays open, in seconds.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
    registry=None,
)
extproc_streams_total = Counter(
    LLMD + "extproc_streams",
    "Total ext_proc gRPC streams completed, by gRPC status code (Go's names: OK, Canceled, Unknown).",
    ["code"],
    registry=None,
)
_STREAM_METRICS = (extproc_streams_inflight, extproc_stream_duration, extproc_streams_total)
_registered = threading.Lock()
_stream_metrics_on = False


def register_stream_metrics() -> None:
    """Export the ext_proc stream series (idempotent)."""
    global _stream_metrics_on
    with _registered:
        if not _stream_metrics_on:
            for metric in _STREAM_METRICS:
                REGISTRY.register(metric)
            _stream_metrics_on = True


def stream_finished(code: str, seconds: float) -> None:
    extproc_streams_inflight.dec()
    extproc_stream_duration.observe(seconds)
    extproc_streams_total.labels(code).inc()


# --- Per-request series: model_name, target_model_name, fairness_id, priority ---------------------
# Recorded in plain numbers (`epp.observability.histogram`) on one `RequestSeries` per label set,
# looked up once per request, and written at scrape time: the request path pays a dict lookup and
# a bisect per observation, not a lock and a label lookup each.

GENERAL_LATENCY = metrics.LATENCY_BUCKETS
TTFT_BUCKETS = (
    *(0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0),
    *(8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0),
)
TPOT_BUCKETS = (
    *(0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2),
    *(0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 2.0),
)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0)
PROCESSING_BUCKETS = (
    *(0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
RESPONSE_PROCESSING_BUCKETS = (
    *(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
DEFAULT_FAIRNESS_ID = "default-flow"  # llm-d's metadata.DefaultFairnessID


class RequestSeries:
    """One label set's per-request counts (llm-d's `llm_d_epp_request_*` family members)."""

    __slots__ = (
        "cached_tokens",
        "duration",
        "errors",
        "input_tokens",
        "itl",
        "ntpot",
        "output_tokens",
        "request_size",
        "requests",
        "response_size",
        "running",
        "tpot",
        "ttft",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.running = 0
        self.errors: dict[str, int] = {}  # error_code -> requests
        self.duration = Histogram(GENERAL_LATENCY)
        self.request_size = Histogram(metrics.REQUEST_SIZE_BUCKETS)
        self.response_size = Histogram(metrics.RESPONSE_SIZE_BUCKETS)
        self.input_tokens = Histogram(metrics.INPUT_TOKEN_BUCKETS)
        self.output_tokens = Histogram(metrics.OUTPUT_TOKEN_BUCKETS)
        self.cached_tokens = Histogram(metrics.INPUT_TOKEN_BUCKETS)
        self.ntpot = Histogram(metrics.NTPOT_BUCKETS)
        self.ttft: dict[str, Histogram] = {}  # streaming "true"/"false" -> histogram
        self.tpot = Histogram(TPOT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def observe_ttft(self, seconds: float, streaming: bool) -> None:
        key = "true" if streaming else "false"
        hist = self.ttft.get(key)
        if hist is None:
            hist = self.ttft[key] = Histogram(TTFT_BUCKETS)
        hist.observe(seconds)


Key = tuple[str, str, str, str]

# (llm-d's name without the prefix, its help, the `RequestSeries` field)
_HISTOGRAMS = (
    ("request_duration_seconds", "End-to-end request latency distribution in seconds.", "duration"),
    ("request_size_bytes", "Incoming request body size distribution in bytes.", "request_size"),
    ("response_size_bytes", "Outgoing response body size distribution in bytes.", "response_size"),
    ("request_input_tokens", "Input token count distribution per request.", "input_tokens"),
    ("request_output_tokens", "Output token count distribution per request.", "output_tokens"),
    (
        "request_cached_tokens",
        "Distribution of prompt tokens read from cache per request, as reported by the model server in "
        "the response.",
        "cached_tokens",
    ),
    (
        "request_ntpot_seconds",
        "Normalized time per output token in seconds (end-to-end latency divided by output token count).",
        "ntpot",
    ),
    (
        "request_streaming_tpot_seconds",
        "Average time per output token in seconds for streaming requests, computed as (e2e - TTFT) / "
        "(output_tokens - 1).",
        "tpot",
    ),
    (
        "request_streaming_itl_seconds",
        "Inter-token latency in seconds for streaming requests, measured as the time between consecutive "
        "response body chunks.",
        "itl",
    ),
)


class LabelSets:
    """llm-d's per-request label values for a request, capped: fairness IDs at
    `metrics.MAX_LABEL_VALUES` (llm-d's own cap), and the (model, target, fairness, priority) sets
    at `metrics.MAX_LABEL_SETS` and within `metrics.SET_LABEL_BUDGET` (epp's, for the page's size,
    as `metrics.ModelLabels` bounds GIE's pairs): later sets are ("other", "other", "other",
    priority). One per Director."""

    __slots__ = ("_budget", "_limit", "_sets", "fairness")

    def __init__(self, limit: int = metrics.MAX_LABEL_SETS, budget: int = metrics.SET_LABEL_BUDGET) -> None:
        self._limit = limit
        self._budget = budget  # what is left of it
        self._sets: set[Key] = set()
        self.fairness = metrics.LabelCap()

    def __call__(self, model: str, target: str, fairness: str, priority: int) -> Key:
        """The labels of a request whose model names are already capped (`metrics.ModelLabels`)."""
        key = (model, target, self.fairness(fairness or DEFAULT_FAIRNESS_ID), str(priority))
        if key in self._sets:
            return key
        cost = len(key[0]) + len(key[1]) + len(key[2]) + metrics.PAIR_LINE_CHARS
        if len(self._sets) >= self._limit or cost > self._budget:
            return (metrics.OTHER, metrics.OTHER, metrics.OTHER, key[3])
        self._sets.add(key)
        self._budget -= cost
        return key


class RequestTable(Collector):
    """Every label set's `RequestSeries` (keys capped by the caller's `LabelSets`), and their
    families at scrape time. Also the two unlabelled EPP-overhead histograms."""

    def __init__(self) -> None:
        self._series: dict[Key, RequestSeries] = {}
        self.processing = Histogram(PROCESSING_BUCKETS)
        self.response_processing = Histogram(RESPONSE_PROCESSING_BUCKETS)

    def series(self, key: Key) -> RequestSeries:
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = RequestSeries()
        return found

    def describe(self) -> list[Metric]:
        return list(self._families({}))

    def collect(self) -> Iterator[Metric]:
        # A generator, one family per step: epp.observability.exposition gives the event loop
        # back between families (all of them at once was ~17 ms at the caps on a 2-core VM).
        return self._families(self._series)

    def _families(self, table: dict[Key, RequestSeries]) -> Iterator[Metric]:
        labels = ["model_name", "target_model_name", "fairness_id", "priority"]
        rows = list(table.items())  # the label sets as they are now; their values as each family is written
        requests = CounterMetricFamily(LLMD + "request", "Total number of processed requests.", labels=labels)
        running = GaugeMetricFamily(
            LLMD + "request_running", "Current number of active running requests.", labels=labels
        )
        for key, s in rows:
            requests.add_metric(list(key), s.requests)
            running.add_metric(list(key), s.running)
        yield requests
        errors = CounterMetricFamily(
            LLMD + "request_error", "Total number of request errors.", labels=[*labels, "error_code"]
        )
        for key, s in rows:
            for code, n in list(s.errors.items()):
                errors.add_metric([*key, code], n)
        yield errors
        yield running
        ttft = HistogramMetricFamily(
            LLMD + "request_ttft_seconds",
            "Time to first token in seconds, measured from request received to first response byte. "
            "For non-streaming requests, this equals total request duration.",
            labels=[*labels, "streaming"],
        )
        for key, s in rows:
            for streaming, hist in list(s.ttft.items()):
                ttft.add_metric([*key, streaming], hist.buckets(), hist.total)
        yield ttft
        for name, doc, field in _HISTOGRAMS:
            family = HistogramMetricFamily(LLMD + name, doc, labels=labels)
            for key, s in rows:
                observed: Histogram = getattr(s, field)
                if observed.count:
                    family.add_metric(list(key), observed.buckets(), observed.total)
            yield family
        processing = HistogramMetricFamily(
            LLMD + "request_processing_duration_seconds",
            "EPP request processing latency distribution in seconds, from request receipt until the "
            "request body has been handled, including admission control.",
            labels=[],
        )
        processing.add_metric([], self.processing.buckets(), self.processing.total)
        response = HistogramMetricFamily(
            LLMD + "response_processing_duration_seconds",
            "EPP response processing latency distribution in seconds: the sum of per-chunk handler time "
            "for a streamed response, or the interval from response headers to completion for a "
            "non-streaming response.",
            labels=[],
        )
        response.add_metric([], self.response_processing.buckets(), self.response_processing.total)
        yield from (processing, response)


REQUESTS = RequestTable()
REGISTRY.register(REQUESTS)


# --- Twins: one series under two names ----------------------------------------------------------
# Where llm-d's series and GIE's (or llm-d's own deprecated one) carry the same numbers, only the
# name (and a label name) differs, it is recorded once and written twice at scrape time: nothing
# on the request path.


class Twin(NamedTuple):
    source: Collector  # a prometheus_client metric recorded by epp
    name: str  # the other family's name (counters without `_total`, as prometheus_client names them)
    documentation: str
    rename: Mapping[str, str] = {}  # label -> its name in the twin
    keep: tuple[str, ...] | None = None  # labels the twin keeps (the others summed over); None: all


class TwinCollector(Collector):
    def __init__(self) -> None:
        self._twins: list[Twin] = []

    def add(self, *twins: Twin) -> None:
        self._twins.extend(twins)

    def describe(self) -> list[Metric]:
        return [Metric(t.name, t.documentation, _kind(t.source)) for t in self._twins]

    def collect(self) -> Iterator[Metric]:
        for twin in self._twins:
            for family in twin.source.collect():
                yield _twin_of(family, twin)


def _kind(source: Collector) -> str:
    return {Counter: "counter", Gauge: "gauge", PromHistogram: "histogram"}.get(type(source), "untyped")


def _twin_of(family: Metric, twin: Twin) -> Metric:
    out = Metric(twin.name, twin.documentation, family.type, family.unit)
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in family.samples:
        if sample.name.endswith("_created"):
            continue
        name = twin.name + sample.name[len(family.name) :]
        labels = {twin.rename.get(k, k): v for k, v in sample.labels.items()}
        if twin.keep is not None:
            labels = {k: v for k, v in labels.items() if k in twin.keep or k == "le"}
        key = (name, tuple(sorted(labels.items())))
        sums[key] = sums.get(key, 0.0) + sample.value
    for (name, pairs), value in sums.items():
        out.add_sample(name, dict(pairs), value)
    return out


TWINS = TwinCollector()
TWINS.add(
    Twin(
        metrics.scheduler_duration,
        LLMD + "scheduler_e2e_duration_seconds",
        "End-to-end scheduling latency distribution in seconds.",
    ),
    Twin(
        metrics.scheduler_attempts,
        LLMD + "scheduler_attempts",
        "Total number of scheduling attempts.",
        rename={"pod_name": "endpoint_name"},
    ),
    Twin(
        metrics.plugin_duration,
        LLMD + "plugin_duration_seconds",
        "Plugin processing latency distribution in seconds for each extension point, plugin type and "
        "plugin name.",
    ),
    Twin(
        metrics.build_info, LLMD + "info", "General information of the current build of Inference Extension."
    ),
    Twin(
        metrics.datalayer_poll_errors,
        "llm_d_inference_scheduler_datalayer_poll_errors",
        "[Deprecated: Use llm_d_epp_datalayer_poll_errors_total] Data-source poll errors per source type.",
    ),
    Twin(
        metrics.ready_endpoints,
        LLMD + "ready_endpoints",
        "The number of ready endpoints in the inference server pool.",
    ),
)
REGISTRY.register(TWINS)
