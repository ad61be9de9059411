"""One /metrics for a pod of workers: the workers' registries folded into one exposition.

Each worker serves its registry on a private socket; the supervisor parses them and writes the
text a single process writes, with the same names, types, labels and buckets, and no `worker`
label: a GIE dashboard sees one EPP.

How a family folds depends on what one worker's value means:
- Counters and histograms are summed: every request, error and decision is counted by exactly
  one worker. The exceptions are the KV-event counters (`epp_kv_*`, llm-d's `kv_cache_events_*`
  and index admissions and evictions, with their `kvcache_*` twins): every worker consumes every
  event, so the pod's count is the largest worker's, not N times it.
- Gauges a worker owns (its streams, its bookings, its memory) are summed; gauges every worker
  computes from the same input (the pool's averages and ready pods, the KV index size, an
  endpoint's exclusion) take the largest value; process_start_time_seconds the oldest.
- A worker that exits leaves its last counters behind (`Retired`), so the pod's counters never go
  down when a worker is restarted (Prometheus would read a drop as a reset and count it again).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from epp.observability import exposition as page_writer

SUMMED_GAUGES = frozenset(
    {
        "process_virtual_memory_bytes",
        "process_resident_memory_bytes",
        "process_open_fds",
        "inference_objective_running_requests",
        "epp_endpoint_inflight_requests",
        "epp_endpoint_inflight_prompt_tokens",
        "epp_extproc_active_streams",
        "llm_d_epp_extproc_streams_inflight",
        "llm_d_epp_request_running",
        # Each worker holds its own flow-control queues: the pod's are their sum.
        "llm_d_epp_flow_control_queue_size",
        "llm_d_epp_flow_control_queue_bytes",
        "inference_extension_flow_control_queue_size",
        "inference_extension_flow_control_queue_bytes",
        "epp_flow_control_queued_requests",
        "epp_flow_control_queued_bytes",
    }
)
MIN_GAUGES = frozenset({"process_start_time_seconds"})
# Every worker consumes every KV event: the pod's count is the largest worker's. (llm-d's index
# lookups are each worker's own requests: summed, as any counter.)
MAX_COUNTER_PREFIXES = (
    "epp_kv_",
    "llm_d_epp_kv_cache_events_",
    "kvcache_kvevents_",
    "llm_d_epp_kv_cache_index_admissions",
    "llm_d_epp_kv_cache_index_evictions",
    "llm_d_router_epp_kv_cache_events_",
    "llm_d_router_epp_kv_cache_index_admissions",
    "llm_d_router_epp_kv_cache_index_evictions",
    "kvcache_index_admissions",
    "kvcache_index_evictions",
)

Key = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> list[Metric]:
    """A worker's exposition, in Prometheus' classic text format as epp.observability.exposition
    writes it (the OpenMetrics parser refuses a histogram with negative buckets, which has no
    `_sum` there); raises ValueError if it is not one.

    The classic parser reads a counter's or histogram's `_created` samples as a gauge family of
    their own: they are put back into their family, so the supervisor writes them as one process.
    """
    families = list(text_string_to_metric_families(text))
    by_name = {f.name: f for f in families}
    out = []
    for family in families:
        base = by_name.get(family.name.removesuffix("_created"))
        if (
            family.name.endswith("_created")
            and base is not None
            and base.type in ("counter", "histogram", "summary")
        ):
            base.samples.extend(family.samples)
            continue
        out.append(family)
    return out


def _rule(family: Metric, sample: Sample) -> str:
    if sample.name.endswith("_created"):
        return "min"  # the oldest worker's creation time
    if family.type in ("counter", "histogram", "summary", "gaugehistogram"):
        return "max" if family.name.startswith(MAX_COUNTER_PREFIXES) else "sum"
    if family.name in SUMMED_GAUGES:
        return "sum"
    if family.name in MIN_GAUGES:
        return "min"
    return "max"  # info, stateset, and gauges every worker computes alike


def _key(sample: Sample) -> Key:
    return sample.name, tuple(sorted(sample.labels.items()))


def _fold(rule: str, a: float, b: float) -> float:
    if rule == "sum":
        return a + b
    if rule == "min":
        return min(a, b)
    return max(a, b)


class Retired:
    """The counters of workers that exited, kept so the pod's totals stay monotonic."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def add(self, families: Sequence[Metric]) -> None:
        """Fold in a dead worker's last families (their counters and histograms)."""
        kept = []
        for family in families:
            if family.type not in ("counter", "histogram", "summary"):
                continue
            copy = Metric(family.name, family.documentation, family.type, family.unit)
            copy.samples = [s for s in family.samples if not s.name.endswith("_created")]
            kept.append(copy)
        self.families = merge([self.families, kept])


def merge(sources: Iterable[Sequence[Metric]]) -> list[Metric]:
    """The pod's families: `sources` (one list of families per process, and `Retired.families`)
    folded together."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[Key, tuple[Sample, float]]] = {}
    for source in sources:
        for family in source:
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
                values[family.name] = {}
            elif merged.type != family.type:
                continue  # a worker of another version: keep the first's type
            seen = values[family.name]
            for s in family.samples:
                key = _key(s)
                old = seen.get(key)
                value = s.value if old is None else _fold(_rule(family, s), old[1], s.value)
                seen[key] = (s, value)
    for name, family in families.items():
        family.samples = [
            Sample(s.name, s.labels, value, None, s.exemplar) for s, value in values[name].values()
        ]
    return list(families.values())


def page(
    workers: Iterable[Sequence[Metric]],
    own: Sequence[Metric],
    retired: Sequence[Metric],
    extra: Sequence[Metric],
) -> bytes:
    """The pod's /metrics page: the workers' parsed families, the supervisor's `own` (as collected:
    read back through the text format so they fold like a worker's), the `retired` counters, then
    `extra` (the supervisor's per-worker series). Pure, and at the label caps ~1 MB to parse per
    worker and as much to write: the supervisor runs it off its event loop."""
    mine = parse(page_writer.write(own).decode())
    return page_writer.write([*merge([*workers, mine, retired]), *extra])
