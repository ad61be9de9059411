"""The faults a soak injects, and the pieces between epp and the pods that it breaks.

Between epp and each pod the soak puts a /metrics proxy (`scrape_hang` makes them all hang) and a
ZMQ forwarder (`publisher_drop` closes one); `pod_kill` and `epp_sigterm` act on the processes.
`Injector` runs the schedule (`config.fault_schedule`) and records each fault's times."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import Callable

import aiohttp
import zmq
import zmq.asyncio
from aiohttp import web

from epp.bench.soak.config import Fault, SoakConfig, fault_schedule
from epp.bench.soak.pods import Pod
from epp.gateway.processes import HOST, EppServer, stable_ports


class MetricsProxy:
    """GET /metrics of one pod, forwarded; hangs (no answer) while `answering` is clear."""

    def __init__(self, upstream: str, session: aiohttp.ClientSession) -> None:
        self.upstream = upstream
        self.answering = asyncio.Event()
        self.answering.set()
        self._session = session
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, HOST, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        await self.answering.wait()  # a hung server: accepts, answers late (epp's timeout decides)
        try:
            async with self._session.get(f"http://{self.upstream}/metrics") as resp:
                return web.Response(status=resp.status, body=await resp.read(), content_type="text/plain")
        except (aiohttp.ClientError, TimeoutError) as exc:  # the pod is down: as a dead server would
            return web.Response(status=502, text=f"pod unreachable: {exc}")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


class EventsForwarder:
    """A ZMQ XSUB->XPUB forwarder between one pod's publisher and epp; `down()` closes it.

    Both sides bind: the sim's PUB connects to `upstream` (a publisher given a fixed tcp port
    connects, as vLLM's does), epp's SUB to `endpoint`. Closed, each side loses its peer and what
    the pod publishes meanwhile is gone, as when a publisher drops off the network."""

    def __init__(self, ctx: zmq.asyncio.Context, upstream: str) -> None:
        self._ctx = ctx
        self.upstream = upstream
        (self.port,) = stable_ports(1)  # bound again after each publisher_drop
        self.endpoint = f"tcp://{HOST}:{self.port}"
        self._task: asyncio.Task[None] | None = None

    def up(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def down(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        xsub = self._ctx.socket(zmq.XSUB)
        xpub = self._ctx.socket(zmq.XPUB)
        try:
            for s in (xsub, xpub):
                s.setsockopt(zmq.LINGER, 0)
            xsub.bind(self.upstream)
            xpub.bind(self.endpoint)
            poller = zmq.asyncio.Poller()
            poller.register(xsub, zmq.POLLIN)
            poller.register(xpub, zmq.POLLIN)
            while True:
                for sock, _ in await poller.poll():
                    msg = await sock.recv_multipart()
                    await (xpub if sock is xsub else xsub).send_multipart(msg)
        finally:
            xsub.close(0)
            xpub.close(0)


@dataclasses.dataclass
class Injector:
    """Starts each scheduled fault, lifts it after `fault_duration` and appends it, with its
    times, to `faults` (which the report reads)."""

    cfg: SoakConfig
    now: Callable[[], float]
    faults: list[Fault]
    pods: list[Pod]
    proxies: list[MetricsProxy]
    forwarders: list[EventsForwarder]
    epps: list[EppServer]

    async def run(self) -> None:
        cfg = self.cfg
        kills = 0
        for start, kind in fault_schedule(cfg):
            await asyncio.sleep(max(0.0, start - self.now()))
            fault = Fault(kind, self.now())
            self.faults.append(fault)
            print(f"[{fault.start:7.1f}s] fault {kind}", flush=True)
            if kind == "pod_kill":
                pod = self.pods[kills % len(self.pods)]
                kills += 1
                fault.target = pod.address
                pod.process.kill()
                await asyncio.sleep(cfg.fault_duration)
                fault.end = self.now()
                await pod.start()
                fault.ready = self.now()
            elif kind == "publisher_drop":
                i = len(self.faults) % len(self.pods)
                fault.target = self.pods[i].address
                await self.forwarders[i].down()
                await asyncio.sleep(cfg.fault_duration)
                self.forwarders[i].up()
                fault.end = self.now()
            elif kind == "scrape_hang":
                fault.target = "all pods"
                for proxy in self.proxies:
                    proxy.answering.clear()
                await asyncio.sleep(cfg.fault_duration)
                for proxy in self.proxies:
                    proxy.answering.set()
                fault.end = self.now()
            elif kind == "epp_sigterm":
                epp = self.epps[1]
                fault.target = epp.process.name
                assert epp.process.proc is not None
                epp.process.proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(epp.process.proc.wait, 30)
                await asyncio.sleep(max(0.0, cfg.fault_duration - (self.now() - fault.start)))
                fault.end = self.now()
                await asyncio.to_thread(epp.start, timeout=180.0)
                fault.ready = self.now()
            else:
                raise ValueError(f"unknown fault {kind!r}")
            print(f"[{self.now():7.1f}s] fault {kind} lifted", flush=True)
