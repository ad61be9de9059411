"""The supervisor: the parent process of `epp serve --workers N` (N > 1).

It does no routing. It
- checks the ext-proc port is free, then starts N workers (`python -m epp serve`, the same flags)
  that all listen on it with SO_REUSEPORT: the kernel hands each new connection from the gateway
  to one of them (so the spread is per connection; a gateway opens one or more per worker thread),
- serves the pod's gRPC health port: SERVING while not draining and at least one worker is ready
  (a worker being restarted does not take the pod out of its Service),
- serves the metrics port: /metrics folds every worker's registry into one (epp.workers.merge)
  and adds per-worker series (epp_worker_*); every other path (the debug endpoints) is passed to
  one worker, the lowest live one or the one the `X-Epp-Worker` request header names,
- scrapes every model server once for the pod, and passes the results to the workers
  (epp.workers.shared_metrics), which list their endpoints to it,
- consumes the KV events once for the pod (connect mode): one ingester, one index in a memfd
  every worker maps and matches against (epp.workers.shared_kv). Bind mode runs one process
  (`--workers auto` falls back to 1, an explicit N > 1 is a startup error): one process only
  can bind the port, and the bound socket's door (which pod may publish, checked per connection
  against the sender's address) would not survive a forwarder between vLLM and the workers,
- with --ha-enable-leader-election, campaigns for the Lease once for the pod and tells the workers,
- restarts a worker that exits (logged, counted in epp_worker_restarts_total, backoff 1 s doubling
  to 30 s); a worker that fails before it ever started serving stops the pod with its exit code
  (a bad flag or config fails every worker the same way),
- on SIGTERM: health NOT_SERVING at once, the Lease released, the signal passed to every worker
  (each keeps serving new streams for --drain-delay, then drains its own for --drain-timeout;
  SIGINT is passed on as SIGINT, which skips the delay: epp.drain), and exits when they have; a
  second signal is passed on too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from epp import drain, garbage, tasks
from epp.datastore import scraper
from epp.datastore.endpoints import Datastore
from epp.datastore.engines import DEFAULT_ENGINES, with_default_overrides
from epp.extproc import server as extproc_server
from epp.extproc import tls
from epp.flags.compat import metric_flag_specs
from epp.k8s import from_flags as k8s_from_flags
from epp.k8s import leader as k8s_leader
from epp.k8s import metricsauth as k8s_metricsauth
from epp.observability import exposition, metrics, metrics_tls
from epp.observability import http as obs_http
from epp.workers import merge, shared_kv, shared_metrics, worker

log = logging.getLogger("epp.workers")

WORKER_HEADER = "X-Epp-Worker"
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_S = 60.0
"""A worker that ran this long before exiting restarts after BACKOFF_FIRST_S again."""
SCRAPE_TIMEOUT_S = 5.0
MAX_UNREAD_BYTES = 16 * 1024 * 1024
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "host", "content-length"})


@dataclass
class Slot:
    """Worker i across its restarts."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    writer: asyncio.StreamWriter | None = None
    started: bool = False
    ready: bool = False
    restarts: int = 0
    families: list[Metric] = field(default_factory=list)
    """Its last scraped families (kept as the floor of the pod's counters when it exits)."""
    resync: bool = False
    """Scrape results were not written to it (its socket's buffer was full): send all again."""


