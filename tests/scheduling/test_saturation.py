"""Saturation detectors: their arithmetic, staleness, filter role, and selection by the config."""

from __future__ import annotations

import textwrap
import time

import pytest

from epp.datastore.endpoints import Endpoint
from epp.scheduling import config, interfaces
from epp.scheduling.plugins import concurrency_detector, utilization_detector
from epp.units import parse_duration

from . import builders

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def fresh(name: str, *, waiting: int = 0, kv: float = 0.0, age: float = 0.0) -> Endpoint:
    """An endpoint scraped `age` seconds ago."""
    ep = builders.endpoint(name, waiting=waiting, kv=kv)
    ep.metrics.updated_at = time.monotonic() - age
    return ep


# ---- utilization-detector ---------------------------------------------------------------------------


def test_utilization_is_the_average_of_each_endpoints_worse_ratio() -> None:
    d = builders.plugin("utilization-detector")
    # max(1/5, 0.2/0.8) = 0.25; max(5/5, 0.4/0.8) = 1.0; max(0/5, 0.8/0.8) = 1.0; max(10/5, 0) = 2.0
    eps = [fresh("a", waiting=1, kv=0.2), fresh("b", waiting=5, kv=0.4), fresh("c", kv=0.8)]
    assert d.saturation(eps) == pytest.approx((0.25 + 1.0 + 1.0) / 3)
    assert d.saturation([fresh("d", waiting=10)]) == pytest.approx(2.0)
    assert d.saturation([fresh("idle")]) == 0.0


def test_utilization_counts_stale_and_missing_metrics_as_saturated() -> None:
    d = builders.plugin("utilization-detector")  # staleness 200ms
    never = builders.endpoint("never")  # updated_at 0: never scraped
    assert d.saturation([never]) == 1.0
    assert d.saturation([fresh("old", age=0.3)]) == 1.0
    assert d.saturation([fresh("recent", age=0.1)]) == 0.0
    assert d.saturation([fresh("old", age=0.3), fresh("idle")]) == pytest.approx(0.5)
    lenient = builders.plugin("utilization-detector", {"metricsStalenessThreshold": "1s"})
    assert lenient.saturation([fresh("old", age=0.3)]) == 0.0


def test_utilization_forgives_the_age_the_scraper_chose() -> None:
    # An idle endpoint read every 500 ms (epp.datastore.pacing) is not stale at 300 ms...
    d = builders.plugin("utilization-detector")  # staleness 200ms
    paced = fresh("idle", age=0.3)
    paced.metrics.grace = 0.45
    assert d.saturation([paced]) == 0.0 and d.stale_count([paced]) == 0
    # ...but is once a scrape it waits for is 200 ms overdue.
    late = fresh("idle", age=0.66)
    late.metrics.grace = 0.45
    assert d.saturation([late]) == 1.0 and d.stale_count([late]) == 1


def test_no_endpoints_is_saturated() -> None:
    assert builders.plugin("utilization-detector").saturation([]) == 1.0
    assert builders.plugin("concurrency-detector").saturation([]) == 1.0


