"""The flow controller: holds requests the pool cannot take yet, and lets them go in order.

`admit()` is awaited by the Director between parsing a request and scheduling it. It returns
when the request may be scheduled, raises the HTTP answer (`outcomes.http_error`) when it is shed,
and lets `CancelledError` through when the client leaves (the request's slot and body go back at
once). While it waits, the ext-proc stream is simply not answered.

A dispatch cycle (llm-d's, one request at most per cycle):

1. The pool: every candidate endpoint (subset hints do not apply here, as in llm-d). Empty or
   not is the *regime* that picks the queue-wait budget (below).
2. Saturation from the detector, per stage when endpoints carry `llm-d.ai/role` labels (prefill,
   decode; both-role endpoints count in each), the effective value being the highest.
3. The usage-limit policy writes one ceiling per band, highest priority first.
4. Bands in order: the first whose ceiling is <= saturation stops the cycle (head-of-line
   blocking: lower bands never take capacity a higher one waits for); otherwise the band's
   fairness policy picks a flow, the flow's ordering policy its head, and that request goes.

A cycle runs when a request arrives, and every millisecond while anything is queued (llm-d's
dispatch ticker); nothing runs while the queues are empty. A request arriving at empty queues is
decided on the spot: it goes at once if its band may dispatch, without being queued at all.

Queue-wait budgets: `defaultRequestTTL` while the pool has endpoints (then 429
`rejected-ttl-expired`), `noEndpointRequestTTL` while it has none (503 `rejected-no-endpoints`).
Each change of regime starts the budget afresh for every queued request, and no request waits
longer than the larger of the two from its arrival. A budget of 0 means no limit in that regime.
Each request has its own timer, so it is shed at its deadline, not at the next sweep.

Limits: a request that would take its band past `maxRequests`/`maxBytes`, or all bands past the
global limits, is refused at once (429 `rejected-saturated`, or 503 `rejected-no-endpoints`
while the pool is empty).

Stale metrics: the utilization detector counts an endpoint whose metrics are stale as saturated
(fail closed, as llm-d). When that is what halts dispatch, the halt is reported as
`stale-metrics` (a scrape problem), not `saturated` (load): in /debug/flow-control, in
`epp_flow_control_dispatch_halted` and in a warning at most every 30 s.

The controller runs on one event loop and needs no locks. `timer` schedules its callbacks: the
event loop when serving, the benchmark's virtual clock in `epp bench --mode fast`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from epp import clock
from epp.api import agent_identity
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.flowcontrol import config as fc_config
from epp.flowcontrol import debug
from epp.flowcontrol import metrics as fc_metrics
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.eviction import InFlight, Reclaimer
from epp.flowcontrol.fair_share import FairShare
from epp.flowcontrol.outcomes import Outcome, http_error
from epp.flowcontrol.program_aware import ProgramAware
from epp.flowcontrol.queues import DEFAULT_FLOW, Band, FlowItem, Registry
from epp.observability.logs import Throttle
from epp.scheduling import config as sched_config
from epp.scheduling import interfaces
from epp.scheduling.interfaces import RequestOutcome

log = logging.getLogger("epp.flowcontrol")

FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
ROLE_LABEL = "llm-d.ai/role"
_PREFILL = frozenset({"prefill", "encode-prefill"})
_DECODE = frozenset({"decode", ""})
_BOTH = frozenset({"prefill-decode", "both", "encode-prefill-decode"})
DISPATCH_INTERVAL = 0.001  # llm-d's dispatch ticker
BAND_GC_TIMEOUT = 600.0  # llm-d's priorityBandGCTimeout: an idle band not configured goes
_STALE_LOG = Throttle(30.0)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Timer(Protocol):
    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        """Run `callback` at `when` on `epp.clock`'s time."""
        ...


class LoopTimer:
    """The running event loop's timers, on `epp.clock` (the loop's own monotonic clock)."""

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(max(0.0, when - clock.now()), callback)


def fairness_id(request: InferenceRequest) -> str:
    """The request's flow: its fairness-ID header (llm-d's name, then GIE's), else its agent
    identity (llm-d's `agent-identity` plugin, when configured: epp.api.agent_identity), else
    `default-flow`, as llm-d's director derives it (also llm-d's `fairness_id` metric label)."""
    found = _fairness_header(request.headers)
    if found:
        return found
    agent = request.attributes.get(agent_identity.ATTRIBUTE)
    return agent if isinstance(agent, str) and agent else DEFAULT_FLOW


