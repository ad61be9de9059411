"""The endpoint datastore: every model-server endpoint epp may route to, and what is known of it.

An endpoint is one serving port of one pod (a data-parallel rank when a pod has several ports).
Sources (standalone list/file, the Kubernetes operator) *replace* their whole set of endpoints
with `Datastore.sync(source, specs)`; the datastore keeps the `Endpoint` objects alive across
syncs so that scraped metrics and in-flight counters survive a reload that does not change them.

Scheduling reads endpoints through `Datastore.candidates()`, which returns only endpoints that are
routable: known to a source and not excluded by failing scrapes. Degrade, never black out: when
every endpoint is excluded (every /metrics hung or failing at once, which says more about the
metrics path than about the servers), `candidates()` returns them all, to be scored on what is
still known (their last metrics, epp's in-flight counts, the KV index), rather than answering 503
for the whole pool; `degraded` is True meanwhile. The request path counts each such pick
(`epp_routing_degraded_total`, via `pick_candidates`), and the switch in and out is logged.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from epp import clock
from epp.observability import metrics

log = logging.getLogger(__name__)

DEGRADED_LOG_EVERY_S = 30.0
"""Entering degraded routing is logged at most this often (a flapping metrics path would flood)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LatencyTotals:
    """What a vLLM pod has spent on its requests, from the `_sum` and `_count` of three of its
    histograms (cumulative since it started): the latency scorers learn each pod's per-token time,
    the mean decode time and its time to first token from their growth between two scrapes
    (`epp.scheduling.plugins.metrics_learning`), from every request the pod served, where a
    response read through epp is one request in many."""

    token_seconds: float  # vllm:inter_token_latency_seconds_sum
    tokens: float  # vllm:inter_token_latency_seconds_count
    decode_seconds: float  # vllm:request_decode_time_seconds_sum (first token -> finished)
    decodes: float  # vllm:request_decode_time_seconds_count
    ttft_seconds: float = 0.0  # vllm:time_to_first_token_seconds_sum (arrival -> first token)
    ttfts: float = 0.0  # vllm:time_to_first_token_seconds_count (0 with the sum: not on the page)