def test_utilization_parameters() -> None:
    d = builders.plugin(
        "utilization-detector",
        {"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.5, "metricsStalenessThreshold": "1m30s"},
    )
    assert d.staleness == 90.0
    assert d.saturation([fresh("a", waiting=5, kv=0.1)]) == pytest.approx(0.5)
    assert d.saturation([fresh("b", waiting=1, kv=0.4)]) == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("200ms", 0.2), ("1s", 1.0), ("1.5s", 1.5), ("2m", 120.0), ("1h", 3600.0), ("500us", 5e-4)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "200", "ms", "1 s", "-1s", "1d", "1s junk"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_utilization_filter_keeps_endpoints_under_the_thresholds_with_headroom() -> None:
    d = builders.plugin("utilization-detector")
    ok, queued, full = fresh("ok", waiting=4, kv=0.79), fresh("q", waiting=5), fresh("kv", kv=0.8)
    assert d.filter({}, builders.request(), [ok, queued, full]) == [ok]
    assert d.filter({}, builders.request(), [queued, full]) == [queued, full]  # none passes: all
    roomy = builders.plugin("utilization-detector", {"headroom": 0.5})  # 7.5 queued, 1.2 KV
    assert roomy.filter({}, builders.request(), [ok, queued, full]) == [ok, queued, full]


# ---- concurrency-detector ---------------------------------------------------------------------------


def test_concurrency_is_aggregate_inflight_over_aggregate_capacity() -> None:
    d = builders.plugin("concurrency-detector", {"maxConcurrency": 10})
    eps = [builders.endpoint("a", inflight_requests=15), builders.endpoint("b", inflight_requests=3)]
    assert d.saturation(eps) == pytest.approx(18 / 20)
    eps[1].inflight_requests = 5
    assert d.saturation(eps) == pytest.approx(1.0)
    assert d.filter({}, builders.request(), eps) == [eps[1]]


def test_concurrency_in_tokens() -> None:
    d = builders.plugin("concurrency-detector", {"concurrencyMode": "tokens", "maxTokenConcurrency": 1000})
    eps = [builders.endpoint("a", inflight_tokens=500, inflight_requests=99)]
    assert d.saturation(eps) == pytest.approx(0.5)


def test_concurrency_defaults_and_headroom_filter() -> None:
    d = builders.plugin("concurrency-detector", {"headroom": 0.1})  # 100 requests, filter at 110
    busy = builders.endpoint("busy", inflight_requests=105)
    over = builders.endpoint("over", inflight_requests=111)
    assert d.saturation([busy]) == pytest.approx(1.05)
    assert d.filter({}, builders.request(), [busy, over]) == [busy]
    assert d.filter({}, builders.request(), [over]) == [over]


def test_prefill_tokens_saturate_and_filter() -> None:
    # maxPrefillTokens: the larger of the request count and the prompt tokens awaiting their first
    # byte; the filter keeps the endpoints under either limit.
    d = builders.plugin("concurrency-detector", {"maxConcurrency": 10, "maxPrefillTokens": 1000})
    a = builders.endpoint("a", inflight_requests=2)
    b = builders.endpoint("b", inflight_requests=2)
    a.prefill_tokens, b.prefill_tokens = 1500, 300
    assert d.counts_prefill
    assert d.saturation([a, b]) == pytest.approx(1800 / 2000)
    assert d.filter({}, builders.request(), [a, b]) == [b]
    b.prefill_tokens = 1000
    assert d.saturation([a, b]) == pytest.approx(1.25)
    assert d.filter({}, builders.request(), [a, b]) == [a, b]  # none under: all kept
    b.prefill_tokens, b.inflight_requests = 0, 10  # full on requests, idle on prefill
    assert d.filter({}, builders.request(), [a, b]) == [a, b]
    assert not builders.plugin("concurrency-detector", {"maxConcurrency": 10}).counts_prefill


# ---- parameters and configuration -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_name", "parameters", "fragment"),
    [
        ("utilization-detector", {"queueDepthThreshold": 0}, "$.queueDepthThreshold"),
        ("utilization-detector", {"kvCacheUtilThreshold": 1.5}, "$.kvCacheUtilThreshold"),
        ("utilization-detector", {"metricsStalenessThreshold": "soon"}, "metricsStalenessThreshold: not a"),
        ("utilization-detector", {"metricsStalenessThreshold": "0s"}, "must be > 0"),
        ("utilization-detector", {"metricsStalenessThreshold": 200}, "$.metricsStalenessThreshold"),
        ("utilization-detector", {"headroom": -0.1}, "$.headroom"),
        ("utilization-detector", {"queueDepth": 3}, "unknown field `queueDepth`"),
        ("concurrency-detector", {"concurrencyMode": "bytes"}, "$.concurrencyMode"),
        ("concurrency-detector", {"maxConcurrency": 0}, "$.maxConcurrency"),
        ("concurrency-detector", {"maxTokenConcurrency": -1}, "$.maxTokenConcurrency"),
        ("concurrency-detector", {"maxPrefillTokens": -1}, "$.maxPrefillTokens"),
    ],
)
def test_bad_parameters_are_config_errors(
    type_name: str, parameters: dict[str, object], fragment: str
) -> None:
    with pytest.raises(config.ConfigError) as info:
        builders.plugin(type_name, parameters, name="d")
    assert f"plugin 'd' (type '{type_name}')" in str(info.value)
    assert fragment in str(info.value)


def load(body: str) -> config.SchedulerConfig:
    return config.load_config(HEAD + textwrap.dedent(body), builders.handle())


def test_default_detector_is_a_utilization_detector_with_gie_defaults() -> None:
    cfg = load("plugins: [{type: queue-scorer}]\n")
    d = cfg.saturation_detector
    assert isinstance(d, utilization_detector.UtilizationDetector)
    assert (d.queue_threshold, d.kv_threshold, d.staleness, d.headroom) == (5.0, 0.8, 0.2, 0.0)
    assert cfg.warnings == []
    assert isinstance(
        config.load_config(None, builders.handle()).saturation_detector, interfaces.SaturationDetector
    )


