"""What `epp serve` does differently as worker i of a supervisor (`epp serve --workers N`).

The supervisor starts each worker as `python -m epp serve <the same flags>` with three variables:
EPP_WORKER_INDEX, EPP_WORKER_SOCKETS (the name of the pod's abstract Unix sockets) and
EPP_WORKER_CONTROL_FD (its end of a socket pair); nothing on the filesystem, which may be read-only
without a writable /tmp (GIE's chart runs epp so). The worker then
- serves ext-proc on the shared port with SO_REUSEPORT (the kernel spreads connections),
- does not serve the health port (the supervisor answers for the pod) nor the metrics port: its
  /metrics and debug endpoints are on an abstract Unix socket that answers its own user only,
  behind the supervisor's,
- reads the supervisor's KV index (a memfd it inherits, EPP_WORKER_KV_INDEX_FD) instead of
  consuming the KV events itself (epp.workers.shared_kv; bind mode allows one process only, see
  epp.workers.supervisor),
- does not scrape the model servers: it tells the supervisor its endpoints and applies the
  supervisor's scrapes (epp.workers.shared_metrics),
- follows the supervisor's Lease instead of campaigning itself,
- reports on the control socket: "started" once its servers are up, then its readiness; and
  shuts down (drains) when the socket closes, so a supervisor that is killed takes its workers
  with it.
Messages are JSON lines: worker -> supervisor {"started": true} / {"ready": bool} /
{"endpoints": [...]} / {"routed_tokens": {...}}; supervisor -> worker {"leading": bool}, the
scrapes ({"metrics": ...}, {"limits": ...}, {"fresh": ...}: epp.workers.shared_metrics) and the
KV index's pod table ({"kv_pods": ...}: epp.workers.shared_kv).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import struct
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from epp import tasks
from epp.datastore.endpoints import Datastore
from epp.kvcache.index import IndexReader
from epp.observability import exposition, metrics
from epp.workers.shared_kv import ReaderStats, RoutedTokens
from epp.workers.shared_metrics import MetricsFollower

log = logging.getLogger("epp.workers")

INDEX_ENV = "EPP_WORKER_INDEX"
SOCKETS_ENV = "EPP_WORKER_SOCKETS"
CONTROL_ENV = "EPP_WORKER_CONTROL_FD"
COUNT_ENV = "EPP_WORKERS"
SUPERVISOR_ENV = "EPP_SUPERVISOR_PID"
TLS_ENV = "EPP_WORKER_TLS"
"""The pod's self-signed key and certificate (PEM, JSON), when --secure-serving has no --cert-path."""
KV_INDEX_ENV = "EPP_WORKER_KV_INDEX_FD"
"""The supervisor's KV index (a memfd this worker inherited), when KV events are on."""
CONTROL_LINE_LIMIT = 64 * 1024 * 1024
"""Longest control message (a line): a full scrape of 1,000 endpoints is ~150 KB."""
WORKER_METRICS_PATH = "/worker/metrics"
"""The worker's registry, for the supervisor only (on the worker's Unix socket)."""


def http_socket(name: str, index: int) -> str:
    """Worker `index`'s HTTP socket: Linux's abstract namespace (a leading NUL), no file."""
    return f"\0{name}-{index}.http"


