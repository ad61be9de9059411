"""epp's Prometheus metrics, served on --metrics-port (9090) at /metrics.

One registry per process (`REGISTRY`), not prometheus_client's global one, so tests can read values
without interference and the exposition lists only what epp defines. Names follow GIE's EPP where
it has an equivalent (`inference_extension_*`, `inference_objective_*`, `inference_pool_*`), so
existing dashboards keep working; epp-specific series use the `epp_` prefix.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

# Sub-millisecond resolution: the whole decision is budgeted well under 1 ms.
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
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

requests_total = Counter(
    "inference_objective_request_total",
    "Requests seen by epp, by model and HTTP status epp or the model server answered.",
    ["model_name", "target_model_name", "status"],
    registry=REGISTRY,
)
request_errors_total = Counter(
    "inference_objective_request_error_total",
    "Requests epp answered itself with an error, by reason code.",
    ["model_name", "error_code"],
    registry=REGISTRY,
)
request_duration = Histogram(
    "inference_objective_request_duration_seconds",
    "From the routing decision to the end of the response stream.",
    ["model_name"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
request_ttft = Histogram(
    "inference_objective_request_ttft_seconds",
    "From the routing decision to the first response body byte (time to first token as epp sees it).",
    ["model_name"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
input_tokens = Counter(
    "inference_objective_input_tokens_total",
    "Prompt tokens reported by model servers in usage.",
    ["model_name"],
    registry=REGISTRY,
)
output_tokens = Counter(
    "inference_objective_output_tokens_total",
    "Completion tokens reported by model servers in usage.",
    ["model_name"],
    registry=REGISTRY,
)
cached_tokens = Counter(
    "inference_objective_prompt_cached_tokens_total",
    "Prompt tokens served from the model server's prefix cache (usage.prompt_tokens_details.cached_tokens).",
    ["model_name"],
    registry=REGISTRY,
)
scheduler_duration = Histogram(
    "inference_extension_scheduler_e2e_duration_seconds",
    "Time to run all scheduling profiles for one request.",
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
plugin_duration = Histogram(
    "inference_extension_plugin_duration_seconds",
    "Time spent in one plugin call (sampled: one scheduling cycle in 8 is timed).",
    ["extension_point", "plugin_type", "plugin_name"],
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
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
ready_endpoints = Gauge(
    "inference_pool_ready_pods",
    "Routable endpoints in the pool.",
    ["name"],
    registry=REGISTRY,
)
extproc_streams = Gauge(
    "epp_extproc_active_streams",
    "ext-proc streams currently open from the proxy.",
    registry=REGISTRY,
)
extproc_stream_errors = Counter(
    "epp_extproc_stream_errors_total",
    "ext-proc streams that ended abnormally, by kind (cancelled, protocol, internal).",
    ["kind"],
    registry=REGISTRY,
)