def check_port_free(host: str, port: int) -> None:
    """The workers bind with SO_REUSEPORT, which would quietly share a port another epp holds."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


class Supervisor:
    def __init__(self, args: argparse.Namespace, argv: list[str], workers: int) -> None:
        self.args = args
        self.command = [sys.executable, "-m", "epp", *argv]
        self.slots = [Slot(i) for i in range(workers)]
        # The workers' abstract Unix socket names: nothing is written to the filesystem.
        self.sockets = f"epp-{os.getpid()}-{secrets.token_hex(6)}"
        self.stopping = False
        self.signum = signal.SIGTERM  # what the workers get: the pod's first signal (epp.drain)
        self.failed: int | None = None
        self._stop = asyncio.Event()
        self.retired = merge.Retired()
        # The supervisor's own series: process_*, and the scrapes it makes for the pod.
        self.registry = metrics.REGISTRY
        pool = args.pool_name or "standalone"
        # The flags' scrape (a worker whose config's metrics source says more scrapes for itself).
        overrides = metric_flag_specs(args)
        engines = with_default_overrides(DEFAULT_ENGINES, overrides) if overrides else DEFAULT_ENGINES
        self.hub = shared_metrics.MetricsHub(
            lambda datastore, on_update: scraper.from_flags(args, datastore, pool, on_update, engines)
        )
        # Connect mode only: bind mode runs one process (epp.serve._worker_count).
        self.kv = shared_kv.KVHub(args, self.hub.datastore) if args.kv_events == "connect" else None
        self._sessions: dict[int, aiohttp.ClientSession] = {}
        self._health_changed = asyncio.Event()
        self.lease: k8s_leader.LeaderElector | None = None
        self._tls_pair: str | None = None
        self._leading = False

    # --- the workers ----------------------------------------------------------------------------

    async def _spawn(self, slot: Slot) -> asyncio.StreamReader:
        ours, theirs = socket.socketpair()
        env = dict(
            os.environ,
            **{
                worker.INDEX_ENV: str(slot.index),
                worker.SOCKETS_ENV: self.sockets,
                worker.CONTROL_ENV: str(theirs.fileno()),
                worker.COUNT_ENV: str(len(self.slots)),
                worker.SUPERVISOR_ENV: str(os.getpid()),
            },
        )
        if self._tls_pair is not None:
            env[worker.TLS_ENV] = self._tls_pair
        fds = [theirs.fileno()]
        if self.kv is not None:
            env[worker.KV_INDEX_ENV] = str(self.kv.fd)
            fds.append(self.kv.fd)
        try:
            # Its own session: a terminal's Ctrl-C reaches the supervisor only, which passes it on
            # once (twice would end the workers' drain at once).
            slot.proc = await asyncio.create_subprocess_exec(
                *self.command, env=env, pass_fds=fds, start_new_session=True
            )
        except BaseException:
            ours.close()  # no worker to talk to
            raise
        finally:
            theirs.close()
        reader, slot.writer = await asyncio.open_unix_connection(sock=ours, limit=worker.CONTROL_LINE_LIMIT)
        slot.started = slot.ready = False
        if self.lease is not None:
            await self._send(slot, leading=self._leading)
        log.info("worker %d started", slot.index, extra={"worker": slot.index, "pid": slot.proc.pid})
        return reader

    async def _send(self, slot: Slot, **message: bool) -> None:
        if slot.writer is None or slot.writer.is_closing():
            return
        slot.writer.write(json.dumps(message).encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await slot.writer.drain()

    def _write(self, slot: Slot, message: dict[str, Any]) -> bool:
        """Write without waiting; False (and nothing written) while the worker's socket holds more
        than MAX_UNREAD_BYTES it has not read (a worker stuck for seconds)."""
        writer = slot.writer
        if writer is None or writer.is_closing():
            return False
        if writer.transport.get_write_buffer_size() > MAX_UNREAD_BYTES:
            return False
        writer.write(json.dumps(message).encode() + b"\n")
        return True

    def _snapshot(self) -> list[dict[str, Any]]:
        return self.hub.snapshot() + (self.kv.snapshot() if self.kv is not None else [])

    def _broadcast(self, message: dict[str, Any]) -> None:
        for slot in self.slots:
            if not slot.started:
                continue
            if slot.resync:
                slot.resync = not all(self._write(slot, m) for m in self._snapshot())
                if slot.resync:
                    continue
            if not self._write(slot, message):
                slot.resync = True

    async def _follow(self, slot: Slot, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while line := await reader.readline():
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(message, dict):
                    continue
                if message.get("started"):
                    slot.started = True
                if "endpoints" in message:
                    slot.resync = False
                    updates = self.hub.listed(slot.index, message["endpoints"])
                    for update in updates + (self.kv.snapshot() if self.kv is not None else []):
                        slot.resync |= not self._write(slot, update)
                if "booked" in message:
                    self.hub.booked(message["booked"])
                if "routed_tokens" in message and self.kv is not None:
                    self.kv.routed(slot.index, message["routed_tokens"])
                if "ready" in message:
                    slot.ready = bool(message["ready"])
                    self._health_changed.set()

    async def _keep(self, slot: Slot) -> None:
        """Run worker `slot.index` until the pod stops, restarting it when it exits."""
        try:
            await self._keep_running(slot)
        except Exception:
            self.failed = 1
            self._begin_stop()  # a supervisor that cannot keep a worker must not half-serve
            raise

    async def _keep_running(self, slot: Slot) -> None:
        loop = asyncio.get_running_loop()
        backoff = BACKOFF_FIRST_S
        first = True
        while not self.stopping:
            began = loop.time()
            reader = await self._spawn(slot)
            assert slot.proc is not None
            if self.stopping:  # the pod began to stop while it was starting
                slot.proc.send_signal(self.signum)
            await self._follow(slot, reader)
            code = await slot.proc.wait()
            if slot.writer is not None:
                slot.writer.close()
            slot.ready = False
            self._health_changed.set()
            self.hub.gone(slot.index)
            if slot.families:
                self.retired.add(slot.families)
                slot.families = []
            session = self._sessions.pop(slot.index, None)
            if session is not None:  # its pooled connection went with the worker
                await session.close()
            if self.stopping:
                log.info("worker %d exited (code %d)", slot.index, code, extra={"worker": slot.index})
                return
            if first and not slot.started:
                log.error("worker %d exited (code %d) before it started serving; stopping", slot.index, code)
                self.failed = code if code > 0 else 1
                self._begin_stop()
                return
            first = False
            if loop.time() - began >= STABLE_S:
                backoff = BACKOFF_FIRST_S
            slot.restarts += 1
            log.error(
                "worker %d exited (%s); restarting it in %.0fs",
                slot.index,
                f"signal {-code}" if code < 0 else f"code {code}",
                backoff,
                extra={"worker": slot.index, "restarts": slot.restarts},
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _begin_stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            self._stop.set()
            self._health_changed.set()
            return
        log.warning("second signal: the workers cut their remaining streams")
        self._signal_workers()

    def _signal_workers(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(self.signum)

    # --- metrics and debug endpoints ------------------------------------------------------------

    def _session(self, index: int) -> aiohttp.ClientSession:
        session = self._sessions.get(index)
        if session is None or session.closed:
            connector = aiohttp.UnixConnector(path=worker.http_socket(self.sockets, index))
            session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
            )
            self._sessions[index] = session
        return session

    async def _scrape(self, slot: Slot) -> None:
        if not slot.started or slot.proc is None or slot.proc.returncode is not None:
            return
        try:
            async with self._session(slot.index).get("http://worker" + worker.WORKER_METRICS_PATH) as r:
                text = await r.text()
            slot.families = await asyncio.to_thread(merge.parse, text)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            # Its last families stand in: the pod's counters must not dip.
            log.warning("worker %d: /metrics failed (%s); using its last values", slot.index, exc)

    def _per_worker(self) -> list[Metric]:
        up = GaugeMetricFamily("epp_worker_up", "1 while the worker process runs.", labels=["worker"])
        ready = GaugeMetricFamily(
            "epp_worker_ready", "1 while the worker reports ready (serves ext-proc).", labels=["worker"]
        )
        restarts = CounterMetricFamily(
            "epp_worker_restarts",
            "Times the supervisor restarted the worker after it exited.",
            labels=["worker"],
        )
        routed = CounterMetricFamily(
            "epp_worker_requests",
            "Requests routed by the worker process (inference_objective_request_total of this "
            "process; restarts from 0 with the worker).",
            labels=["worker"],
        )
        cpu = CounterMetricFamily(
            "epp_worker_cpu_seconds",
            "CPU seconds of the worker process (restarts from 0 with the worker).",
            labels=["worker"],
        )
        for slot in self.slots:
            label = [str(slot.index)]
            alive = slot.proc is not None and slot.proc.returncode is None
            up.add_metric(label, 1.0 if alive else 0.0)
            ready.add_metric(label, 1.0 if slot.ready else 0.0)
            restarts.add_metric(label, float(slot.restarts))
            if not alive:
                continue
            for family in slot.families:
                if family.name == "inference_objective_request":
                    routed.add_metric(
                        label, sum(s.value for s in family.samples if s.name.endswith("_total"))
                    )
                elif family.name == "process_cpu_seconds":
                    cpu.add_metric(label, sum(s.value for s in family.samples))
        count = GaugeMetricFamily("epp_workers", "Worker processes the supervisor keeps running.")
        count.add_metric([], float(len(self.slots)))
        return [count, up, ready, restarts, routed, cpu]

    async def _metrics(self, _: web.Request) -> web.Response:
        await asyncio.gather(*(self._scrape(slot) for slot in self.slots))
        own = await exposition.collect(self.registry)
        live = [s.families for s in self.slots if s.proc is not None and s.proc.returncode is None]
        # Parsing, folding and writing the workers' pages is the slow part (epp.observability.exposition):
        # off the loop, which also decodes the pods' KV events and scrapes for the workers.
        body = await asyncio.to_thread(merge.page, live, own, self.retired.families, self._per_worker())
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _choose(self, request: web.Request) -> Slot | None:
        wanted = request.headers.get(WORKER_HEADER)
        live = [s for s in self.slots if s.started and s.proc is not None and s.proc.returncode is None]
        if wanted is not None:
            return next((s for s in live if str(s.index) == wanted.strip()), None)
        return live[0] if live else None

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        slot = self._choose(request)
        if slot is None:
            return web.json_response({"error": "no such worker running"}, status=503)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        try:
            async with self._session(slot.index).request(
                request.method, "http://worker" + request.path_qs, headers=headers, data=body
            ) as r:
                payload = await r.read()
                out = {k: v for k, v in r.headers.items() if k.lower() not in _HOP_BY_HOP}
        except (aiohttp.ClientError, TimeoutError) as exc:
            return web.json_response({"error": f"worker {slot.index}: {exc}"}, status=502)
        out[WORKER_HEADER] = str(slot.index)
        return web.Response(status=r.status, body=payload, headers=out)

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        return app

    # --- the pod --------------------------------------------------------------------------------

    async def run(self) -> int:
        check_port_free(self.args.bind_address, self.args.grpc_port)
        return await self._run()

    async def _run(self) -> int:
        args = self.args
        if args.secure_serving and not args.cert_path:
            # One self-signed certificate for the pod, not one per worker behind the same port.
            key, cert = tls.self_signed()
            self._tls_pair = json.dumps([key.decode(), cert.decode()])
        health = extproc_server.Health()
        health_server = extproc_server.build_health_server(
            health, bind=args.bind_address, port=args.grpc_health_port
        )
        app = self.build_app()
        port_tls = metrics_tls.from_flags(args.metrics_cert_dir, args.metrics_client_ca_file)
        metrics_auth = await _metrics_auth(args, app)
        runner = await obs_http.start(
            app,
            host=args.bind_address,
            port=args.metrics_port,
            ssl_context=port_tls.context if port_tls is not None else None,
        )
        elector = _lease(args)
        self.lease = elector
        await health.set(False)  # grpc's servicer says SERVING until told otherwise
        await health_server.start()
        loop = asyncio.get_running_loop()
        for sig in drain.SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        await self.hub.start(self._broadcast)
        if self.kv is not None:
            await self.kv.start(self._broadcast)
        # Plain tasks: each returns when the pod stops; an exception is logged below.
        keepers = [asyncio.create_task(self._keep(slot), name=f"worker {slot.index}") for slot in self.slots]
        followers: list[asyncio.Task[None]] = []
        if elector is not None:
            await elector.start()
            followers.append(tasks.create_guarded_task(self._follow_lease(elector), name="lease", logger=log))
        followers.append(
            tasks.create_guarded_task(self._follow_health(health), name="pod health", logger=log)
        )
        log.info(
            "epp supervisor serving",
            extra={"workers": len(self.slots), "grpc_port": args.grpc_port, "pid": os.getpid()},
        )
        garbage.settle()  # the supervisor's loop ingests every pod's KV events for the workers
        try:
            await self._stop.wait()
        finally:
            await health.set(False)
            if elector is not None:
                await elector.stop(release=True)  # a follower pod takes over while we drain
            self._signal_workers()
            # Each worker serves through its delay and drains for --drain-timeout; then they are killed.
            delay = drain.delay_for(self.signum, args.drain_delay)
            await asyncio.wait(keepers, timeout=delay + args.drain_timeout + 10)
            for slot in self.slots:
                if slot.proc is not None and slot.proc.returncode is None:
                    log.error("worker %d did not stop; killing it", slot.index)
                    with contextlib.suppress(ProcessLookupError):
                        slot.proc.kill()
            await asyncio.wait(keepers, timeout=10)
            await tasks.cancel_and_wait([*followers, *keepers])
            await self.hub.stop()
            if self.kv is not None:
                await self.kv.stop()
            for keeper in keepers:
                if not keeper.cancelled() and keeper.exception() is not None:
                    log.error("%s failed", keeper.get_name(), exc_info=keeper.exception())
                    self.failed = self.failed or 1
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await health_server.stop(0)
            for session in self._sessions.values():
                await session.close()
            await runner.cleanup()
            if port_tls is not None:
                await port_tls.stop()
            if metrics_auth is not None:
                await metrics_auth.close()
        log.info("epp supervisor stopped")
        return self.failed or 0

    def _on_signal(self, signum: int) -> None:
        if not self.stopping:
            self.signum = signal.Signals(signum)
        self._begin_stop()

    async def _follow_health(self, health: extproc_server.Health) -> None:
        while True:
            await self._health_changed.wait()
            self._health_changed.clear()
            await health.set(not self.stopping and any(s.ready for s in self.slots))

    async def _follow_lease(self, elector: k8s_leader.LeaderElector) -> None:
        while True:
            self._leading = elector.leading
            for slot in self.slots:
                await self._send(slot, leading=self._leading)
            await elector.wait_changed()


def _lease(args: argparse.Namespace) -> k8s_leader.LeaderElector | None:
    """The pod's one campaign for the Lease (as `epp serve` alone would run it), or None when off."""
    if not args.ha_enable_leader_election:
        return None
    return k8s_from_flags.leader_elector(args, k8s_from_flags.kubernetes_source(args, Datastore()))


async def _metrics_auth(
    args: argparse.Namespace, app: web.Application
) -> k8s_metricsauth.ApiServerAuth | None:
    if not args.metrics_endpoint_auth:
        return None
    from epp.k8s import connections as k8s_connections

    auth = k8s_metricsauth.ApiServerAuth(k8s_connections.load(args.kubeconfig))
    await auth.start()
    app.middlewares.append(auth.middleware)
    return auth


async def supervise(args: argparse.Namespace, argv: list[str], workers: int) -> int:
    return await Supervisor(args, argv, workers).run()