@web.middleware
async def _own_user_only(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """An abstract socket has no file permissions: any process in the network namespace can
    connect. Only this user's (the supervisor's) are answered, so the worker's endpoints are no
    way around the supervisor's --metrics-endpoint-auth."""
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    if sock is None:
        raise web.HTTPForbidden()
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.getuid():
        raise web.HTTPForbidden()
    return await handler(request)


class Lease(Protocol):
    """What `epp serve` needs of a Lease: k8s.leader.LeaderElector's, or the supervisor's."""

    @property
    def leading(self) -> bool: ...

    async def wait_changed(self) -> object: ...

    async def start(self) -> None: ...

    async def stop(self, *, release: bool = ...) -> None: ...


class LeaseFromSupervisor:
    """The supervisor's Lease as this worker sees it: `LeaderElector`'s interface, no campaign."""

    def __init__(self) -> None:
        self.leading = False
        self._changed = asyncio.Event()

    def set(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            self._changed.set()

    async def wait_changed(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    async def start(self) -> None:
        return None

    async def stop(self, *, release: bool = False) -> None:
        return None  # the supervisor holds (and releases) the Lease


class WorkerRole:
    def __init__(self, index: int, sockets: str, control_fd: int, workers: int) -> None:
        self.index = index
        self.workers = workers
        self.sockets = sockets
        self.tls_pair: tuple[bytes, bytes] | None = None
        self._control_fd = control_fd
        self.lease: LeaseFromSupervisor | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._unsent: list[bytes] = []  # written once the control socket is open
        self.follower: MetricsFollower | None = None
        fd = os.environ.get(KV_INDEX_ENV)
        self.kv_index_fd = int(fd) if fd else None
        self.kv_reader: IndexReader | None = None
        self._kv_stats: ReaderStats | None = None
        self._routed: RoutedTokens | None = None

    def adjust(self, args: argparse.Namespace) -> None:
        """The flags as this worker applies them (after the config's kvEventsConfig is read)."""
        pair = os.environ.get(TLS_ENV)
        if pair is not None and args.secure_serving and not args.cert_path:
            key, cert = json.loads(pair)  # the supervisor's one self-signed certificate for the pod
            self.tls_pair = (key.encode(), cert.encode())
        if args.tokenizer_workers is None:  # the pod's cores are shared by the workers' pools
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
            args.tokenizer_workers = max(1, min(4, cores // max(1, self.workers)))
        if args.ha_enable_leader_election:
            self.lease = LeaseFromSupervisor()

    async def start_http(self, app: web.Application) -> web.AppRunner:
        async def worker_metrics(_: web.Request) -> web.Response:
            return web.Response(
                body=await exposition.render(metrics.REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
            )

        app.router.add_get(WORKER_METRICS_PATH, worker_metrics)
        app.middlewares.insert(0, _own_user_only)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        # A crashed predecessor's abstract socket went with its process.
        await web.UnixSite(runner, http_socket(self.sockets, self.index)).start()
        return runner

    def metrics_follower(self, datastore: Datastore, pool_name: str) -> MetricsFollower:
        """What stands in for this worker's scraper: the supervisor's scrapes, applied."""
        self.follower = MetricsFollower(datastore, pool_name, self.send)
        if self.kv_reader is not None and self._kv_stats is None:
            self._kv_stats = ReaderStats(self.kv_reader)
            self._kv_stats.start()
            self._routed = RoutedTokens(datastore, self.send)
            self._routed.start()
        return self.follower

    def send(self, message: dict[str, Any]) -> None:
        """Write `message` to the supervisor (held until the control socket is open)."""
        line = json.dumps(message).encode() + b"\n"
        if self._writer is None:
            self._unsent.append(line)
        elif not self._writer.is_closing():
            self._writer.write(line)

    async def connect(self, on_lost: Callable[[], None]) -> None:
        """Open the control socket; `on_lost` runs when the supervisor is gone."""
        sock = socket.socket(fileno=self._control_fd)
        reader, self._writer = await asyncio.open_unix_connection(sock=sock, limit=CONTROL_LINE_LIMIT)
        for line in self._unsent:
            self._writer.write(line)
        self._unsent.clear()

        async def read() -> None:
            try:
                while line := await reader.readline():
                    try:
                        message = json.loads(line)
                    except ValueError:
                        continue
                    if not isinstance(message, dict):
                        continue
                    if "leading" in message and self.lease is not None:
                        self.lease.set(bool(message["leading"]))
                    elif "kv_pods" in message:
                        if self.kv_reader is not None:
                            self.kv_reader.set_pods(message["kv_pods"])
                    elif self.follower is not None:
                        self.follower.apply(message)
            except ConnectionError:
                pass
            log.warning("worker %d: the supervisor is gone; stopping", self.index)
            on_lost()

        self._reader_task = tasks.create_guarded_task(read(), name="worker control", logger=log)

    async def report(self, **message: bool) -> None:
        if self._writer is None or self._writer.is_closing():
            return
        self._writer.write(json.dumps(message).encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()

    async def close(self) -> None:
        if self._kv_stats is not None:
            self._kv_stats.stop()
        if self._routed is not None:
            await self._routed.stop()
        if self._reader_task is not None:
            await tasks.cancel_and_wait([self._reader_task])
        if self._writer is not None:
            self._writer.close()


def from_environment() -> WorkerRole | None:
    """This process's role if a supervisor started it, else None (a single-process epp)."""
    index = os.environ.get(INDEX_ENV)
    if index is None:
        return None
    role = WorkerRole(
        int(index),
        os.environ[SOCKETS_ENV],
        int(os.environ[CONTROL_ENV]),
        int(os.environ.get(COUNT_ENV, "1")),
    )
    _die_with(int(os.environ.get(SUPERVISOR_ENV, "0")))
    _tag_logs(role.index)
    return role


class _WorkerField(logging.Filter):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "worker"):
            record.worker = self.index
        return True


def _tag_logs(index: int) -> None:
    """Every JSON log line of this worker carries `"worker": i` (the workers share one stderr)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerField(index))


def _die_with(supervisor: int) -> None:
    """SIGKILL this worker when the supervisor dies, however it dies (PR_SET_PDEATHSIG, Linux): a
    pod whose supervisor is gone must not keep serving from orphans. The closed control socket is
    the slower fallback (it drains first)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if supervisor and os.getppid() != supervisor:  # it died before prctl took effect
        os._exit(1)
