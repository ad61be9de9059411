"""Flow control's Prometheus series: llm-d's names (`llm_d_epp_flow_control_*`), GIE's
(`inference_extension_flow_control_*`, which llm-d still exports, deprecated) and epp's own
(`epp_flow_control_*`), all built at scrape time from counts the controller keeps.

Why at scrape time: a request that never queues must cost next to nothing
(docs/bench/flow-control.md#flow-control-cost), and a labelled Prometheus child costs ~1.5 µs per
lookup. The controller adds to plain dicts (`Stats`); `Collector` turns them into families when
/metrics is read.

    name (llm-d's and GIE's unless noted)         labels
    flow_control_queue_size, _queue_bytes         fairness_id, priority, inference_pool, model_name,
                                                  target_model_name
    flow_control_request_queue_duration_seconds   the same + outcome (histogram)
    flow_control_requests_total (llm-d)           outcome, priority, inference_pool
    flow_control_pool_saturation                  inference_pool, stage (prefill, decode, effective;
                                                  GIE's: inference_pool, the effective value)
    flow_control_stale_endpoints (llm-d)          detector
    flow_control_capacity_utilization_requests,
      _bytes (llm-d)                              priority, inference_pool
    flow_control_global_capacity_utilization_requests, _bytes (llm-d; with a global limit)
    flow_control_dispatch_cycle_duration_seconds  (histogram)
    program_aware_jains_fairness_index, _avg_wait_time_milliseconds, _attained_service_tokens (llm-d)
    flow_control_revocations_issued_total (llm-d)  priority, inference_pool (enableEviction)
    flow_control_revocations_total (llm-d)        outcome: confirmed, timed_out
    epp_flow_control_queued_requests, _queued_bytes   priority (per band: what an autoscaler reads)
    epp_flow_control_dropped_total                priority, reason (x-llm-d-request-dropped-reason)
    epp_flow_control_dispatch_halted              cause: saturated, stale-metrics, no-endpoints (0/1)

Fairness IDs come from clients: past 1,000 distinct ones a label reads `other` (llm-d's bound).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.observability.histogram import Histogram
from epp.observability.metrics import REGISTRY

if TYPE_CHECKING:
    from epp.flowcontrol.controller import FlowController

LLMD = "llm_d_epp_"
GIE = "inference_extension_"
QUEUE_BUCKETS = (
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
CYCLE_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
MAX_FAIRNESS_IDS = 1000
OTHER = "other"


class Stats:
    """What one controller has counted, in plain dicts (read by `Collector`)."""

    def __init__(self) -> None:
        # (fairness_id, priority, model, target) -> [requests, bytes] queued now
        self.queued: dict[tuple[str, str, str, str], list[int]] = {}
        # (fairness_id, priority, outcome, model, target) -> queue duration histogram
        self.waits: dict[tuple[str, str, str, str, str], Histogram] = {}
        self.outcomes: dict[tuple[str, str], int] = {}  # (outcome, priority) -> requests
        self.dropped: dict[tuple[str, str], int] = {}  # (priority, reason) -> requests
        self.cycles = Histogram(CYCLE_BUCKETS)
        self._ids: set[str] = set()

    def fairness_label(self, flow: str) -> str:
        if flow in self._ids:
            return flow
        if len(self._ids) >= MAX_FAIRNESS_IDS:
            return OTHER
        self._ids.add(flow)
        return flow

    def enqueued(self, key: tuple[str, str, str, str], size: int) -> None:
        entry = self.queued.get(key)
        if entry is None:
            self.queued[key] = [1, size]
        else:
            entry[0] += 1
            entry[1] += size

    def dequeued(self, key: tuple[str, str, str, str], size: int) -> None:
        entry = self.queued[key]
        entry[0] -= 1
        entry[1] -= size
        if entry[0] == 0:
            del self.queued[key]

    def finished(
        self, key: tuple[str, str, str, str, str], outcome: str, wait: float, reason: str | None
    ) -> None:
        hist = self.waits.get(key)
        if hist is None:
            hist = self.waits[key] = Histogram(QUEUE_BUCKETS)
        hist.observe(wait)
        counted = (outcome, key[1])
        self.outcomes[counted] = self.outcomes.get(counted, 0) + 1
        if reason is not None:
            dropped = (key[1], reason)
            self.dropped[dropped] = self.dropped.get(dropped, 0) + 1


class FlowCollector(Collector):
    """Every running controller's series (one per process; workers export their own)."""

    def __init__(self) -> None:
        self._controllers: list[FlowController] = []

    def add(self, controller: FlowController) -> None:
        self._controllers.append(controller)

    def discard(self, controller: FlowController) -> None:
        with contextlib.suppress(ValueError):
            self._controllers.remove(controller)

    def describe(self) -> list[Metric]:
        return list(self._families([]))

    def collect(self) -> list[Metric]:
        return list(self._families(self._controllers))

    def _families(self, controllers: Iterable[FlowController]) -> Iterator[Metric]:
        controllers = list(controllers)
        queue_labels = ["fairness_id", "priority", "inference_pool", "model_name", "target_model_name"]
        wait_labels = [
            "fairness_id",
            "priority",
            "outcome",
            "inference_pool",
            "model_name",
            "target_model_name",
        ]
        for prefix in (LLMD, GIE):
            size = GaugeMetricFamily(
                prefix + "flow_control_queue_size",
                "Current number of requests actively held in the Flow Control queue.",
                labels=queue_labels,
            )
            nbytes = GaugeMetricFamily(
                prefix + "flow_control_queue_bytes",
                "Current total size in bytes of requests actively held in the Flow Control queue.",
                labels=queue_labels,
            )
            waits = HistogramMetricFamily(
                prefix + "flow_control_request_queue_duration_seconds",
                "Distribution of total time requests spend in the Flow Control layer "
                "(from enqueue to final outcome).",
                labels=wait_labels,
            )
            # GIE's has no stage: the effective value.
            saturation = GaugeMetricFamily(
                prefix + "flow_control_pool_saturation",
                "Pool saturation signal gating Flow Control dispatch, per stage (prefill, decode) and "
                "effective (their max, the value used for gating). 1.0 is the gating set point.",
                labels=["inference_pool", "stage"] if prefix == LLMD else ["inference_pool"],
            )
            cycles = HistogramMetricFamily(
                prefix + "flow_control_dispatch_cycle_duration_seconds",
                "Distribution of time taken for each internal dispatch cycle in the Flow Control layer.",
                labels=[],
            )
            for fc in controllers:
                stats, pool = fc.stats, fc.pool_name
                for (flow, prio, model, target), (n, b) in stats.queued.items():
                    size.add_metric([flow, prio, pool, model, target], n)
                    nbytes.add_metric([flow, prio, pool, model, target], b)
                for (flow, prio, outcome, model, target), hist in stats.waits.items():
                    waits.add_metric([flow, prio, outcome, pool, model, target], hist.buckets(), hist.total)
                for stage, value in fc.saturations.items():
                    if prefix == LLMD:
                        saturation.add_metric([pool, stage], value)
                    elif stage == "effective":
                        saturation.add_metric([pool], value)
                cycles.add_metric([], stats.cycles.buckets(), stats.cycles.total)
            yield from (size, nbytes, waits, saturation, cycles)
        yield from self._llmd_only(controllers)
        yield from self._epp(controllers)

    @staticmethod
    def _llmd_only(controllers: list[FlowController]) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            LLMD + "flow_control_requests_total",
            "Total number of requests processed by the Flow Control layer.",
            labels=["outcome", "priority", "inference_pool"],
        )
        stale = GaugeMetricFamily(
            LLMD + "flow_control_stale_endpoints",
            "Candidate endpoints whose metrics are missing or older than the detector's staleness "
            "threshold, scored as fully saturated: nonzero during a dispatch stall means a metrics "
            "problem, not overload.",
            labels=["detector"],
        )
        util_req = GaugeMetricFamily(
            LLMD + "flow_control_capacity_utilization_requests",
            "Queued requests over the band's maxRequests.",
            labels=["priority", "inference_pool"],
        )
        util_bytes = GaugeMetricFamily(
            LLMD + "flow_control_capacity_utilization_bytes",
            "Queued bytes over the band's maxBytes.",
            labels=["priority", "inference_pool"],
        )
        global_req = GaugeMetricFamily(
            LLMD + "flow_control_global_capacity_utilization_requests",
            "Queued requests over the global maxRequests (only with one).",
            labels=["inference_pool"],
        )
        global_bytes = GaugeMetricFamily(
            LLMD + "flow_control_global_capacity_utilization_bytes",
            "Queued bytes over the global maxBytes (only with one).",
            labels=["inference_pool"],
        )
        jains = GaugeMetricFamily(
            LLMD + "program_aware_jains_fairness_index",
            "Jain's fairness index over average wait time across active programs.",
        )
        avg_wait = GaugeMetricFamily(
            LLMD + "program_aware_avg_wait_time_milliseconds",
            "Cumulative mean of flow-control queue wait time per program in milliseconds.",
            labels=["program_id"],
        )
        service = GaugeMetricFamily(
            LLMD + "program_aware_attained_service_tokens",
            "Time-decayed attained service (weighted tokens consumed) per program.",
            labels=["program_id"],
        )
        for fc in controllers:
            pool = fc.pool_name
            for (outcome, prio), n in fc.stats.outcomes.items():
                requests.add_metric([outcome, prio, pool], n)
            stale.add_metric([fc.detector.name], fc.stale)
            reg = fc.registry
            for band in reg.ordered:
                util_req.add_metric([str(band.priority), pool], band.len / band.max_requests)
                util_bytes.add_metric([str(band.priority), pool], band.bytes / band.max_bytes)
            if reg.max_requests:
                global_req.add_metric([pool], reg.len / reg.max_requests)
            if reg.max_bytes:
                global_bytes.add_metric([pool], reg.bytes / reg.max_bytes)
            for policy in fc.config.programs:
                jains.add_metric([], policy.jains_index())
                for program_id, program in policy.programs.items():
                    label = fc.stats.fairness_label(program_id)
                    if program.wait_count:
                        avg_wait.add_metric([label], program.wait_ms)
                    service.add_metric([label], program.service)
        issued = CounterMetricFamily(
            LLMD + "flow_control_revocations_issued",
            "In-flight sheddable requests cut for a higher band (enableEviction), by the waiting "
            "band's priority.",
            labels=["priority", "inference_pool"],
        )
        revocations = CounterMetricFamily(
            LLMD + "flow_control_revocations",
            "Cuts by how they ended: confirmed (the stream ended), timed_out (it had not after 10 s).",
            labels=["outcome", "inference_pool"],
        )
        for fc in controllers:
            reclaimer = fc.reclaimer
            if reclaimer is None:
                continue
            for waiting, cut in reclaimer.issued.items():
                issued.add_metric([str(waiting), fc.pool_name], cut)
            revocations.add_metric(["confirmed", fc.pool_name], reclaimer.confirmed)
            revocations.add_metric(["timed_out", fc.pool_name], reclaimer.timed_out)
        yield from (requests, stale, util_req, util_bytes, global_req, global_bytes, jains, avg_wait, service)
        yield from (issued, revocations)

    @staticmethod
    def _epp(controllers: list[FlowController]) -> Iterator[Metric]:
        queued = GaugeMetricFamily(
            "epp_flow_control_queued_requests",
            "Requests held in flow control, per priority band.",
            labels=["priority"],
        )
        queued_bytes = GaugeMetricFamily(
            "epp_flow_control_queued_bytes",
            "Request bytes held in flow control, per priority band.",
            labels=["priority"],
        )
        dropped = CounterMetricFamily(
            "epp_flow_control_dropped",
            "Requests flow control answered instead of dispatching, by x-llm-d-request-dropped-reason.",
            labels=["priority", "reason"],
        )
        halted = GaugeMetricFamily(
            "epp_flow_control_dispatch_halted",
            "1 while dispatch is held back for this cause at the last cycle with requests queued: saturated "
            "(the pool is busy), stale-metrics (every endpoint's metrics are stale: a scrape problem, not "
            "load), no-endpoints (the pool is empty: scale from zero).",
            labels=["cause"],
        )
        for fc in controllers:
            for band in fc.registry.ordered:
                queued.add_metric([str(band.priority)], band.len)
                queued_bytes.add_metric([str(band.priority)], band.bytes)
            for (prio, reason), n in fc.stats.dropped.items():
                dropped.add_metric([prio, reason], n)
            for cause in ("saturated", "stale-metrics", "no-endpoints"):
                halted.add_metric([cause], 1.0 if fc.halted == cause else 0.0)
        yield from (queued, queued_bytes, dropped, halted)


COLLECTOR = FlowCollector()
REGISTRY.register(COLLECTOR)
