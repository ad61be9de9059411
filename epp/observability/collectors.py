"""Series built at scrape time from other components' own counters and snapshots: the pool
averages (from the scraper), KV-event ingestion (from the ingesters) and the tokenizers (from the
tokenizer registry). Registered with `metrics.REGISTRY` on import; `epp.observability` imports
this module, so every process that exports metrics has them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.observability.metrics import REGISTRY

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
    `inference_pool_per_pod_queue_size{name,model_server_pod}`, and llm-d's names for them
    (`llm_d_epp_average_*`, `llm_d_epp_per_endpoint_queue_size{name,model_server_endpoint}`) with
    its standard deviations (`llm_d_epp_std_dev_*`), rounded as llm-d rounds them, from registered
    sources.

    The averages are over routable endpoints and absent while there is none (a stale average of
    gone pods would keep an alert firing); the per-pod queue covers every endpoint, as GIE's does.
    """

    @staticmethod
    def _families(snaps: list[PoolSnapshot]) -> Iterator[Metric]:
        name = ["name"]
        measures = (
            ("kv_cache_utilization", "KV-cache utilization (0..1)", lambda p: p.kv_usage),
            ("queue_size", "number of requests waiting in the queues", lambda p: p.waiting),
            ("running_requests", "number of requests running", lambda p: p.running),
        )
        families: list[tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, Any]] = []
        for measure, what, read in measures:
            doc = f"of the {what} the pool's routable model servers last reported."
            families.append(
                (
                    GaugeMetricFamily(f"inference_pool_average_{measure}", f"Mean {doc}", labels=name),
                    GaugeMetricFamily(f"llm_d_epp_average_{measure}", f"Mean {doc}", labels=name),
                    GaugeMetricFamily(f"llm_d_epp_std_dev_{measure}", f"Std deviation {doc}", labels=name),
                    read,
                )
            )
        doc = "Requests waiting in each model server's queue, as it last reported."
        per_pod = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size", doc, labels=["name", "model_server_pod"]
        )
        per_endpoint = GaugeMetricFamily(
            "llm_d_epp_per_endpoint_queue_size", doc, labels=["name", "model_server_endpoint"]
        )
        for snap in snaps:
            live = [p for p in snap.pods if p.routable]
            if live:
                for gie, llmd, std_dev, read in families:
                    values = [float(read(p)) for p in live]
                    mean = sum(values) / len(values)
                    gie.add_metric([snap.name], mean)
                    # llm-d's: rounded to 2 decimals, the deviation over n - 1 (n at least 2).
                    squares = sum((v - mean) ** 2 for v in values)
                    llmd.add_metric([snap.name], round(mean, 2))
                    std_dev.add_metric([snap.name], round(math.sqrt(squares / max(1, len(values) - 1)), 2))
            for p in snap.pods:
                per_pod.add_metric([snap.name, p.name], p.waiting)
                per_endpoint.add_metric([snap.name, p.name], p.waiting)
        for gie, llmd, std_dev, _ in families:
            yield from (gie, llmd, std_dev)
        yield from (per_pod, per_endpoint)


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
    messages: int = 0  # messages received from the pod, good or bad (llm-d's messages_received)
    reconnections: int = 0  # connections after the first (llm-d's subscriber_reconnections)
    zmq_errors: Mapping[str, int] = {}  # llm-d's operation names (connect, replay-incomplete) -> n
    silent: bool = False  # sent work but published nothing (epp.kvcache.silence.Silence)


class KVSnapshot(NamedTuple):
    """What `KVCollector` exposes, from one source (an ingester and its index)."""

    pods: Mapping[str, KVPodCounts]
    unrouted: Mapping[str, int]  # reason -> messages no pod could be named for (label pod="")
    entries: int
    keys: int
    evictions: int
    index: Any = None  # its epp.kvcache.index.IndexStats (llm-d's kv_cache_index_* series)
    lookup_seconds: Any = None  # its epp.observability.histogram.Histogram of `match` times
    subscribers: int = 0  # SUB sockets open (one per pod connected to, plus the bound one)


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
        silent = GaugeMetricFamily(
            "epp_kv_events_publisher_silent",
            "1 while the pod has been sent work (1024 prompt tokens or more) but no KV event came "
            "from it for --kv-events-silence-grace: its prefix-cache scores stay 0.",
            labels=pod,
        )
        for snap in snaps:
            for name, c in snap.pods.items():
                silent.add_metric([name], 1.0 if c.silent else 0.0)
        yield from (batches, blocks, errors, gaps, replays, resets, ages, entries, keys, evictions, silent)
        yield from _llmd_kv_families(snaps)


# llm-d's names for the KV index and its event subscribers (`pkg/kvcache/metrics/collector.go`):
# `llm_d_epp_kv_cache_*`, and the deprecated `kvcache_*` twins it still writes for the index and
# the event deduplication. (name after the prefix, deprecated name or None, help)
_LLMD_KV_COUNTERS = (
    ("kv_cache_index_admissions", "kvcache_index_admissions", "Total number of KV-block admissions"),
    ("kv_cache_index_evictions", "kvcache_index_evictions", "Total number of KV-block evictions"),
    ("kv_cache_index_lookup_requests", "kvcache_index_lookup_requests", "Total number of lookup calls"),
    (
        "kv_cache_index_max_pod_hit_count",
        "kvcache_index_max_pod_hit_count",
        "Longest contiguous per-pod prefix chain observed per lookup",
    ),
    (
        "kv_cache_index_lookup_hits",
        "kvcache_index_lookup_hits",
        "Contiguous prefix blocks matched by the best pod per lookup",
    ),
    (
        "kv_cache_events_dedup_removed_hashes_suppressed",
        "kvcache_kvevents_dedup_removed_hashes_suppressed",
        "Block hashes whose removal was suppressed by the KV-event dedup filter (block hashes, not "
        "BlockRemoved events)",
    ),
    (
        "kv_cache_events_dedup_removed_hashes_forwarded",
        "kvcache_kvevents_dedup_removed_hashes_forwarded",
        "Block hashes forwarded for eviction after the KV-event dedup filter (block hashes, not "
        "BlockRemoved events)",
    ),
)


