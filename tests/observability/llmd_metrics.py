"""llm-d Router's EPP metric series, transcribed by hand from llm-d/llm-d-router at commit
ebab687927f5331c1b39defcb579a07951bce56c (v0.10.0 + 62, 2026-08-22): `pkg/epp/metrics/
llm_d_router_metrics.go`, `metrics.go` and `grpc_stream_metrics.go` (canonical `llm_d_epp_*` and
the deprecated twins it still registers), `pkg/kvcache/metrics/collector.go` (the KV index and
its event subscribers), `pkg/epp/framework/plugins/scheduling/profilehandler/disagg/metrics.go`.

Kept apart from `epp.observability` on purpose: the comparison test must fail when either side
changes, so nothing here is derived from epp's code. GIE's own series (which llm-d keeps as the
deprecated twins) are in `gie_metrics.py`; flow control's in tests/flowcontrol.
"""

from __future__ import annotations

from tests.observability.gie_metrics import Series

LLMD_REPO = "llm-d/llm-d-router"
LLMD_COMMIT = "ebab687927f5331c1b39defcb579a07951bce56c"

_REQUEST = ("model_name", "target_model_name", "fairness_id", "priority")
_GENERAL = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6,
    8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200,
    1800, 2700, 3600,
)  # fmt: skip
_REQUEST_SIZES = (
    64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
    131072, 262144, 524288, 1048576, 2097152, 4194304, 8388608,
    16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824,
)  # fmt: skip
_RESPONSE_SIZES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
_TOKENS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536,
    131072, 262144, 524288, 1048576,
)  # fmt: skip
_OUTPUT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_TTFT = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6,
    8, 10, 15, 20, 30, 45, 60, 120,
)  # fmt: skip
_TPOT = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.6, 0.8, 1, 2,
)  # fmt: skip
_ITL = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2)
_SCHEDULING = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_REQUEST_PROCESSING = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
)  # fmt: skip
_RESPONSE_PROCESSING = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
)  # fmt: skip
_STREAM = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600)
_DEF_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)  # Go's prometheus.DefBuckets
_POOL = ("name",)
_DISAGG = ("plugin_name", "plugin_type", "model_name", "decision_type")