@dataclasses.dataclass(slots=True)
class ModelServerMetrics:
    """The latest scrape of one endpoint's /metrics (vLLM names in comments)."""

    waiting: int = 0  # vllm:num_requests_waiting
    running: int = 0  # vllm:num_requests_running
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    block_size: int = 0  # vllm:cache_config_info{block_size}
    num_gpu_blocks: int = 0  # vllm:cache_config_info{num_gpu_blocks}
    max_lora: int = 0  # vllm:lora_requests_info{max_lora}
    running_loras: frozenset[str] = frozenset()  # {running_lora_adapters}
    waiting_loras: frozenset[str] = frozenset()  # {waiting_lora_adapters}
    updated_at: float = 0.0  # clock.now() of the last successful scrape; 0 = never
    # Seconds past the base interval the scraper chose to wait before the next scrape (an idle
    # endpoint's pace, or a back-off while epp's loop runs late: epp.datastore.pacing). Staleness
    # checks forgive that much age: figures are not stale for being read as often as planned.
    grace: float = 0.0
    # vllm:request_success_total summed over its series (a counter); None when the page has none.
    # Traffic-share estimation (epp/scheduling/plugins/traffic_share.py) reads its growth.
    requests_total: float | None = None
    # vLLM's decode-latency histograms' sums and counts; None when the page lacks either.
    latency: LatencyTotals | None = None
    # An engine config's custom scalar metrics (llm-d's `customMetrics`): endpoint attribute -> value.
    custom: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointSpec:
    """What a source says about an endpoint: identity and address, nothing measured."""

    name: str  # "<pod>-rank-<n>" from Kubernetes, or "host:port" from a static list
    address: str  # IP or host name
    port: int
    rank: int = 0  # data-parallel rank (index of the port on the pod)
    pod: str = ""  # pod name; "" for static endpoints
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    metrics_port: int | None = None  # None: scrape `port`
    model: str = ""  # the base model served, when the source says ("" = unknown): seeds KV block keys
    kv_events: str | None = None  # its KV-event publisher, "tcp://host:port"; None = epp's default
    kv_replay: str | None = None  # that publisher's replay (ROUTER) endpoint, when enabled
    # Kubernetes (and llm-d's file discovery): the pod's namespace, its spec.hostname and its
    # node's address (status.hostIP); "" when the source does not say.
    namespace: str = ""
    hostname: str = ""
    node_address: str = ""

    @property
    def hostport(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


@dataclasses.dataclass(slots=True, eq=False)
class Endpoint:
    """A routable endpoint. Identity is the object (eq=False): plugins key per-endpoint state on it."""

    spec: EndpointSpec
    hostport: str  # the value Envoy receives, "ip:port"
    metrics: ModelServerMetrics = dataclasses.field(default_factory=ModelServerMetrics)
    # epp's own accounting, booked at pick time and released when the request's stream ends.
    inflight_requests: int = 0
    inflight_tokens: int = 0
    # Prompt tokens of the requests booked here whose answer's first byte has not come back: the
    # prefill work epp sent that the pod has not finished (concurrency-detector's maxPrefillTokens).
    prefill_tokens: int = 0
    # Prompt tokens (estimated) of every request booked on it: what a KV-event publisher's silence
    # is measured against (epp.kvcache.ingest).
    routed_tokens: int = 0
    # Scrape health: consecutive failures; `excluded` once they reach the configured bound.
    scrape_failures: int = 0
    excluded: bool = False
    # max_model_len per model the server lists on GET /v1/models (vLLM's model cards), set by the
    # scraper through `Datastore.set_model_limits`; empty until read, or when the server lists none.
    model_limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Values data-layer sources other than the metrics scrape attach (llm-d's endpoint attributes),
    # by (attribute, producer), e.g. ("GPUUtilization", "dcgm-extractor") from DCGM's exporter.
    attributes: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)
    # Called at each booking by whoever paces this endpoint's scrapes (the scraper, or a worker's
    # follower of the supervisor's scrapes): an idle endpoint is scraped less often until epp
    # sends it work (epp.datastore.pacing).
    on_book: Callable[[Endpoint], None] | None = dataclasses.field(default=None, repr=False)
    # `spec.name`, kept as a field: the scorers read it ~17 times per endpoint per request, and
    # a property costs ~37 ns more per read than a slot here: ~0.6 us of the ~8 us an endpoint
    # cost to score at 1,000 pods (docs/bench/fleet-cost.md#per-request-pods). A spec is replaced
    # only by one of the same name (`Datastore.sync`), so it never goes stale.
    name: str = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.name = self.spec.name

    def book(self, prompt_tokens: int) -> None:
        self.inflight_requests += 1
        self.inflight_tokens += prompt_tokens
        self.prefill_tokens += prompt_tokens
        self.routed_tokens += prompt_tokens
        if self.on_book is not None:
            self.on_book(self)

    def prefilled(self, prompt_tokens: int) -> None:
        """A request booked here has its first byte back (or ended without one)."""
        self.prefill_tokens = max(0, self.prefill_tokens - prompt_tokens)

    def release(self, prompt_tokens: int) -> None:
        # Never below zero: a release after an endpoint was re-created must not go negative.
        self.inflight_requests = max(0, self.inflight_requests - 1)
        self.inflight_tokens = max(0, self.inflight_tokens - prompt_tokens)

    def metrics_age(self, now: float | None = None) -> float:
        """Seconds since the last successful scrape (inf if never scraped)."""
        if not self.metrics.updated_at:
            return float("inf")
        return (clock.now() if now is None else now) - self.metrics.updated_at


Listener = Callable[[list[Endpoint], list[Endpoint]], None]
"""Called after each change with (added, removed) endpoints, both empty when only an endpoint's
metadata changed (labels, model, KV-event addresses); e.g. to start/stop KV-event feeds."""

ReadmitListener = Callable[[Endpoint], None]
"""Called when an endpoint excluded for failing scrapes answers again and is back in rotation."""


class Datastore:
    """All endpoints, keyed by name, merged from any number of sources."""

    def __init__(self) -> None:
        self._by_source: dict[str, dict[str, Endpoint]] = {}
        self._all: dict[str, Endpoint] = {}
        self._by_hostport: dict[str, Endpoint] = {}
        self._candidates: list[Endpoint] = []
        # The one base model every endpoint that names one serves (None: none named, or several).
        # A LoRA adapter's requests are tokenized with it when the adapter has no tokenizer.
        self.base_model: str | None = None
        self._listeners: list[Listener] = []
        self._readmit_listeners: list[ReadmitListener] = []
        self.synced = False  # True once any source has reported (readiness)
        self._unavailable: dict[str, str] = {}  # source -> why it offers no endpoints now
        # model -> the largest max_model_len any endpoint lists for it; None: to be recomputed.
        self._model_limits: dict[str, int] | None = None
        # Not excluded; `_candidates` is this, or every endpoint while `degraded`.
        self._routable: list[Endpoint] = []
        self.degraded = False
        self._degraded_logged_at = -DEGRADED_LOG_EVERY_S

    def set_unavailable(self, source: str, reason: str | None) -> None:
        """Record why `source` offers no endpoints now (a deleted pool), or clear it with None; the
        503 answered for an empty pool names it."""
        if reason is None:
            self._unavailable.pop(source, None)
        else:
            self._unavailable[source] = reason

    def unavailable_reason(self) -> str:
        """Why the sources offer no endpoints, as far as they said ("" if none did)."""
        return "; ".join(self._unavailable.values())

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def subscribe_readmitted(self, listener: ReadmitListener) -> None:
        """Hear of each endpoint readmitted after failing scrapes (`readmitted`)."""
        self._readmit_listeners.append(listener)

    def readmitted(self, endpoint: Endpoint) -> None:
        """`endpoint`, excluded for failing scrapes, answers again (its scraper readmitted it and
        refreshed the candidates). A pod down that long has most likely restarted, with an empty
        cache: the KV-event ingester listens, to drop the old process's blocks before the next
        request is routed (epp.kvcache.ingest.KVEventIngester.pod_back)."""
        for listener in self._readmit_listeners:
            listener(endpoint)

    def sync(self, source: str, specs: Iterable[EndpointSpec]) -> tuple[list[Endpoint], list[Endpoint]]:
        """Replace everything `source` provides with `specs`. Returns (added, removed)."""
        old = self._by_source.get(source, {})
        new: dict[str, Endpoint] = {}
        added: list[Endpoint] = []
        changed = False
        for spec in specs:
            prev = old.get(spec.name)
            if prev is not None and prev.spec == spec:
                new[spec.name] = prev
                continue
            if prev is not None and (prev.spec.address, prev.spec.port) == (spec.address, spec.port):
                # Labels or metadata changed only: keep the measured state (listeners still hear of
                # it: a new KV-event publisher or model must reach the subscriptions).
                prev.spec = spec
                new[spec.name] = prev
                changed = True
                continue
            ep = Endpoint(spec=spec, hostport=spec.hostport)
            new[spec.name] = ep
            added.append(ep)
        removed = [ep for name, ep in old.items() if new.get(name) is not ep]
        self._by_source[source] = new
        self.synced = True
        self._rebuild()
        if added or removed or changed:
            for listener in self._listeners:
                listener(added, removed)
        return added, removed

    def set_model_limits(self, endpoint: Endpoint, limits: Mapping[str, int]) -> None:
        """Record what `endpoint` lists on /v1/models (model -> max_model_len)."""
        if limits != endpoint.model_limits:
            endpoint.model_limits = dict(limits)
            self._model_limits = None

    def max_model_len(self, model: str) -> int | None:
        """The largest max_model_len the endpoints list for `model` (None if none lists it). The
        largest: during a rollout that changes it, a request one pod refuses another may serve, and
        refusing is only epp's to do where every pod would. A request naming no model ("": vLLM
        serves its first model) gets the largest any endpoint lists for any model."""
        limits = self._model_limits
        if limits is None:
            limits = {}
            for ep in self._all.values():
                for name, length in ep.model_limits.items():
                    if length > limits.get(name, 0):
                        limits[name] = length
            self._model_limits = limits
        if not model:
            return max(limits.values(), default=None)
        return limits.get(model)

    def _rebuild(self) -> None:
        self._model_limits = None
        self._all = {}
        for eps in self._by_source.values():
            self._all.update(eps)
        self._by_hostport = {ep.hostport: ep for ep in self._all.values()}
        models = {ep.spec.model for ep in self._all.values() if ep.spec.model}
        self.base_model = next(iter(models)) if len(models) == 1 else None
        self.refresh_candidates()

    def refresh_candidates(self) -> None:
        """Recompute the routable list; call after an endpoint's `excluded` flag changes."""
        routable = [ep for ep in self._all.values() if not ep.excluded]
        degraded = bool(self._all) and not routable
        self._routable = routable
        self._candidates = routable if not degraded else list(self._all.values())
        if degraded != self.degraded:
            self.degraded = degraded
            metrics.routing_degraded.set(1 if degraded else 0)
            now = time.monotonic()
            if not degraded:
                log.info("endpoint metrics are back: routing on fresh metrics again")
            elif now - self._degraded_logged_at >= DEGRADED_LOG_EVERY_S:
                self._degraded_logged_at = now
                log.warning(
                    "every endpoint (%d) is excluded for failing or stale metrics: routing to all of "
                    "them on their last metrics, in-flight load and the KV index rather than refusing",
                    len(self._all),
                )

    def endpoints(self) -> list[Endpoint]:
        """Every known endpoint, routable or not (scrapers use this)."""
        return list(self._all.values())

    def candidates(self) -> list[Endpoint]:
        """Routable endpoints, or every endpoint while `degraded`. The list is shared: callers
        must not mutate it."""
        return self._candidates

    def routable(self) -> list[Endpoint]:
        """Endpoints not excluded (empty while `degraded`): readiness and pool gauges count these."""
        return self._routable

    def pick_candidates(self, subset_ips: Collection[str] | None = None) -> list[Endpoint]:
        """The endpoints a request may go to, counting a degraded pick: `candidates()`, within
        `subset_ips` (the proxy's subset hint) when given. When the hint names only excluded
        endpoints, those are returned (degraded) rather than none."""
        candidates = self._candidates
        degraded = self.degraded
        if subset_ips is not None:
            candidates = [ep for ep in candidates if ep.spec.address in subset_ips]
            if not candidates and not degraded:
                candidates = [ep for ep in self._all.values() if ep.spec.address in subset_ips]
                degraded = bool(candidates)
        if degraded:
            metrics.routing_degraded_total.inc()
        return candidates

    def get(self, name: str) -> Endpoint | None:
        return self._all.get(name)

    def by_hostport(self, hostport: str) -> Endpoint | None:
        return self._by_hostport.get(hostport)