def _index_value(name: str, snap: KVSnapshot) -> float:
    st = snap.index
    if st is None:
        return 0.0
    return float(
        {
            "kv_cache_index_admissions": st.admissions,
            "kv_cache_index_evictions": st.removals,
            "kv_cache_index_lookup_requests": st.lookups,
            "kv_cache_index_max_pod_hit_count": st.lookup_hits,
            "kv_cache_index_lookup_hits": st.lookup_hits,
            "kv_cache_events_dedup_removed_hashes_suppressed": st.deduplicated,
            "kv_cache_events_dedup_removed_hashes_forwarded": st.removals + st.missed_removals,
        }[name]
    )


# llm-d v0.10.0 released them under `llm_d_router_epp_`; its main renamed them `llm_d_epp_` days
# later (the current, canonical name). Dashboards of either read epp: it writes both.
_LLMD_KV_PREFIXES = ("llm_d_epp_", "llm_d_router_epp_")


def _llmd_kv_families(snaps: list[KVSnapshot]) -> Iterator[Metric]:
    current = _LLMD_KV_PREFIXES[0]
    for name, old, doc in _LLMD_KV_COUNTERS:
        value = sum(_index_value(name, s) for s in snaps)
        for family in (
            *(CounterMetricFamily(prefix + name, doc) for prefix in _LLMD_KV_PREFIXES),
            CounterMetricFamily(old, f"Deprecated: use {current}{name}. {doc}"),
        ):
            if snaps:
                family.add_metric([], value)
            yield family
    doc = "Latency of Lookup calls in seconds"
    latency_name = "kv_cache_index_lookup_latency_seconds"
    for name, help_text in (
        *((prefix + latency_name, doc) for prefix in _LLMD_KV_PREFIXES),
        ("kvcache_index_lookup_latency_seconds", f"Deprecated: use {current}{latency_name}. {doc}"),
    ):
        latency = HistogramMetricFamily(name, help_text)
        for snap in snaps:
            if snap.lookup_seconds is not None:
                latency.add_metric([], snap.lookup_seconds.buckets(), snap.lookup_seconds.total)
        yield latency
    for prefix in _LLMD_KV_PREFIXES:
        active = GaugeMetricFamily(
            prefix + "kv_cache_events_active_subscribers",
            "Number of ZMQ subscribers currently managed, including those retrying a failed connection",
        )
        received = CounterMetricFamily(
            prefix + "kv_cache_events_messages_received",
            "Total number of messages received from ZMQ subscribers",
            labels=["pod_identifier"],
        )
        reconnections = CounterMetricFamily(
            prefix + "kv_cache_events_subscriber_reconnections",
            "Total number of ZMQ subscriber reconnection attempts",
            labels=["pod_identifier"],
        )
        zmq_errors = CounterMetricFamily(
            prefix + "kv_cache_events_zmq_errors",
            "Total number of ZMQ subscriber errors",
            labels=["pod_identifier", "operation"],
        )
        if snaps:
            active.add_metric([], sum(s.subscribers for s in snaps))
        for snap in snaps:
            for pod_name, c in snap.pods.items():
                received.add_metric([pod_name], c.messages)
                reconnections.add_metric([pod_name], c.reconnections)
                for operation, n in c.zmq_errors.items():
                    zmq_errors.add_metric([pod_name, operation], n)
        yield from (active, received, reconnections, zmq_errors)


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
    ("verified", "texts fastokens encoded in pieces whose ids were checked against tokenizers"),
    ("unverified", "texts fastokens encoded in pieces whose ids were not checked (sampled checks)"),
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


class RenderCollector(Collector):
    """`epp_tokenizer_render_total{outcome}` (token ids asked of the model servers' /render: rendered,
    cached, timeout, error, refused, unavailable) and `epp_tokenizer_render_batched_total` (prompts
    sent in another request's call), read at scrape time from the renderer's counters."""

    def __init__(self, renderer: Any) -> None:
        self._renderer = renderer

    def describe(self) -> list[Metric]:
        return self._families({}, 0)

    def collect(self) -> list[Metric]:
        return self._families(dict(self._renderer.outcomes), int(self._renderer.batched))

    @staticmethod
    def _families(outcomes: Mapping[str, int], batched: int) -> list[Metric]:
        total = CounterMetricFamily(
            "epp_tokenizer_render",
            "Token ids asked of the model servers' /render, by outcome",
            labels=["outcome"],
        )
        for outcome, n in sorted(outcomes.items()):
            total.add_metric([outcome], n)
        moved = CounterMetricFamily(
            "epp_tokenizer_render_batched", "Prompts rendered in another request's /render call"
        )
        moved.add_metric([], batched)
        return [total, moved]
