"""GIE's EPP metric series, transcribed by hand from kubernetes-sigs/gateway-api-inference-extension
at tag v1.5.0 (commit df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849): `pkg/epp/metrics/metrics.go` (the
registered vectors: subsystem + name, kind, label names, buckets) and
`pkg/epp/metrics/collectors/inference_pool.go` (`inference_pool_per_pod_queue_size`).

Kept apart from `epp.observability.metrics` on purpose: the comparison test must fail when either
side changes, so nothing here is derived from epp's code.
"""

from __future__ import annotations

from typing import NamedTuple

GIE_REPO = "kubernetes-sigs/gateway-api-inference-extension"
GIE_TAG = "v1.5.0"
GIE_COMMIT = "df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849"


class Series(NamedTuple):
    name: str  # as exposed (a counter's name includes _total)
    kind: str  # counter, gauge, histogram
    labels: tuple[str, ...]  # in GIE's order
    buckets: tuple[float, ...] = ()  # histogram upper bounds, without +Inf


_MODEL = ("model_name", "target_model_name")

# metrics.go: generalLatencyBuckets, tpotBuckets, predictionLatencyBuckets
_GENERAL = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6,
    8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200,
    1800, 2700, 3600,
)  # fmt: skip
_TPOT = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.6, 0.8, 1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60,
    90, 120, 180, 270, 360,
)  # fmt: skip
_PREDICTION = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_SCHEDULING = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_REQUEST_SIZES = (
    64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
    131072, 262144, 524288, 1048576, 2097152, 4194304, 8388608,
    16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824,
)  # fmt: skip
_RESPONSE_SIZES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
_INPUT_TOKENS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536,
    131072, 262144, 524288, 1048576,
)  # fmt: skip
_OUTPUT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_FLOW_QUEUE = (
    0.0001,
    0.0005,
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

SERIES: tuple[Series, ...] = (
    # --- inference_objective ---
    Series("inference_objective_request_total", "counter", (*_MODEL, "priority")),
    Series("inference_objective_request_error_total", "counter", (*_MODEL, "error_code")),
    Series("inference_objective_inference_request_metric", "gauge", (*_MODEL, "type")),
    Series("inference_objective_request_ttft_seconds", "histogram", _MODEL, _GENERAL),
    Series("inference_objective_request_predicted_ttft_seconds", "histogram", _MODEL, _GENERAL),
    Series("inference_objective_request_ttft_prediction_duration_seconds", "histogram", _MODEL, _PREDICTION),
    Series("inference_objective_request_tpot_seconds", "histogram", _MODEL, _TPOT),
    Series("inference_objective_request_predicted_tpot_seconds", "histogram", _MODEL, _TPOT),
    Series("inference_objective_request_tpot_prediction_duration_seconds", "histogram", _MODEL, _PREDICTION),
    Series("inference_objective_request_slo_violation_total", "counter", (*_MODEL, "type")),
    Series("inference_objective_request_duration_seconds", "histogram", _MODEL, _GENERAL),
    Series("inference_objective_request_sizes", "histogram", _MODEL, _REQUEST_SIZES),
    Series("inference_objective_response_sizes", "histogram", _MODEL, _RESPONSE_SIZES),
    Series("inference_objective_input_tokens", "histogram", _MODEL, _INPUT_TOKENS),
    Series("inference_objective_output_tokens", "histogram", _MODEL, _OUTPUT_TOKENS),
    Series("inference_objective_prompt_cached_tokens", "histogram", _MODEL, _INPUT_TOKENS),
    Series("inference_objective_running_requests", "gauge", ("model_name",)),
    Series("inference_objective_normalized_time_per_output_token_seconds", "histogram", _MODEL, _NTPOT),
    # --- inference_pool ---
    Series("inference_pool_average_kv_cache_utilization", "gauge", ("name",)),
    Series("inference_pool_average_queue_size", "gauge", ("name",)),
    Series("inference_pool_average_running_requests", "gauge", ("name",)),
    Series("inference_pool_ready_pods", "gauge", ("name",)),
    Series("inference_pool_per_pod_queue_size", "gauge", ("name", "model_server_pod")),
    # --- inference_extension: scheduling, plugins, prefix indexer, info ---
    Series("inference_extension_scheduler_e2e_duration_seconds", "histogram", (), _SCHEDULING),
    Series(
        "inference_extension_scheduler_attempts_total",
        "counter",
        ("status", "target_model_name", "pod_name", "namespace", "port"),
    ),
    Series(
        "inference_extension_plugin_duration_seconds",
        "histogram",
        ("extension_point", "plugin_type", "plugin_name"),
        _SCHEDULING,
    ),
    Series("inference_extension_prefix_indexer_size", "gauge", ()),
    Series(
        "inference_extension_prefix_indexer_hit_ratio",
        "histogram",
        (),
        (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    ),
    Series(
        "inference_extension_prefix_indexer_hit_bytes",
        "histogram",
        (),
        (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
    ),
    Series("inference_extension_info", "gauge", ("commit", "build_ref")),
    # --- inference_extension: flow control, model rewrite ---
    Series(
        "inference_extension_flow_control_request_queue_duration_seconds",
        "histogram",
        ("fairness_id", "priority", "outcome", "inference_pool", *_MODEL),
        _FLOW_QUEUE,
    ),
    Series("inference_extension_flow_control_dispatch_cycle_duration_seconds", "histogram", (), _SCHEDULING),
    Series(
        "inference_extension_flow_control_request_enqueue_duration_seconds",
        "histogram",
        ("fairness_id", "priority", "outcome"),
        _SCHEDULING,
    ),
    Series(
        "inference_extension_flow_control_queue_size",
        "gauge",
        ("fairness_id", "priority", "inference_pool", *_MODEL),
    ),
    Series(
        "inference_extension_flow_control_queue_bytes",
        "gauge",
        ("fairness_id", "priority", "inference_pool", *_MODEL),
    ),
    Series("inference_extension_flow_control_pool_saturation", "gauge", ("inference_pool",)),
    Series(
        "inference_extension_model_rewrite_decisions_total",
        "counter",
        ("model_rewrite_name", "model_name", "target_model"),
    ),
)

# Series GIE registers that epp does not export, and why. Everything else in SERIES must be
# exported with GIE's kind, labels and buckets.
_PREDICTED_LATENCY = (
    "recorded only by GIE's predicted-latency plugins (their latency-predictor sidecar); epp's "
    "predicted-ttft-scorer predicts in-process and exports epp_predicted_ttft_*"
)
_FLOW_ENQUEUE = (
    "GIE times the hand-off of a request to its flow-control processor goroutine; epp's flow control "
    "enqueues inline in the request's own task (no hand-off): the time is in epp_decision_duration_seconds"
)
_PREFIX_INDEXER = (
    "recorded by GIE's approximate prefix-cache plugin; epp's prefix scorers report matches "
    "through /debug/score and the KV index through epp_kv_index_*"
)
NOT_EXPORTED: dict[str, str] = {
    "inference_objective_inference_request_metric": _PREDICTED_LATENCY,
    "inference_objective_request_predicted_ttft_seconds": _PREDICTED_LATENCY,
    "inference_objective_request_ttft_prediction_duration_seconds": _PREDICTED_LATENCY,
    "inference_objective_request_predicted_tpot_seconds": _PREDICTED_LATENCY,
    "inference_objective_request_tpot_prediction_duration_seconds": _PREDICTED_LATENCY,
    "inference_objective_request_slo_violation_total": _PREDICTED_LATENCY,
    "inference_extension_prefix_indexer_size": _PREFIX_INDEXER,
    "inference_extension_prefix_indexer_hit_ratio": _PREFIX_INDEXER,
    "inference_extension_prefix_indexer_hit_bytes": _PREFIX_INDEXER,
    "inference_extension_flow_control_request_enqueue_duration_seconds": _FLOW_ENQUEUE,
}

# The EPP series GIE's guide documents (site-src/guides/metrics-and-observability.md, same tag):
# each must be in SERIES (a check on this transcription) and exported unless NOT_EXPORTED says why.
DOCUMENTED = (
    "inference_objective_request_total",
    "inference_objective_request_error_total",
    "inference_objective_request_duration_seconds",
    "inference_objective_normalized_time_per_output_token_seconds",
    "inference_objective_request_sizes",
    "inference_objective_response_sizes",
    "inference_objective_input_tokens",
    "inference_objective_output_tokens",
    "inference_objective_running_requests",
    "inference_pool_average_kv_cache_utilization",
    "inference_pool_average_queue_size",
    "inference_pool_per_pod_queue_size",
    "inference_pool_ready_pods",
    "inference_extension_info",
    "inference_extension_scheduler_attempts_total",
    "inference_extension_flow_control_request_queue_duration_seconds",
    "inference_extension_flow_control_queue_size",
    "inference_extension_flow_control_queue_bytes",
    "inference_extension_flow_control_dispatch_cycle_duration_seconds",
    "inference_extension_flow_control_request_enqueue_duration_seconds",
    "inference_extension_flow_control_pool_saturation",
)
