"""Poll every endpoint's /metrics and keep `Endpoint.metrics` and routability up to date.

One loop task per endpoint (GIE's per-pod collector), all sharing one `httpget.HttpGetter`, so
each endpoint keeps one keep-alive connection instead of a handshake per 50 ms poll (and a GET
costs ~2-3x less CPU than through aiohttp's client: epp.datastore.httpget). Loops
follow the datastore: `start()` reconciles with `Datastore.endpoints()` and subscribes to its
listener, which starts a loop for each added endpoint and cancels the loop of each removed one.
Loops scrape on a shared grid of ticks (`pacing.SCRAPES_PER_TICK` endpoints to a tick, the ticks evenly
spaced within the interval), so that up to eight endpoints cost the loop one wake-up per interval,
not eight, and hundreds added at once (a file load, an operator resync) do not all scrape in the
same tick.

Per scrape (`http://<address>:<metrics_port or port>/metrics`, re-read from the endpoint's spec
each time, since a label-only resync may change the metrics port in place):

- success: a new `ModelServerMetrics` (`updated_at = time.monotonic()`) replaces the old one,
  `scrape_failures` resets, and an excluded endpoint is readmitted (one INFO "endpoint
  recovered"), the candidate list refreshed and the datastore's readmission listeners told
  (`Datastore.readmitted`: the KV index drops a restarted pod's old blocks).
- failure (connection error, timeout, non-200, oversized or unparsable body): the old metrics
  are kept, `scrape_failures` and `epp_metrics_scrape_errors_total` go up; the endpoint is
  excluded (one WARNING with the reason) when failures reach `failure_threshold`, or earlier
  when its metrics have become older than `staleness` (a hung server whose scrapes each take the
  whole timeout would otherwise need threshold x timeout to be excluded).

Every `models_interval` (30 s), and at once when an excluded endpoint comes back (a restarted
server may serve another context length), the loop also reads the server's model cards from
`GET /v1/models` on its serving port (`epp.datastore.model_cards`): each model's `max_model_len`,
which epp enforces as vLLM does (`epp.api.context_length`). A server without that page, or cards
without `max_model_len`, leaves the endpoint's limits as they were (empty: epp then falls back to
the tokenizer config); a failed read is retried after 5 s.

Staleness is measured from the start of the attempt that failed, not from when its failure was
seen: epp's own event loop, when it stalls (a burst of work, a GC pause), delays both the answer
and the timeout, and a 2.4 s stall must not make a healthy server look 2.4 s stale. For the same
reason a scrape that timed out well after its timeout was due (the loop ran late, so the server
may well have answered in time) is inconclusive: it is counted
(`epp_metrics_scrapes_inconclusive_total`) but neither fails the endpoint nor excludes it.

Staleness is exposed, not hidden: `Endpoint.metrics_age()` gives the seconds since the last
good scrape (inf if never), and `MetricsScraper.is_stale(endpoint)` compares it with the
configured bound, for scorers or debug endpoints that want to discount old numbers. An endpoint
never scraped successfully counts its age from the start of its loop, so the staleness rule does
not exclude a new endpoint on its first failed scrape.

Gauges kept: `epp_endpoint_excluded{endpoint}` (1 while excluded; the series is removed with the
endpoint) and `inference_pool_ready_pods{name=<pool>}` = `len(datastore.routable())` after every
change this module sees or makes (every endpoint excluded: 0, though epp then routes degraded to
all of them; see `epp.datastore.endpoints`). While started, the scraper is also the source of GIE's pool
averages (`inference_pool_average_*`, `inference_pool_per_pod_queue_size`), computed from the
endpoints' latest scrapes whenever /metrics is read (`collectors.PoolCollector`).

Only the series epp reads. vLLM serves two metrics handlers: prometheus-fastapi-instrumentator's
at `/metrics`, which writes the whole registry whatever the query, and prometheus_client's own
ASGI app mounted under it, reached as `/metrics/`, which honours prometheus_client's `name[]`
filter. So with the default path an endpoint of a vLLM-named engine is asked for
`/metrics/?name%5B%5D=...`, the 13 series `promtext` reads (`promtext.series_read`): on vLLM 0.32
a 3.1 KB page instead of 55 KB, which costs the server's API process ~0.7 ms of CPU a scrape
instead of 4.3-5.4, and epp ~145 us instead of 300-400 with the parse (scripts/capture_vllm_metrics.py
measures both; docs/bench/fleet-cost.md#filtered-scrapes). The figures parsed are the same. A server
that answers that form with anything but 200, or with a page holding none of the series, is read at
the plain path from then on (one INFO line), until it is excluded and comes back.

Cost note: at GIE's default 50 ms interval every endpoint costs 20 GETs and parses a second; a
page equal to the endpoint's last one is not parsed again (~1 us to compare; the last page is kept
per endpoint). The interval is paced (epp.datastore.pacing): an endpoint idle at its last scrape,
on which epp has booked nothing, is read every `idle_interval`, one whose load at its last scrape
was all epp's own bookings, none waiting, every `booked_interval`, each until a booking ends the
pause (`Endpoint.on_book`, or a worker's word through the supervisor), and every interval grows
while epp's event loop runs late. With `--workers N` the supervisor scrapes once for the pod.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import logging
import ssl
import time
import urllib.parse
from collections.abc import Callable

import msgspec

from epp import tasks
from epp.datastore import httpget, model_cards, pacing, promtext
from epp.datastore.endpoints import Datastore, Endpoint, ModelServerMetrics
from epp.datastore.engines import DEFAULT_ENGINES, EngineMapping, Engines
from epp.datastore.httpget import TLSFiles
from epp.observability import collectors, metrics

log = logging.getLogger(__name__)

# A vLLM page is tens of KB; anything near this is not a metrics page, and reading it unbounded
# would let a misconfigured target exhaust memory.
MAX_BODY_BYTES = 8 * 1024 * 1024

# prometheus_client compresses when the client accepts gzip: that is CPU on the model server and
# on epp 20 times a second to save bytes on a cluster network. Ask for none.
_HEADERS = {"Accept-Encoding": "identity", "Accept": "text/plain", "User-Agent": "epp"}


# A timeout that fires this much later than it was due says the event loop was late, not the server.
LATE_TIMEOUT_S = 0.5

# vLLM's decode-latency histograms' sums and counts (`ModelServerMetrics.latency`) are read from a
# page at most this often: finding them costs about half of what the other series do together
# (~21 against ~39 us on vLLM 0.32's 54 KB page: their families lie far down it), and their readers
# learn from growth over seconds, not 50 ms. Between reads a scrape carries the last totals over.
LATENCY_READ_S = 0.5

MODELS_RETRY_S = 5.0


class _ScrapeError(Exception):
    """A failed scrape with a human-readable reason."""


class _StatusError(_ScrapeError):
    """The server answered, with a status other than 200."""


@functools.lru_cache(maxsize=64)  # per scrape otherwise: ~10 us to join and quote the names
def filtered_path(path: str, engine: EngineMapping) -> str | None:
    """The `name[]`-filtered form of the metrics path for `engine`, or None where none is asked:
    a path other than the default, or an engine that is not vLLM's (other servers' handlers have
    not been checked). See the module docstring."""
    if path != "/metrics" or not promtext.is_vllm(engine):
        return None
    return "/metrics/?" + "&".join(
        "name%5B%5D=" + urllib.parse.quote(n, safe=":") for n in promtext.series_read(engine)
    )


def _settle(pause: asyncio.Future[bool], booked: bool) -> None:
    if not pause.done():
        pause.set_result(booked)


def from_flags(
    args: argparse.Namespace,
    datastore: Datastore,
    pool_name: str,
    on_update: Callable[[Endpoint], None] | None = None,
    engines: Engines = DEFAULT_ENGINES,
) -> MetricsScraper:
    """The scraper GIE's flags describe (`--refresh-metrics-interval`, `--model-server-metrics-*`,
    ...), naming metrics by `engines` (the `--*-metric` flags' overrides applied by the caller)."""
    return MetricsScraper(
        datastore,
        interval=args.refresh_metrics_interval,
        idle_interval=args.idle_metrics_interval,
        booked_interval=args.booked_metrics_interval,
        staleness=args.metrics_staleness_threshold,
        failure_threshold=args.scrape_failure_threshold,
        pool_name=pool_name,
        path=args.model_server_metrics_path.strip('"') or "/metrics",
        scheme=args.model_server_metrics_scheme,
        port=args.model_server_metrics_port or None,
        # GIE's default is to skip verification (model servers' certificates are often self-signed).
        insecure_skip_verify=args.model_server_metrics_https_insecure_skip_verify is not False,
        engines=engines,
        on_update=on_update,
    )


class MetricsScraper:
    """Keeps every datastore endpoint's metrics fresh; see the module docstring."""

    def __init__(
        self,
        datastore: Datastore,
        *,
        pool_name: str,
        interval: float = 0.05,
        idle_interval: float = 0.0,
        booked_interval: float = 0.0,
        max_interval: float | None = None,
        timeout: float | None = None,
        failure_threshold: int = 3,
        staleness: float = 2.0,
        path: str = "/metrics",
        models_interval: float = 30.0,
        models_path: str = "/v1/models",
        scheme: str = "http",
        port: int | None = None,
        insecure_skip_verify: bool = False,
        tls: TLSFiles | None = None,
        engines: Engines = DEFAULT_ENGINES,
        on_update: Callable[[Endpoint], None] | None = None,
    ) -> None:
        """`timeout` (per request) defaults to max(20 x interval, 0.5 s): 1 s at the default 50 ms.

        `idle_interval`, `booked_interval` and `max_interval` pace the scrapes
        (epp.datastore.pacing): an idle endpoint is scraped every `idle_interval`, one whose load
        is all epp's own bookings every `booked_interval` (each 0, the default here, or <=
        `interval`: at `interval` like any other), and while the event loop cannot keep the
        timers the interval grows up to `max_interval` (default half of `staleness`, so a paced
        endpoint never looks stale).

        GIE's `--model-server-metrics-*` flags: `scheme` http or https (the model-card reads use it
        too: a server with TLS serves both on its own port), `port` the metrics port of every
        endpoint whose entry names none (None: its serving port), `insecure_skip_verify` accepts
        any server certificate over https (GIE's default is to verify); `tls` (llm-d's
        metrics-data-source `caCertPath`, `clientCertPath`, `clientKeyPath`) the CA to verify with
        and a client certificate to present. `engines` names each endpoint's metrics by its
        engine (`epp.datastore.engines`; vLLM's by default). `on_update` is called after every
        scrape of an endpoint and every change of its model limits (epp.workers passes what
        changed on to the workers)."""
        if interval <= 0 or failure_threshold < 1 or staleness <= 0:
            raise ValueError("interval and staleness must be > 0 and failure_threshold >= 1")
        if scheme not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, got {scheme!r}")
        self._scheme = scheme
        self._metrics_port = port or None
        self._ssl: ssl.SSLContext | None = None
        if scheme == "https":
            self._ssl = (tls or TLSFiles()).context(verify=not insecure_skip_verify)
        self._engines = engines
        self._datastore = datastore
        self._pool_name = pool_name
        self.interval = interval
        self.pace = pacing.Pace(
            interval,
            idle_interval=min(idle_interval, staleness / 2),
            booked_interval=min(booked_interval, staleness / 2),
            max_interval=staleness / 2 if max_interval is None else max_interval,
        )
        self.timeout = timeout if timeout is not None else max(interval * 20, 0.5)
        self.failure_threshold = failure_threshold
        self.staleness = staleness
        self._path = path if path.startswith("/") else "/" + path
        self.models_interval = models_interval
        self._models_path = models_path if models_path.startswith("/") else "/" + models_path
        self._http: httpget.HttpGetter | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None  # the loop start() ran on
        self._loops: dict[Endpoint, asyncio.Task[None]] = {}
        # Loops of removed endpoints, cancelled but perhaps still unwinding: stop() waits for
        # them too, so none is left using the session it closes.
        self._retired: set[asyncio.Task[None]] = set()
        # Each endpoint's last page and what it parsed to: an idle server's page changes about
        # once a second (its process_* series), so most scrapes at 50 ms find the same bytes.
        self._pages: dict[Endpoint, tuple[bytes, EngineMapping, ModelServerMetrics]] = {}
        self._latency_read: dict[Endpoint, float] = {}  # time.monotonic() of each one's last read
        # Endpoints that refused the filtered path (`filtered_path`): read at the plain one.
        self._unfiltered: set[Endpoint] = set()
        self._subscribed = False
        self._on_update = on_update
        # The idle or booked pause of each endpoint whose loop is in one: what ends it early.
        self._pauses: dict[Endpoint, asyncio.Future[bool]] = {}
        self._paced: set[Endpoint] = set()  # endpoints on the idle pace now
        self._booked: set[Endpoint] = set()  # endpoints on the booked pace now
        self._probe: asyncio.Task[None] | None = None  # the pace's measure of the loop's lag
        self._grid = pacing.Grid(interval)  # each loop's slot among the ticks

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the session and start a loop for every endpoint now in the datastore."""
        if self._http is not None:
            return
        self._event_loop = asyncio.get_running_loop()
        self._http = httpget.HttpGetter(timeout=self.timeout, headers=_HEADERS, ssl_context=self._ssl)
        if not self._subscribed:
            self._datastore.subscribe(self._on_change)
            self._subscribed = True
        collectors.pool_collector.add(self._pool_snapshot)
        self._probe = tasks.create_guarded_task(self.pace.probe(), name="metrics pace probe", logger=log)
        self._apply_change(self._datastore.endpoints(), [])
        log.info(
            "scraping /metrics of %d endpoints every %gs (timeout %gs, exclusion after %d failures or %gs)",
            len(self._loops),
            self.interval,
            self.timeout,
            self.failure_threshold,
            self.staleness,
        )

    async def stop(self) -> None:
        """Cancel every loop, wait for them to end, close the connections."""
        http, self._http = self._http, None
        collectors.pool_collector.discard(self._pool_snapshot)
        loops = [*self._loops.values(), *self._retired, *([self._probe] if self._probe else [])]
        self._probe = None
        self._loops.clear()
        await tasks.cancel_and_wait(loops)
        self._paced.clear()
        self._booked.clear()
        metrics.idle_endpoints.set(0)
        metrics.booked_endpoints.set(0)
        if http is not None:
            http.close()

    async def __aenter__(self) -> MetricsScraper:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- queries ---------------------------------------------------------------------------------

    def is_stale(self, endpoint: Endpoint, now: float | None = None) -> bool:
        """True if the endpoint's last good scrape is older than `staleness` (or never happened)."""
        return endpoint.metrics_age(now) > self.staleness

    def scraping(self) -> list[Endpoint]:
        """Endpoints that currently have a scrape loop."""
        return list(self._loops)

    def wake(self, ep: Endpoint) -> None:
        """epp booked work on `ep`: if its loop is in an idle or booked pause, end it
        (`Endpoint.on_book`, or a worker's word through the supervisor)."""
        pause = self._pauses.get(ep)
        if pause is not None:
            _settle(pause, True)

    def _pool_snapshot(self) -> collectors.PoolSnapshot:
        return pool_snapshot(self._pool_name, self._datastore)

    # -- loop management -------------------------------------------------------------------------

    def _on_change(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        # Runs inside Datastore.sync, so it must not raise. A sync made outside our event loop
        # (a source running in another thread) is handed over to the loop, where tasks live.
        loop = self._event_loop
        if loop is not None and not loop.is_closed():
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is not loop:
                loop.call_soon_threadsafe(self._apply_change, added, removed)
                return
        self._apply_change(added, removed)

    def _apply_change(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        # Removals first: a name re-added with a new address arrives as (new in added, old in
        # removed), and dropping the old series after creating the new one would delete the new
        # endpoint's gauge.
        for ep in removed:
            task = self._loops.pop(ep, None)
            self._pages.pop(ep, None)
            self._latency_read.pop(ep, None)
            self._unfiltered.discard(ep)
            self._paced.discard(ep)
            self._booked.discard(ep)
            metrics.idle_endpoints.set(len(self._paced))
            metrics.booked_endpoints.set(len(self._booked))
            if ep.on_book == self.wake:
                ep.on_book = None
            if task is not None:
                task.cancel()
                self._retired.add(task)
                task.add_done_callback(self._retired.discard)
                if self._http is not None:
                    spec = ep.spec
                    self._http.forget(spec.address, spec.metrics_port or self._metrics_port or spec.port)
                    self._http.forget(spec.address, spec.port)
            self._forget_series(ep)
        if self._http is not None:  # not started (or stopped): start() reconciles later
            for ep in added:
                if ep not in self._loops:
                    ep.on_book = self.wake
                    self._loops[ep] = tasks.create_guarded_task(
                        self._scrape_loop(ep), name=f"scrape {ep.name}", logger=log
                    )
        self._update_ready()

    @staticmethod
    def _forget_series(ep: Endpoint) -> None:
        # A removed endpoint's series would otherwise be exported forever (an excluded one as 1),
        # and with pods renamed at every rollout, grow without bound.
        metrics.forget_endpoint(ep.name, ep.spec.pod)

    def _update_ready(self) -> None:
        metrics.ready_endpoints.labels(name=self._pool_name).set(len(self._datastore.routable()))

    async def _scrape_loop(self, ep: Endpoint) -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        metrics.endpoint_excluded.labels(endpoint=ep.name).set(1 if ep.excluded else 0)
        grid = self._grid
        slot = grid.slot(len(self._loops))
        next_at = grid.at(loop.time(), slot, self.interval)
        await asyncio.sleep(next_at - loop.time())
        cards_at = next_at
        while True:
            was_excluded = ep.excluded
            await self._scrape(ep, started)
            if loop.time() >= cards_at or (was_excluded and not ep.excluded):
                read = await self._read_model_cards(ep)
                cards_at = loop.time() + (
                    self.models_interval if read else min(self.models_interval, MODELS_RETRY_S)
                )
            # Fixed rate, like a ticker; after an overrun (a slow scrape) start the next one at
            # once rather than firing a burst to catch up.
            idle = self.pace.idle_interval > self.pace.current and self._is_idle(ep)
            if idle != (ep in self._paced):
                (self._paced.add if idle else self._paced.discard)(ep)
                metrics.idle_endpoints.set(len(self._paced))
            booked = not idle and self.pace.booked_interval > self.pace.current and pacing.booked(ep)
            if booked != (ep in self._booked):
                (self._booked.add if booked else self._booked.discard)(ep)
                metrics.booked_endpoints.set(len(self._booked))
            delay = self.pace.delay(idle, booked)
            due = grid.at(max(next_at + delay, loop.time()), slot, delay)
            # The wait past one interval, as planned (to the microsecond: the grid's sums carry float noise).
            ep.metrics.grace = max(0.0, round(due - next_at - self.interval, 6))
            next_at = due
            if (idle or booked) and await self._pause(ep, next_at - loop.time()):
                # A booking: the base schedule from now, its first scrape about half an interval
                # on, where what the new request does to the pod's queue shows.
                next_at = min(next_at, grid.at(loop.time() + self.pace.current / 2, slot, self.interval))
            await asyncio.sleep(next_at - loop.time())

    @staticmethod
    def _is_idle(ep: Endpoint) -> bool:
        m = ep.metrics
        return (
            m.running == 0
            and m.waiting == 0
            and ep.inflight_requests == 0
            and m.updated_at > 0
            and not ep.scrape_failures
            and not ep.excluded
        )

    async def _pause(self, ep: Endpoint, delay: float) -> bool:
        """Wait `delay` unless a booking wakes the endpoint first (then True)."""
        loop = asyncio.get_running_loop()
        pause: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(delay, _settle, pause, False)
        self._pauses[ep] = pause
        try:
            return await pause
        finally:
            timer.cancel()
            del self._pauses[ep]

    # -- one scrape ------------------------------------------------------------------------------

    async def _scrape(self, ep: Endpoint, started: float) -> None:
        attempted = time.monotonic()
        try:
            engine = self._engines.for_labels(ep.spec.labels)
            path = None if ep in self._unfiltered else filtered_path(self._path, engine)
            if path is None:
                result = await self._read(ep, engine, self._path, attempted)
            else:
                try:
                    result = await self._read(ep, engine, path, attempted)
                except (_StatusError, promtext.PromTextError) as e:
                    result = await self._read(ep, engine, self._path, attempted)
                    self._unfiltered.add(ep)
                    log.info(
                        "%s answered the filtered metrics path with %s: reading %s whole from now on",
                        ep.name,
                        self._reason(e),
                        self._path,
                    )
        # Anything a scrape raises is a failed scrape, never a dead loop: the parser raises only
        # PromTextError by design, but a garbage page must not find an exception we did not list.
        # (CancelledError is a BaseException and passes through.)
        except Exception as e:
            late = time.monotonic() - attempted - self.timeout
            if isinstance(e, TimeoutError) and late > LATE_TIMEOUT_S:
                # The loop ran late: the answer may have been waiting; nothing learnt of the server.
                metrics.scrapes_inconclusive_total.inc()
                log.debug("scrape of %s timed out %.1fs late (event loop lag): not counted", ep.name, late)
                return
            self._failed(ep, self._reason(e), started, attempted)
        else:
            self._succeeded(ep, result)

    def _reason(self, e: Exception) -> str:
        if isinstance(e, _ScrapeError):
            return str(e)
        if isinstance(e, promtext.PromTextError):
            return f"unparsable metrics: {e}"
        if isinstance(e, TimeoutError):  # asyncio.timeout's has no message
            return f"no answer within {self.timeout:g}s"
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    async def _read(
        self, ep: Endpoint, engine: EngineMapping, path: str, attempted: float
    ) -> ModelServerMetrics:
        """One GET of `path` and what it parses to (the last parse, where the page is the same)."""
        spec = ep.spec
        port = spec.metrics_port or self._metrics_port or spec.port
        body = await self._get(spec.address, port, path, MAX_BODY_BYTES)
        last = self._pages.get(ep)
        if last is not None and last[0] == body and last[1] is engine:
            return dataclasses.replace(last[2])  # the same page: ~1 us to compare, ~40 to parse
        read = self._latency_read.get(ep)
        latency = read is None or attempted - read >= LATENCY_READ_S
        result = promtext.parse(body, engine, latency=latency)
        if latency:
            self._latency_read[ep] = attempted
        elif last is not None:
            result.latency = last[2].latency
        self._pages[ep] = (body, engine, dataclasses.replace(result))
        return result

    async def _get(self, address: str, port: int, path: str, limit: int) -> bytes:
        assert self._http is not None  # loops run only between start() and stop()
        try:
            status, body = await self._http.get(address, port, path, limit)
        except httpget.HttpError as e:
            raise _ScrapeError(str(e)) from None
        if status != 200:
            raise _StatusError(f"HTTP {status}")
        return body

    async def _read_model_cards(self, ep: Endpoint) -> bool:
        """Read the endpoint's /v1/models into its model limits; False when the read failed."""
        try:
            spec = ep.spec
            body = await self._get(spec.address, spec.port, self._models_path, model_cards.MAX_BODY_BYTES)
            limits = model_cards.context_lengths(body)
        except Exception as e:  # any failure: keep what was known, try again soon
            reason = f"invalid model list: {e}" if isinstance(e, msgspec.MsgspecError) else self._reason(e)
            log.debug("reading %s of %s failed: %s", self._models_path, ep.name, reason)
            return False
        if limits != ep.model_limits:
            log.info(
                "endpoint %s serves %s",
                ep.name,
                ", ".join(f"{m} (max_model_len {n})" for m, n in limits.items())
                or "no model with a max_model_len",
            )
            self._datastore.set_model_limits(ep, limits)
            if self._on_update is not None:
                self._on_update(ep)
        return True

    def _succeeded(self, ep: Endpoint, result: ModelServerMetrics) -> None:
        result.updated_at = time.monotonic()
        ep.metrics = result
        ep.scrape_failures = 0
        if self._on_update is not None:
            self._on_update(ep)
        if ep.excluded:
            ep.excluded = False
            self._unfiltered.discard(ep)  # perhaps another server now: ask for the filtered page again
            log.info("endpoint recovered: %s (%s), back in rotation", ep.name, ep.hostport)
            metrics.endpoint_excluded.labels(endpoint=ep.name).set(0)
            self._datastore.refresh_candidates()
            self._datastore.readmitted(ep)
            self._update_ready()

    def _failed(self, ep: Endpoint, reason: str, started: float, attempted: float) -> None:
        ep.scrape_failures += 1
        if self._on_update is not None:
            self._on_update(ep)
        metrics.scrape_errors_total.labels(endpoint=ep.name).inc()
        metrics.datalayer_poll_errors.labels(metrics.METRICS_DATA_SOURCE).inc()
        log.debug("scrape of %s failed (%d in a row): %s", ep.name, ep.scrape_failures, reason)
        if ep.excluded:
            return
        # Age when this attempt was made: how stale the server let its metrics get, whatever the
        # event loop did while the attempt ran.
        age = attempted - (ep.metrics.updated_at or started)
        if ep.scrape_failures >= self.failure_threshold or age > self.staleness:
            ep.excluded = True
            log.warning(
                "endpoint excluded from routing: %s (%s) after %d failed scrapes, metrics %.1fs old: %s",
                ep.name,
                ep.hostport,
                ep.scrape_failures,
                age,
                reason,
            )
            metrics.endpoint_excluded.labels(endpoint=ep.name).set(1)
            self._datastore.refresh_candidates()
            self._update_ready()


def pool_snapshot(pool_name: str, datastore: Datastore) -> collectors.PoolSnapshot:
    """The pool's load as last scraped. Averages count routable endpoints with a good scrape
    (GIE averages the pods whose metrics are fresh); an excluded endpoint's last figures would
    describe a server epp no longer sends to."""
    routable = {id(ep) for ep in datastore.routable()}
    return collectors.PoolSnapshot(
        pool_name,
        [
            collectors.PodLoad(
                ep.name,
                ep.metrics.waiting,
                ep.metrics.running,
                ep.metrics.kv_usage,
                id(ep) in routable and ep.metrics.updated_at > 0,
            )
            for ep in datastore.endpoints()
        ],
    )
