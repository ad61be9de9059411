"""Folding worker registries into the pod's one /metrics (epp.workers.merge)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from epp.observability import exposition, metrics
from epp.workers import merge


def _worker(
    requests: int, streams: int, ready_pods: int, kv_blocks: int, latency: float
) -> CollectorRegistry:
    reg = CollectorRegistry()
    c = Counter("inference_objective_request_total", "r", ["model_name"], registry=reg)
    c.labels("m").inc(requests)
    Gauge("epp_extproc_active_streams", "s", registry=reg).set(streams)
    Gauge("inference_pool_ready_pods", "p", ["name"], registry=reg).labels("pool").set(ready_pods)
    Counter("epp_kv_events_blocks_total", "b", ["pod"], registry=reg).labels("p0").inc(kv_blocks)
    h = Histogram("epp_decision_duration_seconds", "d", buckets=(0.001, 0.01), registry=reg)
    h.observe(latency)
    return reg


def _text(families: list[Metric]) -> str:
    return exposition.write(families).decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _parse(reg: CollectorRegistry) -> list[Metric]:
    return merge.parse(generate_latest(reg).decode())


def test_counters_and_histograms_sum_shared_views_take_the_max() -> None:
    a = _parse(_worker(requests=3, streams=2, ready_pods=4, kv_blocks=100, latency=0.0005))
    b = _parse(_worker(requests=5, streams=1, ready_pods=4, kv_blocks=90, latency=0.005))
    got = _samples(_text(merge.merge([a, b])))
    assert got[("inference_objective_request_total", (("model_name", "m"),))] == 8
    assert got[("epp_extproc_active_streams", ())] == 3  # each worker's own streams
    assert got[("inference_pool_ready_pods", (("name", "pool"),))] == 4  # the same pool, seen twice
    # Every worker consumes every KV event: the pod received 100, not 190.
    assert got[("epp_kv_events_blocks_total", (("pod", "p0"),))] == 100
    assert got[("epp_decision_duration_seconds_count", ())] == 2
    assert got[("epp_decision_duration_seconds_bucket", (("le", "0.001"),))] == 1
    assert got[("epp_decision_duration_seconds_bucket", (("le", "0.01"),))] == 2


def test_one_worker_exposes_exactly_what_a_single_process_does() -> None:
    # GIE's names, types, labels and buckets are unchanged by the supervisor (its HELP/TYPE lines
    # and samples come out of the merge as the single process writes them).
    metrics.requests_total.labels("a", "b", "0").inc()
    metrics.request_duration.labels("a", "b").observe(0.3)
    single = generate_latest(metrics.REGISTRY).decode()
    merged = _text(merge.merge([_parse(metrics.REGISTRY)]))
    strip = [line for line in single.splitlines() if not line.startswith("process_")]
    assert [line for line in merged.splitlines() if not line.startswith("process_")] == strip


def test_a_dead_workers_counters_stay_in_the_totals() -> None:
    retired = merge.Retired()
    before = _parse(_worker(requests=7, streams=3, ready_pods=2, kv_blocks=50, latency=0.005))
    retired.add(before)  # worker 1 exited after it was last scraped
    restarted = _parse(_worker(requests=1, streams=1, ready_pods=2, kv_blocks=10, latency=0.005))
    other = _parse(_worker(requests=2, streams=0, ready_pods=2, kv_blocks=50, latency=0.005))
    got = _samples(_text(merge.merge([restarted, other, retired.families])))
    assert got[("inference_objective_request_total", (("model_name", "m"),))] == 10  # never goes down
    assert got[("epp_extproc_active_streams", ())] == 1  # a dead worker has no streams
    assert got[("epp_decision_duration_seconds_count", ())] == 3
    assert got[("epp_kv_events_blocks_total", (("pod", "p0"),))] == 50
    again = _parse(_worker(requests=4, streams=0, ready_pods=2, kv_blocks=0, latency=0.005))
    retired.add(again)
    got = _samples(_text(merge.merge([other, retired.families])))
    assert got[("inference_objective_request_total", (("model_name", "m"),))] == 13


def test_a_histogram_with_negative_buckets_survives() -> None:
    # OpenMetrics drops _sum for such a histogram and its own parser then refuses the whole text;
    # one worker's odd family must not cost the pod every metric.
    def worker(value: float) -> list[Metric]:
        reg = CollectorRegistry()
        h = Histogram(
            "epp_predicted_ttft_error_seconds", "e", ["plugin"], buckets=(-1.0, 0.0, 1.0), registry=reg
        )
        h.labels("p").observe(value)
        Counter("inference_objective_request_total", "r", registry=reg).inc()
        return merge.parse(generate_latest(reg).decode())

    got = _samples(_text(merge.merge([worker(-0.5), worker(0.5)])))
    assert got[("epp_predicted_ttft_error_seconds_count", (("plugin", "p"),))] == 2
    assert got[("epp_predicted_ttft_error_seconds_bucket", (("le", "0.0"), ("plugin", "p")))] == 1
    assert got[("inference_objective_request_total", ())] == 2