def fairness_of(headers: Mapping[str, str]) -> str:
    """`fairness_id` from the headers alone (a request that failed before it was parsed)."""
    return _fairness_header(headers) or DEFAULT_FLOW


def _fairness_header(headers: Mapping[str, str]) -> str:
    for name in FAIRNESS_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return ""


class FlowController:
    def __init__(
        self,
        config: FlowControlConfig,
        detector: interfaces.SaturationDetector,
        pool: Callable[[], Sequence[Endpoint]],
        *,
        timer: Timer | None = None,
        pool_name: str = "standalone",
    ) -> None:
        self.config = config
        self.detector = detector
        self._pool = pool
        self.timer: Timer = timer or LoopTimer()
        self.pool_name = pool_name
        self.registry = Registry(config.max_bytes, config.max_requests)
        for priority in sorted({0, *config.bands}):
            self._add_band(priority, static=True)
        self.stats = fc_metrics.Stats()
        self.closed = False
        self._seq = 0
        self._ticker: Cancellable | None = None
        # The regime: whether the pool was empty at the last look, and since when.
        self.pool_empty = False
        self._regime_since = -math.inf
        # The last cycle's view, for metrics and /debug.
        self.saturations: dict[str, float] = {}
        self.stale = 0
        self.halted = ""  # "", "saturated", "stale-metrics", "no-endpoints"
        self._partition_of: object = None
        self._stages: list[tuple[str, list[Endpoint]]] = []
        self._ceilings: list[float] = []
        self._gc_at = clock.now() + 60.0
        self._stale_count: Callable[[Sequence[Endpoint]], int] | None = getattr(detector, "stale_count", None)
        # In-flight eviction: the wait before the next decision is how long the freed capacity
        # takes to show in the detector's signal (llm-d derives it the same way).
        self.reclaimer: Reclaimer | None = None
        if config.enable_eviction:
            if detector.type == "concurrency-detector":
                grace = 0.01  # epp's own bookings: visible at the stream's end
            else:  # a scrape (50 ms), its staleness window, the engine's abort
                grace = 0.05 + float(getattr(detector, "staleness", 0.2)) + 0.25
            self.reclaimer = Reclaimer(grace)

    # ---- the request path ---------------------------------------------------------------------

    async def admit(
        self,
        request: InferenceRequest,
        size: int,
        *,
        labels: tuple[str, str] = ("", ""),
        on_hold: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """Return once `request` (`size` body bytes) may be scheduled; raise its HTTP answer if
        it is shed. `on_hold(max_wait)` is awaited once if it has to wait (the ext-proc layer
        extends the gateway's message timeout); `labels` are its (model, target model) labels."""
        now = clock.now()
        flow = fairness_id(request)
        priority = request.priority
        band = self._band(priority, now)
        prio = str(priority)
        stat_labels = (self.stats.fairness_label(flow), prio, labels[0], labels[1])
        if self.closed:
            self._count(stat_labels, Outcome.REJECTED_OTHER, 0.0)
            raise http_error(Outcome.EVICTED_OTHER, pool_empty=self.pool_empty)
        if not self.registry.fits(band, size):
            refused = (
                Outcome.REJECTED_NO_ENDPOINTS if not self._observe_pool(now) else Outcome.REJECTED_CAPACITY
            )
            self._count(stat_labels, refused, 0.0)
            raise http_error(refused, pool_empty=self.pool_empty)
        if self.registry.len == 0 and self._may_dispatch(band, flow, now):
            self._count(stat_labels, Outcome.DISPATCHED, 0.0)
            self._dispatched(band, flow, 0.0, now)
            return
        loop = asyncio.get_running_loop()
        self._seq += 1
        item = FlowItem(
            request,
            flow,
            priority,
            size,
            now,
            self.config.default_request_ttl,
            self._seq,
            loop.create_future(),
        )
        item.labels = stat_labels
        self.registry.add(band, item)
        self.stats.enqueued(stat_labels, size)
        self._arm(item)
        self._cycle()
        try:
            if not item.future.done():
                self._tick_soon()
                if on_hold is not None:
                    await on_hold(self.max_wait)
            outcome: Outcome = await item.future
        except asyncio.CancelledError:
            if item.queue is not None:  # the client left while queued
                self._leave(item, Outcome.EVICTED_CONTEXT_CANCELLED, clock.now())
            raise
        if outcome is not Outcome.DISPATCHED:
            raise http_error(outcome, pool_empty=self.pool_empty, ttl=self._budget_of(outcome))

    @property
    def max_wait(self) -> float:
        """The longest a request may be held (0: no limit)."""
        ttl, empty_ttl = self.config.default_request_ttl, self.config.no_endpoint_request_ttl
        return max(ttl, empty_ttl) if ttl > 0 and empty_ttl > 0 else 0.0

    def track(self, priority: int, evict: Callable[[], bool]) -> InFlight | None:
        """A dispatched request started (eviction on: None otherwise); `evict()` cuts its
        stream, True if that was possible. `untrack` when its stream ends."""
        if self.reclaimer is None:
            return None
        return self.reclaimer.track(priority, clock.now(), evict)

    def untrack(self, entry: InFlight) -> None:
        assert self.reclaimer is not None
        self.reclaimer.untrack(entry, clock.now())

    def started(self, request: InferenceRequest) -> None:
        """A dispatched request was routed: its flow holds one more in flight (fair-share)."""
        band = self.registry.bands.get(request.priority)
        if band is not None and isinstance(band.fairness, FairShare):
            band.fairness.started(band, fairness_id(request))

    def completed(self, request: InferenceRequest, outcome: RequestOutcome) -> None:
        """A routed request's stream ended (the Director's response-complete): programs count
        its tokens (program-aware-fairness), its flow holds one less in flight (fair-share)."""
        band = self.registry.bands.get(request.priority)
        if band is not None and isinstance(band.fairness, ProgramAware):
            band.fairness.completed(fairness_id(request), request, outcome)
        elif band is not None and isinstance(band.fairness, FairShare):
            band.fairness.finished(band, fairness_id(request))

    def close(self) -> None:
        """Stop: every queued request is answered 503 `rejected-shutting-down`, as is every later one."""
        self.closed = True
        now = clock.now()
        for item in list(self.registry.items()):
            self._leave(item, Outcome.EVICTED_OTHER, now)
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def register_metrics(self) -> None:
        """Export this controller's series on the process's /metrics (serving only)."""
        fc_metrics.COLLECTOR.add(self)

    def unregister_metrics(self) -> None:
        fc_metrics.COLLECTOR.discard(self)

    # ---- dispatch -----------------------------------------------------------------------------

    def _may_dispatch(self, band: Band, flow: str, now: float) -> bool:
        """Whether `flow`'s request of `band` would dispatch in a cycle now (queues empty): its
        ceiling and every higher band's are above the saturation (and fair-share lets it)."""
        saturation, ceilings = self._gates(now)
        for i, other in enumerate(self.registry.ordered):
            if saturation >= ceilings[i]:
                self._halt(saturation)
                return False
            if other is band:
                self.halted = ""
                if isinstance(band.fairness, FairShare):
                    return band.fairness.admits(band, flow, saturation, ceilings[i])
                return True
        return False  # not reached: the band is registered

    def _cycle(self) -> bool:
        """One dispatch cycle; True if a request went."""
        t0 = time.perf_counter()
        now = clock.now()
        try:
            saturation, ceilings = self._gates(now)
            for i, band in enumerate(self.registry.ordered):
                if saturation >= ceilings[i]:
                    self._halt(saturation)
                    if self.reclaimer is not None:
                        self._maybe_reclaim(saturation, ceilings, i)
                    return False
                if band.len == 0:
                    continue
                fairness = band.fairness
                if isinstance(fairness, FairShare):
                    queue = fairness.pick_gated(band, saturation, ceilings[i])
                    if queue is None:  # only tenants over their share wait: lower bands too
                        self._halt(saturation)
                        return False
                else:
                    queue = fairness.pick(band)
                head = queue.head() if queue is not None else None
                if head is None:
                    continue
                self.halted = ""
                self._leave(head, Outcome.DISPATCHED, now)
                return True
            self.halted = ""
            return False
        finally:
            self.stats.cycles.observe(time.perf_counter() - t0)

    def _maybe_reclaim(self, saturation: float, ceilings: list[float], start: int) -> None:
        """Dispatch stopped at band `start`: cut sheddable requests in flight for the first band
        from there that waits and ranks above them (`eviction.py`)."""
        reclaimer = self.reclaimer
        assert reclaimer is not None
        now = clock.now()
        if not reclaimer.gate_open(now):
            return
        victim = reclaimer.victim_priority()
        if victim is None:
            return
        bands = self.registry.ordered
        for j in range(start, len(bands)):
            band = bands[j]
            if band.priority <= victim:
                return
            # A zero ceiling never opens whatever is freed; an open band needs nothing cut.
            if ceilings[j] <= 0 or saturation < ceilings[j] or band.len == 0:
                continue
            reclaimer.reclaim(saturation, ceilings[j], band.priority, now)
            return

    def _gates(self, now: float) -> tuple[float, list[float]]:
        """(effective saturation, each band's ceiling) now."""
        pool = self._observe_pool(now)
        saturation = self._saturation(pool)
        n = len(self.registry.ordered)
        ceilings = self._ceilings
        if len(ceilings) != n:
            ceilings = self._ceilings = [1.0] * n
        else:
            for i in range(n):
                ceilings[i] = 1.0
        self.config.usage_limit.compute(saturation, self.registry.priorities, ceilings)
        return saturation, ceilings

    def _observe_pool(self, now: float) -> Sequence[Endpoint]:
        pool = self._pool()
        empty = not pool
        if empty != self.pool_empty:
            self.pool_empty = empty
            self._regime_since = now
            for item in self.registry.items():  # each budget starts afresh
                self._arm(item)
        return pool

    def _saturation(self, pool: Sequence[Endpoint]) -> float:
        if pool is not self._partition_of:
            self._partition_of = pool
            self._stages = _stages(pool)
        detector = self.detector
        saturations = self.saturations
        effective = -1.0
        for stage, endpoints in self._stages:
            value = detector.saturation(endpoints)
            saturations[stage] = value
            effective = max(effective, value)
        if effective < 0:  # no endpoint of any stage: an empty pool reads as saturated
            effective = detector.saturation(())
        saturations["effective"] = effective
        return effective

    def _halt(self, saturation: float) -> None:
        """Dispatch is held back: record why (scrape trouble or load) for metrics and /debug."""
        if self.pool_empty:
            self.halted, self.stale = "no-endpoints", 0
            return
        pool = self._partition_of
        assert isinstance(pool, list | tuple)
        self.stale = self._stale_count(pool) if self._stale_count is not None else 0
        if self.stale and self.stale == len(pool):
            self.halted = "stale-metrics"
            _STALE_LOG.log(
                log,
                logging.WARNING,
                "flow control: dispatch halted because every endpoint's metrics are stale (%d of %d): "
                "check the model servers' metrics scraping, this is not overload",
                self.stale,
                len(pool),
            )
        else:
            self.halted = "saturated"

    def _tick_soon(self) -> None:
        if self._ticker is None and not self.closed:
            self._ticker = self.timer.call_at(clock.now() + DISPATCH_INTERVAL, self._tick)

    def _tick(self) -> None:
        self._ticker = None
        if self.registry.len:
            self._cycle()
        if self.registry.len:
            self._tick_soon()

    # ---- leaving the queue --------------------------------------------------------------------

    def _leave(self, item: FlowItem, outcome: Outcome, now: float) -> None:
        """`item` leaves flow control with `outcome`: out of its queue and counts, its timer
        stopped, its waiter woken."""
        band = item.queue.band if item.queue is not None else self.registry.bands.get(item.priority)
        if item.queue is not None:
            self.registry.remove(item, now)
            self.stats.dequeued(item.labels, item.size)
        if item.timer is not None:
            item.timer.cancel()
            item.timer = None
        wait = now - item.enqueued
        self._count(item.labels, outcome, wait)
        if outcome is Outcome.DISPATCHED and band is not None:
            self._dispatched(band, item.flow, wait, now)
        if not item.future.done():
            item.future.set_result(outcome)

    def _count(self, labels: tuple[str, str, str, str], outcome: Outcome, wait: float) -> None:
        reason = None
        if outcome is not Outcome.DISPATCHED and outcome is not Outcome.EVICTED_CONTEXT_CANCELLED:
            reason = http_error(outcome, pool_empty=self.pool_empty).headers.popitem()[1]
        flow, prio, model, target = labels
        self.stats.finished((flow, prio, outcome.value, model, target), outcome.value, wait, reason)

    def _dispatched(self, band: Band, flow: str, wait: float, now: float) -> None:
        if isinstance(band.fairness, ProgramAware):
            band.fairness.dispatched(flow, wait, now)

    # ---- expiry -------------------------------------------------------------------------------

    def _deadline(self, item: FlowItem) -> tuple[float, Outcome]:
        """When `item` expires in the current regime, and as what."""
        config = self.config
        ttl, empty_ttl = item.ttl, config.no_endpoint_request_ttl
        backstop = item.enqueued + max(ttl, empty_ttl) if ttl > 0 and empty_ttl > 0 else math.inf
        budget, outcome = (
            (empty_ttl, Outcome.EVICTED_NO_ENDPOINTS) if self.pool_empty else (ttl, Outcome.EVICTED_TTL)
        )
        if budget <= 0:
            return backstop, outcome
        return min(max(item.enqueued, self._regime_since) + budget, backstop), outcome

    def _arm(self, item: FlowItem) -> None:
        if item.timer is not None:
            item.timer.cancel()
        deadline, _ = self._deadline(item)
        item.timer = (
            None if math.isinf(deadline) else self.timer.call_at(deadline, lambda: self._expire(item))
        )

    def _expire(self, item: FlowItem) -> None:
        item.timer = None
        if item.queue is None:
            return
        now = clock.now()
        self._observe_pool(now)  # the regime now, not at the last cycle
        deadline, outcome = self._deadline(item)
        if now + 1e-9 >= deadline:
            self._leave(item, outcome, now)
        elif item.timer is None:
            self._arm(item)

    def _budget_of(self, outcome: Outcome) -> float:
        config = self.config
        return (
            config.no_endpoint_request_ttl
            if outcome is Outcome.EVICTED_NO_ENDPOINTS
            else config.default_request_ttl
        )

    # ---- bands --------------------------------------------------------------------------------

    def _band(self, priority: int, now: float) -> Band:
        band = self.registry.bands.get(priority)
        if band is None:
            band = self._add_band(priority, static=False)
        if now >= self._gc_at:
            self._gc_bands(now)
        return band

    def _add_band(self, priority: int, *, static: bool) -> Band:
        spec = self.config.bands.get(priority) or self.config.template(priority)
        band = Band(
            priority,
            max_bytes=spec.max_bytes,
            max_requests=spec.max_requests,
            fairness=spec.fairness,
            ordering=spec.ordering,
            static=static,
        )
        band.idle_since = clock.now()
        self.registry.add_band(band)
        return band

    def _gc_bands(self, now: float) -> None:
        """Bands made for a priority the configuration does not list go once idle for 10 min."""
        self._gc_at = now + 60.0
        for band in list(self.registry.ordered):
            if not band.static and band.len == 0 and now - band.idle_since >= BAND_GC_TIMEOUT:
                self.registry.drop_band(band.priority)

    # ---- /debug -------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The state behind /debug/flow-control."""
        return debug.snapshot(self)


def _stages(pool: Sequence[Endpoint]) -> list[tuple[str, list[Endpoint]]]:
    """The pool split by llm-d's role label: prefill and decode (both-role endpoints in each,
    unlabelled ones are decode, encode-only and unknown roles in neither), empty stages left out."""
    if not any(ROLE_LABEL in ep.spec.labels for ep in pool):
        return [("decode", list(pool))] if pool else []
    prefill: list[Endpoint] = []
    decode: list[Endpoint] = []
    for ep in pool:
        role = ep.spec.labels.get(ROLE_LABEL, "")
        if role in _PREFILL or role in _BOTH:
            prefill.append(ep)
        if role in _DECODE or role in _BOTH:
            decode.append(ep)
    return [(name, eps) for name, eps in (("prefill", prefill), ("decode", decode)) if eps]


def dispatch_reads_scrapes(flow: FlowController | None) -> bool:
    """Whether flow control dispatches on the pods' scraped figures: its saturation detector reads
    /metrics (utilization-detector), not epp's own bookings (concurrency-detector; a detector that
    does not say is taken to read them). The scraper then reads every busy pod at the base
    interval: with the booked pace (epp.datastore.pacing) llm-d's flow-control configuration
    dispatched later under overload (docs/bench/fleet-cost.md#booked-pace)."""
    return flow is not None and bool(getattr(flow.detector, "reads_scrapes", True))


def from_scheduler_config(
    config: sched_config.SchedulerConfig,
    pool: Callable[[], Sequence[Endpoint]],
    *,
    timer: Timer | None = None,
    pool_name: str = "standalone",
) -> tuple[interfaces.SaturationDetector, FlowController | None, list[str]]:
    """The admission a loaded configuration asks for: (the saturation detector, a flow controller
    or None when the `flowControl` feature gate is off, warnings for the log). The one way
    `epp serve` and `epp bench` build flow control; raises ConfigError with the line."""
    assert config.flow_control is not None
    setup = fc_config.build(config.flow_control, config.plugins, config.saturation_detector)
    if setup.config is None:
        return setup.detector, None, setup.warnings
    controller = FlowController(setup.config, setup.detector, pool, timer=timer, pool_name=pool_name)
    return setup.detector, controller, setup.warnings