SERIES: tuple[Series, ...] = (
    # llm_d_router_metrics.go: per request
    Series("llm_d_epp_request_total", "counter", _REQUEST),
    Series("llm_d_epp_request_error_total", "counter", (*_REQUEST, "error_code")),
    Series("llm_d_epp_request_duration_seconds", "histogram", _REQUEST, _GENERAL),
    Series("llm_d_epp_request_size_bytes", "histogram", _REQUEST, _REQUEST_SIZES),
    Series("llm_d_epp_response_size_bytes", "histogram", _REQUEST, _RESPONSE_SIZES),
    Series("llm_d_epp_request_input_tokens", "histogram", _REQUEST, _TOKENS),
    Series("llm_d_epp_request_output_tokens", "histogram", _REQUEST, _OUTPUT_TOKENS),
    Series("llm_d_epp_request_cached_tokens", "histogram", _REQUEST, _TOKENS),
    Series("llm_d_epp_request_running", "gauge", _REQUEST),
    Series("llm_d_epp_request_ntpot_seconds", "histogram", _REQUEST, _NTPOT),
    Series("llm_d_epp_request_ttft_seconds", "histogram", (*_REQUEST, "streaming"), _TTFT),
    Series("llm_d_epp_request_streaming_tpot_seconds", "histogram", _REQUEST, _TPOT),
    Series("llm_d_epp_request_streaming_itl_seconds", "histogram", _REQUEST, _ITL),
    # the pool
    Series("llm_d_epp_average_kv_cache_utilization", "gauge", _POOL),
    Series("llm_d_epp_average_queue_size", "gauge", _POOL),
    Series("llm_d_epp_average_running_requests", "gauge", _POOL),
    Series("llm_d_epp_std_dev_kv_cache_utilization", "gauge", _POOL),
    Series("llm_d_epp_std_dev_queue_size", "gauge", _POOL),
    Series("llm_d_epp_std_dev_running_requests", "gauge", _POOL),
    Series("llm_d_epp_ready_endpoints", "gauge", _POOL),
    Series("llm_d_epp_per_endpoint_queue_size", "gauge", ("name", "model_server_endpoint")),
    # scheduling, plugins, overhead, build, data layer, rewrites
    Series("llm_d_epp_scheduler_e2e_duration_seconds", "histogram", (), _SCHEDULING),
    Series(
        "llm_d_epp_scheduler_attempts_total",
        "counter",
        ("status", "target_model_name", "endpoint_name", "namespace", "port"),
    ),
    Series(
        "llm_d_epp_plugin_duration_seconds",
        "histogram",
        ("extension_point", "plugin_type", "plugin_name"),
        _SCHEDULING,
    ),
    Series(
        "llm_d_epp_plugin_data_scope_violations_total",
        "counter",
        ("extension_point", "plugin_type", "plugin_name", "access"),
    ),
    Series("llm_d_epp_request_processing_duration_seconds", "histogram", (), _REQUEST_PROCESSING),
    Series("llm_d_epp_response_processing_duration_seconds", "histogram", (), _RESPONSE_PROCESSING),
    Series("llm_d_epp_info", "gauge", ("commit", "build_ref")),
    Series(
        "llm_d_epp_model_rewrite_decisions_total",
        "counter",
        ("model_rewrite_name", "model_name", "target_model"),
    ),
    Series("llm_d_epp_datalayer_poll_errors_total", "counter", ("source_type",)),
    Series("llm_d_epp_datalayer_extract_errors_total", "counter", ("source_type", "extractor_type")),
    Series("llm_d_inference_scheduler_datalayer_poll_errors_total", "counter", ("source_type",)),
    Series(
        "llm_d_inference_scheduler_datalayer_extract_errors_total",
        "counter",
        ("source_type", "extractor_type"),
    ),
    # disagg/metrics.go
    Series("llm_d_epp_disagg_decision_total", "counter", _DISAGG),
    Series("llm_d_epp_pd_decision_total", "counter", _DISAGG),
    Series("llm_d_inference_scheduler_disagg_decision_total", "counter", ("model_name", "decision_type")),
    Series("llm_d_inference_scheduler_pd_decision_total", "counter", ("model_name", "decision_type")),
    # grpc_stream_metrics.go (--enable-grpc-stream-metrics)
    Series("llm_d_epp_extproc_streams_inflight", "gauge", ()),
    Series("llm_d_epp_extproc_stream_duration_seconds", "histogram", (), _STREAM),
    Series("llm_d_epp_extproc_streams_total", "counter", ("code",)),
    # pkg/kvcache/metrics/collector.go: the index and its events, and their kvcache_* twins
    *(
        Series(f"{prefix}{name}_total", "counter", ())
        for prefix in ("llm_d_epp_kv_cache_", "kvcache_")
        for name in (
            "index_admissions",
            "index_evictions",
            "index_lookup_requests",
            "index_max_pod_hit_count",
            "index_lookup_hits",
        )
    ),
    Series("llm_d_epp_kv_cache_index_lookup_latency_seconds", "histogram", (), _DEF_BUCKETS),
    Series("kvcache_index_lookup_latency_seconds", "histogram", (), _DEF_BUCKETS),
    Series("llm_d_epp_kv_cache_events_dedup_removed_hashes_suppressed_total", "counter", ()),
    Series("llm_d_epp_kv_cache_events_dedup_removed_hashes_forwarded_total", "counter", ()),
    Series("kvcache_kvevents_dedup_removed_hashes_suppressed_total", "counter", ()),
    Series("kvcache_kvevents_dedup_removed_hashes_forwarded_total", "counter", ()),
    Series("llm_d_epp_kv_cache_events_stores_skipped_total", "counter", ("cache_kind", "reason")),
    Series("llm_d_epp_kv_cache_events_removals_skipped_total", "counter", ("cache_kind", "reason")),
    Series("llm_d_epp_kv_cache_events_active_subscribers", "gauge", ()),
    Series("llm_d_epp_kv_cache_events_subscriber_reconnections_total", "counter", ("pod_identifier",)),
    Series("llm_d_epp_kv_cache_events_messages_received_total", "counter", ("pod_identifier",)),
    Series("llm_d_epp_kv_cache_events_zmq_errors_total", "counter", ("pod_identifier", "operation")),
    Series("llm_d_epp_kv_cache_events_pool_queue_depth", "gauge", ()),
    Series("llm_d_epp_kv_cache_events_pool_capacity", "gauge", ()),
)

# What epp does not export, and why (docs/metrics.md says the same).
NOT_EXPORTED: dict[str, str] = {
    "llm_d_epp_plugin_data_scope_violations_total": "epp's plugins declare no DataKeys to violate",
    "llm_d_epp_datalayer_extract_errors_total": "epp parses and extracts in one step: a poll error",
    "llm_d_inference_scheduler_datalayer_extract_errors_total": "the same",
    "llm_d_epp_kv_cache_events_stores_skipped_total": "no group-aware (hybrid) KV-cache stores",
    "llm_d_epp_kv_cache_events_removals_skipped_total": "no group-aware (hybrid) KV-cache stores",
    "llm_d_epp_kv_cache_events_pool_queue_depth": "events are applied as they arrive, not queued",
    "llm_d_epp_kv_cache_events_pool_capacity": "no event worker pool",
}

# llm-d v0.10.0 (the tag) wrote the KV index and event series as llm_d_router_epp_kv_cache_*; its
# main renamed them llm_d_epp_kv_cache_* five days later. epp writes both.
RELEASED_KV_PREFIX = "llm_d_router_epp_kv_cache_"