@pytest.mark.parametrize(
    ("type_name", "cls"),
    [
        ("utilization-detector", utilization_detector.UtilizationDetector),
        ("concurrency-detector", concurrency_detector.ConcurrencyDetector),
    ],
)
def test_config_selects_the_detector(type_name: str, cls: type) -> None:
    cfg = load(
        f"""
        plugins:
        - type: queue-scorer
        - name: sat
          type: {type_name}
          parameters: {{headroom: 0.2}}
        saturationDetector:
          pluginRef: sat
        """
    )
    assert isinstance(cfg.saturation_detector, cls)
    assert cfg.saturation_detector is cfg.plugins["sat"]
    assert cfg.saturation_detector.headroom == 0.2
    # Not silently made a filter of the implicit default profile, and not "unused" either.
    assert [f.name for f in cfg.scheduler.profiles[0].filters] == []
    assert cfg.warnings == []


def test_a_detector_listed_in_a_profile_is_a_filter() -> None:
    cfg = load(
        """
        plugins:
        - type: concurrency-detector
        - type: queue-scorer
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: concurrency-detector}, {pluginRef: queue-scorer}]
        """
    )
    assert [f.name for f in cfg.scheduler.profiles[0].filters] == ["concurrency-detector"]
    assert isinstance(cfg.saturation_detector, utilization_detector.UtilizationDetector)  # not referenced


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            "plugins: [{type: queue-scorer}]\nsaturationDetector: {pluginRef: queue-scorer}\n",
            "saturationDetector.pluginRef (line 4): plugin 'queue-scorer' (type 'queue-scorer') is not a "
            "saturation detector",
        ),
        (
            "plugins: []\nsaturationDetector: {pluginRef: nope}\n",
            "saturationDetector.pluginRef (line 4): pluginRef 'nope' is not a defined plugin",
        ),
        (
            "plugins: [{type: metrics-data-source}]\nsaturationDetector: {pluginRef: metrics-data-source}\n",
            "(type 'metrics-data-source') is not a saturation detector",
        ),
        (
            "plugins: [{type: utilization-detector, parameters: {kvCacheUtilThreshold: 0}}]\n",
            "plugins[0].parameters.kvCacheUtilThreshold (line 3)",
        ),
        # GIE v1.0-1.3's inline form is decoded as strictly as a plugin's parameters.
        (
            "saturationDetector:\n  kvCacheUtilThreshold: banana\n",
            "saturationDetector.kvCacheUtilThreshold (line 4): Expected `float | null`, got `str`",
        ),
        (
            "saturationDetector:\n  queueDepthThreshold: 5\n  kvCacheUtilThreshhold: 0.8\n",
            "saturationDetector.kvCacheUtilThreshhold (line 5): unknown key 'kvCacheUtilThreshhold'",
        ),
        (
            "saturationDetector: {kvCacheUtilThreshold: 1.5}\n",
            "saturationDetector.kvCacheUtilThreshold (line 3): Expected `float` <= 1",
        ),
        (
            "saturationDetector: {metricsStalenessThreshold: soon}\n",
            "saturationDetector (line 3): plugin 'utilization-detector' (type 'utilization-detector'): "
            "metricsStalenessThreshold",
        ),
        (
            "plugins: [{type: utilization-detector}]\n"
            "saturationDetector: {pluginRef: utilization-detector, queueDepthThreshold: 3}\n",
            "saturationDetector.queueDepthThreshold (line 4): give pluginRef or the inline thresholds",
        ),
    ],
)
def test_bad_saturation_detector_sections(body: str, fragment: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load_config(HEAD + body, builders.handle())
    assert fragment in str(info.value)


def test_gie_v1_inline_thresholds_configure_the_default_detector() -> None:
    cfg = config.load_config(
        HEAD
        + "saturationDetector:\n  queueDepthThreshold: 10\n  kvCacheUtilThreshold: 0.5\n"
        + "  metricsStalenessThreshold: 150ms\n",
        builders.handle(),
    )
    detector = cfg.saturation_detector
    assert isinstance(detector, utilization_detector.UtilizationDetector)
    assert (detector.queue_threshold, detector.kv_threshold, detector.staleness) == (10.0, 0.5, 0.15)
