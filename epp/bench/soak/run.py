"""The soak's run: start the pods (each behind a /metrics proxy and a ZMQ forwarder), two epp
replicas and Envoy; send Poisson load, sample the epps' RSS and metrics, inject the faults;
stop everything and write the report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from typing import Any

import aiohttp
import yaml
import zmq.asyncio

from epp.bench.soak import memtrace
from epp.bench.soak.attacks import Attacker, server_errors
from epp.bench.soak.attacks import summary as attacks_summary
from epp.bench.soak.config import MODEL, Fault, Record, SoakConfig
from epp.bench.soak.faults import EventsForwarder, Injector, MetricsProxy
from epp.bench.soak.pods import Pod, rss_mb
from epp.bench.soak.report import Observations, parse_series, render
from epp.gateway.envoy import GatewayParams, PodsMode
from epp.gateway.processes import HOST, EnvoyServer, EppServer, stable_ports


class Soak:
    def __init__(self, cfg: SoakConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.records: list[Record] = []
        self.faults: list[Fault] = []
        # (t, epp name, pid, RSS MB, anon MB); (t, epp name, {series: value}) from each /metrics.
        self.rss: list[tuple[float, str, int, float, float]] = []
        self.samples: list[tuple[float, str, dict[str, float]]] = []
        self.t0 = 0.0
        self.inflight = 0
        self.attacker: Attacker | None = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        cfg.out.mkdir(parents=True, exist_ok=True)
        zctx = zmq.asyncio.Context()
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60)
        )
        self.pods = [Pod(i, cfg) for i in range(cfg.pods)]
        self.proxies = [MetricsProxy(p.address, session) for p in self.pods]
        self.forwarders = [EventsForwarder(zctx, p.kv_upstream) for p in self.pods]
        stops: list[Any] = []
        try:
            for pod, proxy, fwd in zip(self.pods, self.proxies, self.forwarders, strict=True):
                fwd.up()
                await pod.start()
                stops.append(pod.process.stop)
                await proxy.start()
            endpoints_file = cfg.out / "endpoints.yaml"
            entries = [
                {
                    "address": p.address,
                    "metricsPort": proxy.port,
                    "model": MODEL,
                    "kvEvents": fwd.endpoint,
                    "kvReplay": p.replay,
                }
                for p, proxy, fwd in zip(self.pods, self.proxies, self.forwarders, strict=True)
            ]
            endpoints_file.write_text(yaml.safe_dump({"endpoints": entries}))
            env = memtrace.environment(cfg)
            self.epps = [
                EppServer(
                    cfg.out / f"epp-{name}.log",
                    endpoints_file=endpoints_file,
                    extra_args=["--kv-events", "connect", *cfg.epp_args],
                    name=f"epp-{name}",
                )
                for name in ("a", "b")
            ]
            self.epps[0].process.env = env  # epp A only: tracing slows a process several-fold
            for epp in self.epps:
                stops.append(epp.stop)
                await asyncio.to_thread(epp.start, timeout=600.0)
            listen, admin = stable_ports(2)
            params = GatewayParams(
                listen_port=listen,
                admin_port=admin,
                epp_addresses=tuple(e.grpc_address for e in self.epps),
                pods_mode=PodsMode.ORIGINAL_DST,
                epp_health_check=True,
                route_timeout=60.0,
                access_log_path=str(cfg.out / "access.log"),
            )
            envoy = EnvoyServer(cfg.out, params)
            stops.append(envoy.stop)
            await asyncio.to_thread(envoy.start)
            self.url = f"http://{HOST}:{listen}/v1/completions"
            await self._main(session)
        finally:
            for fwd in self.forwarders:
                await fwd.down()
            for proxy in self.proxies:
                await proxy.stop()
            await session.close()
            for stop in reversed(stops):
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(stop)
            zctx.term()
        report = self.report()
        (cfg.out / "report.json").write_text(json.dumps(report, indent=1))
        (cfg.out / "report.md").write_text(render(report))
        return report

    async def _main(self, session: aiohttp.ClientSession) -> None:
        self.t0 = time.monotonic()
        background = [
            asyncio.create_task(self._sampler(session)),
            asyncio.create_task(
                Injector(
                    self.cfg, self.now, self.faults, self.pods, self.proxies, self.forwarders, self.epps
                ).run()
            ),
        ]
        if self.cfg.attack_rate > 0:
            host, port = self.url.removeprefix("http://").split("/")[0].split(":")
            self.attacker = Attacker(host, int(port), self.cfg.attack_rate, self.now)
            background.append(asyncio.create_task(self.attacker.run()))
        pending: set[asyncio.Task[None]] = set()
        next_at = 0.0
        while (t := self.now()) < self.cfg.duration:
            if t < next_at:
                await asyncio.sleep(next_at - t)
                continue
            next_at += self.rng.expovariate(self.cfg.rate)
            task = asyncio.create_task(self._one(session))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(pending, timeout=90)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)

    def _body(self) -> dict[str, Any]:
        # Shared prefixes (a handful of "system prompts") so KV-cache routing has something to do,
        # and a quarter of prompts new from their first block: per-prefix state must stay bounded.
        if self.rng.random() < 0.25:
            head = f"one-off {self.rng.getrandbits(64)} "
        else:
            head = f"system prompt {self.rng.randrange(8)} "
        words = " ".join(f"w{self.rng.randrange(1000)}" for _ in range(self.rng.randrange(5, 40)))
        return {
            "model": MODEL,
            "prompt": head + "lorem ipsum " * 60 + words,
            "max_tokens": self.cfg.max_tokens,
            "stream": self.rng.random() < 0.5,
        }

    async def _one(self, session: aiohttp.ClientSession) -> None:
        t = self.now()
        self.inflight += 1
        try:
            async with session.post(self.url, json=self._body()) as resp:
                await resp.read()
                rec = Record(t, self.now() - t, resp.status, resp.headers.get("x-sim-server", ""))
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}"
        except Exception as exc:  # a reset, a timeout: no answer at all
            rec = Record(t, self.now() - t, 0, "", f"{type(exc).__name__}: {exc}"[:200])
        finally:
            self.inflight -= 1
        self.records.append(rec)

    async def _sampler(self, session: aiohttp.ClientSession) -> None:
        while True:
            t = self.now()
            for epp in self.epps:
                if not epp.process.alive():
                    continue
                with contextlib.suppress(OSError):
                    self.rss.append((t, epp.process.name, epp.process.pid, *rss_mb(epp.process.pid)))
                url = f"http://{HOST}:{epp.metrics_port}/metrics"
                with contextlib.suppress(Exception):
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        text = await resp.text()
                        self.samples.append((t, epp.process.name, parse_series(text)))
                        (self.cfg.out / f"{epp.process.name}.metrics.txt").write_text(text)
            await asyncio.sleep(self.cfg.sample_every)

    def report(self) -> dict[str, Any]:
        seen = Observations(self.cfg, self.records, self.faults, self.rss, self.samples, len(self.pods))
        report = seen.report()
        attacks = self.attacker.results if self.attacker is not None else []
        report["attacks"] = attacks_summary(attacks)

        def in_fault(t: float, seconds: float) -> bool:
            return seen.in_fault(Record(t, seconds, 500, "")) is not None

        report["attack_5xx"], report["attack_5xx_in_faults"] = server_errors(attacks, in_fault)
        return report
