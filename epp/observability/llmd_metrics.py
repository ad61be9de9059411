"""llm-d Router's canonical `llm_d_epp_*` series (v0.10 `pkg/epp/metrics`), in `metrics.REGISTRY`.

llm-d renamed GIE's `inference_objective_*`, `inference_pool_*` and `inference_extension_*` series
to `llm_d_epp_*` and still emits the old names beside them (deprecated twins): epp does the same,
so both generations of dashboards and alerts read epp. The names, types, label names and
buckets here are llm-d's (tests/observability/llmd_metrics.py holds the table they are checked
against); docs/metrics.md lists them.
"""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

from epp.observability.metrics import REGISTRY

LLMD = "llm_d_epp_"

# --- ext_proc streams (--enable-grpc-stream-metrics) ----------------------------------------------
# Registered only when the flag is given, as llm-d does (a dashboard tells them apart by absence).

extproc_streams_inflight = Gauge(
    LLMD + "extproc_streams_inflight", "Number of ext_proc gRPC streams currently open.", registry=None
)
extproc_stream_duration = Histogram(
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
