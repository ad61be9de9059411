"""One scrape of every model server per epp pod, whatever `--workers` is.

Each worker used to scrape every endpoint's /metrics itself, so a pod's fixed cost grew as
workers x endpoints (~0.4% of a core per endpoint and worker at the 50 ms default). Now the
supervisor scrapes (`MetricsHub`: a `MetricsScraper` over a datastore of its own) and the workers
follow (`MetricsFollower`), over the control socket each worker already has (JSON lines):

- worker -> supervisor `{"endpoints": [[name, address, port, metrics_port, pod, rank, model,
  kv_events, kv_replay, engine_labels], ...]}`: its datastore's endpoints, sent when they change
  (of the labels, the engine-type ones: they choose the metric names a page is read with). The
  supervisor scrapes the union of what its live workers listed (every worker reads the same
  sources, so they differ only for a moment), and answers a worker that (re)starts with every
  endpoint's current state.
- worker -> supervisor `{"booked": [name, ...]}`: endpoints it just booked work on while their
  last scrape showed them idle, which the supervisor may be scraping at `--idle-metrics-interval`
  (epp.datastore.pacing): the scrape comes back to the busy interval at once. Sent once per
  endpoint per heartbeat at most, batched per turn of the worker's loop.
- supervisor -> workers `{"metrics": [entry, ...]}` with the endpoints whose scrape changed
  anything a worker reads (values, exclusion, failures; an unchanged page sends nothing),
  `{"limits": [[name, {model: max_model_len}], ...]}` when a server's model cards change, and a
  heartbeat `{"fresh": t, "failing": [names]}` every 100 ms: every endpoint not failing is
  current as of `t` (time.monotonic(), one clock for all processes of a machine): scraped within
  the interval in force, or idle on its slower pace (its `grace`, which the heartbeat stands for
  here). That keeps `ModelServerMetrics.updated_at` true without a message per endpoint per
  scrape, and younger than the 200 ms a `utilization-detector` allows by default (at 250 ms an
  idle pool read as stale, so saturated, for part of every beat).
An idle pool thus costs the workers a heartbeat, and a busy one the endpoints that changed.

The supervisor decides exclusion (and logs it, once for the pod); a worker applies it as its own
scraper would (candidates refreshed, `epp_endpoint_excluded`, `inference_pool_ready_pods`). The
scrape counters (`epp_metrics_scrape_errors_total`, ...) are the supervisor's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from epp import tasks
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec, LatencyTotals, ModelServerMetrics
from epp.datastore.engines import ENGINE_LABEL, GIE_ENGINE_LABEL
from epp.datastore.scraper import MetricsScraper, pool_snapshot
from epp.observability import collectors, metrics

log = logging.getLogger("epp.workers")

HEARTBEAT_S = 0.1
SOURCE = "workers"

Entry = list[Any]
"""[name, waiting, running, kv_usage, block_size, num_gpu_blocks, max_lora, running_loras,
waiting_loras, requests_total, updated_at, excluded, scrape_failures, latency (LatencyTotals' fields
as a list, or None)]"""


ENGINE_LABELS = frozenset({ENGINE_LABEL, GIE_ENGINE_LABEL})
"""The labels the supervisor's scrape reads (the flags' scrape: llm-d's and GIE's engine type)."""


def endpoint_list(datastore: Datastore) -> list[list[Any]]:
    """What a worker tells the supervisor about its endpoints (what scraping and the KV events
    need)."""
    return [
        [
            ep.name,
            ep.spec.address,
            ep.spec.port,
            ep.spec.metrics_port,
            ep.spec.pod,
            ep.spec.rank,
            ep.spec.model,
            ep.spec.kv_events,
            ep.spec.kv_replay,
            {k: v for k, v in ep.spec.labels.items() if k in ENGINE_LABELS},
        ]
        for ep in datastore.endpoints()
    ]


def _entry(ep: Endpoint) -> Entry:
    m = ep.metrics
    return [
        ep.name,
        m.waiting,
        m.running,
        m.kv_usage,
        m.block_size,
        m.num_gpu_blocks,
        m.max_lora,
        sorted(m.running_loras),
        sorted(m.waiting_loras),
        m.requests_total,
        m.updated_at,
        ep.excluded,
        ep.scrape_failures,
        None if m.latency is None else list(dataclasses.astuple(m.latency)),
    ]


class MetricsHub:
    """The supervisor's scraper and what it last told the workers."""

    def __init__(
        self,
        scraper_factory: Callable[[Datastore, Callable[[Endpoint], None]], MetricsScraper],
        *,
        heartbeat: float = HEARTBEAT_S,
    ) -> None:
        self.heartbeat_interval = heartbeat
        self.datastore = Datastore()
        self.scraper = scraper_factory(self.datastore, self._changed)
        self._listed: dict[int, list[EndpointSpec]] = {}  # worker -> its endpoints
        self._sent: dict[str, tuple[Any, ...]] = {}  # name -> state sent, updated_at left out
        self._limits_sent: dict[str, dict[str, int]] = {}
        self._dirty: set[str] = set()
        self._limits_dirty: set[str] = set()
        self._send: Callable[[dict[str, Any]], None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, send: Callable[[dict[str, Any]], None]) -> None:
        """`send` writes a message to every started worker."""
        self._send = send
        await self.scraper.start()
        self._task = tasks.create_guarded_task(self._flush_loop(), name="metrics hub", logger=log)

    async def stop(self) -> None:
        if self._task is not None:
            await tasks.cancel_and_wait([self._task])
        await self.scraper.stop()

    def listed(self, worker: int, endpoints: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
        """Worker `worker`'s endpoints; the messages that bring it up to date."""
        specs = []
        for item in endpoints:
            name, address, port, metrics_port, pod, rank, model, kv_events, kv_replay, labels = item
            specs.append(
                EndpointSpec(
                    name=str(name),
                    address=str(address),
                    port=int(port),
                    metrics_port=metrics_port,
                    pod=str(pod),
                    rank=int(rank),
                    model=str(model),
                    kv_events=kv_events,
                    kv_replay=kv_replay,
                    labels={str(k): str(v) for k, v in labels.items()},
                )
            )
        self._listed[worker] = specs
        self._sync()
        return self.snapshot()

    def booked(self, names: Any) -> None:
        """A worker booked work on these endpoints while they looked idle (`{"booked": ...}`)."""
        if not isinstance(names, list):
            return
        for name in names:
            ep = self.datastore.get(name) if isinstance(name, str) else None
            if ep is not None:
                self.scraper.wake(ep)

    def gone(self, worker: int) -> None:
        """Worker `worker` exited: its list no longer counts."""
        if self._listed.pop(worker, None) is not None:
            self._sync()

    def _sync(self) -> None:
        union: dict[str, EndpointSpec] = {}
        for specs in self._listed.values():
            for spec in specs:
                union.setdefault(spec.name, spec)
        self.datastore.sync(SOURCE, union.values())
        present = {ep.name for ep in self.datastore.endpoints()}
        for name in [n for n in self._sent if n not in present]:
            del self._sent[name]
            self._limits_sent.pop(name, None)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every endpoint's current state (for a worker that just listed its endpoints)."""
        eps = [
            ep
            for ep in self.datastore.endpoints()
            if ep.metrics.updated_at or ep.excluded or ep.scrape_failures
        ]
        out: list[dict[str, Any]] = []
        if eps:
            out.append({"metrics": [_entry(ep) for ep in eps]})
        limits = [[ep.name, dict(ep.model_limits)] for ep in self.datastore.endpoints() if ep.model_limits]
        if limits:
            out.append({"limits": limits})
        return out

    def _changed(self, ep: Endpoint) -> None:
        self._dirty.add(ep.name)
        if ep.model_limits != self._limits_sent.get(ep.name, {}):
            self._limits_dirty.add(ep.name)

    def changes(self) -> list[dict[str, Any]]:
        """The messages for what changed since the last call (each endpoint's latest state)."""
        out: list[dict[str, Any]] = []
        entries = []
        for name in self._dirty:
            ep = self.datastore.get(name)
            if ep is None:
                continue
            entry = _entry(ep)
            state = (*entry[:10], *entry[11:])
            if self._sent.get(name) != state:
                self._sent[name] = state
                entries.append(entry)
        self._dirty.clear()
        if entries:
            out.append({"metrics": entries})
        limits = []
        for name in self._limits_dirty:
            ep = self.datastore.get(name)
            if ep is not None:
                self._limits_sent[name] = dict(ep.model_limits)
                limits.append([name, dict(ep.model_limits)])
        self._limits_dirty.clear()
        if limits:
            out.append({"limits": limits})
        return out

    def heartbeat(self) -> dict[str, Any]:
        failing = [ep.name for ep in self.datastore.endpoints() if ep.scrape_failures]
        return {"fresh": time.monotonic(), "failing": failing}

    async def _flush_loop(self) -> None:
        assert self._send is not None
        loop = asyncio.get_running_loop()
        beat_at = loop.time()
        while True:
            await asyncio.sleep(self.scraper.interval)
            for message in self.changes():
                self._send(message)
            if loop.time() >= beat_at:
                beat_at = loop.time() + self.heartbeat_interval
                self._send(self.heartbeat())


class MetricsFollower:
    """A worker's stand-in for its scraper: applies the supervisor's scrapes to its datastore.

    Started and stopped like `MetricsScraper`; `send` writes a message to the supervisor.
    """

    def __init__(self, datastore: Datastore, pool_name: str, send: Callable[[dict[str, Any]], None]) -> None:
        self._datastore = datastore
        self._pool_name = pool_name
        self._send = send
        self._started = False
        self._pending = False
        self._woken: set[str] = set()  # told the supervisor since the last heartbeat
        self._waking: list[str] = []  # to tell it at the end of this turn of the loop

    async def start(self) -> None:
        self._started = True
        self._datastore.subscribe(self._on_change)
        collectors.pool_collector.add(self._pool_snapshot)
        for ep in self._datastore.endpoints():
            metrics.endpoint_excluded.labels(endpoint=ep.name).set(1 if ep.excluded else 0)
            ep.on_book = self._on_book
        self._list()

    def _on_book(self, ep: Endpoint) -> None:
        m = ep.metrics
        if m.running or m.waiting or ep.name in self._woken or not self._started:
            return
        self._woken.add(ep.name)
        if not self._waking:
            asyncio.get_running_loop().call_soon(self._wake)
        self._waking.append(ep.name)

    def _wake(self) -> None:
        names, self._waking = self._waking, []
        if self._started and names:
            self._send({"booked": names})

    async def stop(self) -> None:
        self._started = False
        collectors.pool_collector.discard(self._pool_snapshot)

    def _on_change(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        if not self._started:
            return
        for ep in removed:
            metrics.forget_endpoint(ep.name, ep.spec.pod)
        for ep in added:
            metrics.endpoint_excluded.labels(endpoint=ep.name).set(1 if ep.excluded else 0)
            ep.on_book = self._on_book
        self._update_ready()
        if not self._pending:  # one message for a burst of changes
            self._pending = True
            asyncio.get_running_loop().call_soon(self._list)

    def _list(self) -> None:
        self._pending = False
        if self._started:
            self._send({"endpoints": endpoint_list(self._datastore)})

    def apply(self, message: dict[str, Any]) -> None:
        """One message from the supervisor (unknown keys are ignored)."""
        refresh = False
        for entry in message.get("metrics", ()):
            ep = self._datastore.get(entry[0])
            if ep is None:
                continue  # gone here meanwhile
            ep.metrics = ModelServerMetrics(
                waiting=entry[1],
                running=entry[2],
                kv_usage=entry[3],
                block_size=entry[4],
                num_gpu_blocks=entry[5],
                max_lora=entry[6],
                running_loras=frozenset(entry[7]),
                waiting_loras=frozenset(entry[8]),
                requests_total=entry[9],
                updated_at=entry[10],
                latency=None if entry[13] is None else LatencyTotals(*entry[13]),
            )
            ep.scrape_failures = entry[12]
            if ep.excluded != entry[11]:
                ep.excluded = bool(entry[11])
                metrics.endpoint_excluded.labels(endpoint=ep.name).set(1 if ep.excluded else 0)
                refresh = True
        for name, limits in message.get("limits", ()):
            ep = self._datastore.get(name)
            if ep is not None and limits != ep.model_limits:
                self._datastore.set_model_limits(ep, limits)
        if "fresh" in message:
            self._woken.clear()
            fresh = float(message["fresh"])
            failing = set(message.get("failing", ()))
            for ep in self._datastore.endpoints():
                m = ep.metrics
                if m.updated_at and m.updated_at < fresh and ep.name not in failing:
                    m.updated_at = fresh
        if refresh:
            self._datastore.refresh_candidates()
            self._update_ready()

    def _update_ready(self) -> None:
        metrics.ready_endpoints.labels(name=self._pool_name).set(len(self._datastore.routable()))

    def _pool_snapshot(self) -> collectors.PoolSnapshot:
        return pool_snapshot(self._pool_name, self._datastore)
