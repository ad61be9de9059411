"""A soak: hours of steady load through real Envoy, two epp replicas and `epp sim` pods, with faults.

    python -m epp.bench.soak --duration 3600 --rate 20 --out /tmp/soak   (under `nice -n 10`)

Topology (every process on 127.0.0.1, every port free at start):

    client (this process) ──► Envoy ──ext_proc──► epp A, epp B (same endpoints file, KV events on)
                                 └──► `epp sim` pod processes (one each, so a pod can be killed)

Between epp and each pod this process puts two things it can break on schedule, so that faults
are what the issue names and nothing else:

* a /metrics proxy per pod (the endpoints file's `metricsPort`): `scrape_hang` makes every pod's
  /metrics hang (no answer) for the fault's duration: the "all metrics hung" blackout;
* a ZMQ forwarder per pod (its `kvEvents`): `publisher_drop` closes one pod's forwarder (epp's
  subscription loses its peer and the events sent meanwhile), then binds it again.

The other two faults act on processes: `pod_kill` SIGKILLs one pod and restarts it on the same
ports (cold cache) after the fault's duration; `epp_sigterm` SIGTERMs epp B and restarts it.
Envoy health-checks both replicas, so it stops sending to the one that is gone.

Faults rotate in that order every `--fault-every` seconds after the warm-up. A fault's window runs
from its start until what it broke is back (the restarted process answers, or the fault is
lifted), plus `--grace` seconds; a request that overlapped a window counts against that fault
(one in flight at a pod's kill fails too), every other failed request is *lost*. The report
(`report.json`, `report.md` in `--out`) has: requests and errors, in and out of fault windows;
p50/p99 per interval and the p99 drift (last interval over the first after warm-up); each epp's
RSS slope after warm-up (MB/min, least squares; epp A is never restarted); and per fault the
recovery time (see `_recovery`).

`--tracemalloc SECONDS` runs epp A under tracemalloc and has it dump a snapshot that often
into `--out` (`tracemalloc-<pid>-<n>.bin`), to diff with `python -m epp.bench.soak --diff A B`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import signal
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml
import zmq
import zmq.asyncio
from aiohttp import web

from epp.gateway.envoy import GatewayParams, PodsMode
from epp.gateway.processes import HOST, EnvoyServer, EppServer, ManagedProcess, epp_command, free_ports

MODEL = "sim-model"
FAULTS = ("pod_kill", "publisher_drop", "scrape_hang", "epp_sigterm")

# With --tracemalloc, every Python process of epp (workers too) imports this at start (PYTHONPATH)
# and dumps a snapshot every N seconds, so the allocation sites that grow can be diffed.
_SITECUSTOMIZE = """
import os, threading, time, tracemalloc
_spec = os.environ.get("EPP_SOAK_TRACEMALLOC", "")
if _spec and tracemalloc.is_tracing():
    _every, _, _out = _spec.partition(":")

    def _dump():
        n = 0
        while True:
            time.sleep(float(_every))
            path = os.path.join(_out, f"tracemalloc-{os.getpid()}-{n:03d}.bin")
            tracemalloc.take_snapshot().dump(path)
            n += 1

    threading.Thread(target=_dump, daemon=True, name="soak-tracemalloc").start()
"""


@dataclasses.dataclass
class SoakConfig:
    out: Path
    duration: float = 3600.0
    rate: float = 20.0  # requests per second, Poisson arrivals
    pods: int = 3
    warmup: float = 120.0  # RSS slope and p99 drift ignore this much
    fault_every: float = 300.0
    fault_duration: float = 20.0
    grace: float = 10.0  # after a fault ends, failures still count as the fault's
    faults: tuple[str, ...] = FAULTS
    time_scale: float = 0.05  # the sims' wall seconds per simulated second
    max_tokens: int = 16
    sample_every: float = 2.0  # RSS and epp metrics
    tracemalloc_every: float = 0.0  # 0: off
    epp_args: tuple[str, ...] = ()
    seed: int = 1


@dataclasses.dataclass
class Fault:
    kind: str
    start: float  # seconds since the soak began
    end: float = math.nan  # when the fault was lifted (restart issued, proxy resumed)
    target: str = ""  # pod address or epp name
    ready: float = math.nan  # pod_kill/epp_sigterm: when the restarted process answered


@dataclasses.dataclass(slots=True)
class Record:
    t: float
    latency: float
    status: int  # 0: no HTTP answer
    pod: str
    error: str = ""


def fault_schedule(cfg: SoakConfig) -> list[tuple[float, str]]:
    """(start, kind) pairs: rotating kinds, every `fault_every` from the end of the warm-up, each
    ending (with its grace) before the soak does."""
    out: list[tuple[float, str]] = []
    t, i = cfg.warmup, 0
    while cfg.faults and t + cfg.fault_duration + cfg.grace <= cfg.duration:
        out.append((t, cfg.faults[i % len(cfg.faults)]))
        t += cfg.fault_every
        i += 1
    return out


# --- the breakable pieces ------------------------------------------------------------------------


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
        (self.port,) = free_ports(1)
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


class Pod:
    """One `epp sim` process on fixed ports, so a restart comes back where epp expects it."""

    def __init__(self, i: int, cfg: SoakConfig) -> None:
        self.port, self.kv_port, self.replay_port = free_ports(3)
        self.address = f"{HOST}:{self.port}"
        self.kv_upstream = f"tcp://{HOST}:{self.kv_port}"
        self.replay = f"tcp://{HOST}:{self.replay_port}"
        argv = [
            *epp_command(), "sim", "--port", str(self.port), "--time-scale", str(cfg.time_scale),
            "--kv-events", self.kv_upstream, "--kv-replay", self.replay,
        ]  # fmt: skip
        self.process = ManagedProcess(f"pod-{i}", argv, cfg.out / f"pod-{i}.log")

    async def start(self, within: float = 120.0) -> None:
        self.process.start()
        deadline = time.monotonic() + within
        while not await asyncio.to_thread(_answers, f"http://{self.address}/health"):
            if time.monotonic() > deadline or not self.process.alive():
                raise RuntimeError(f"{self.process.name} did not start; see {self.process.log_path}")
            await asyncio.sleep(0.1)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) of `pid` in MB. RssAnon (heap and other private memory) is what a leak
    grows; VmRSS also counts shared-library pages, which a busy machine evicts and reloads."""
    rss = anon = math.nan
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1]) / 1024
    return rss, anon


# --- the run --------------------------------------------------------------------------------------


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
            env = None
            if cfg.tracemalloc_every > 0:
                site = cfg.out / "site"
                site.mkdir(exist_ok=True)
                (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
                env = {
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
                    "PYTHONTRACEMALLOC": "10",
                    "EPP_SOAK_TRACEMALLOC": f"{cfg.tracemalloc_every}:{cfg.out}",
                }
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
            listen, admin = free_ports(2)
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
            asyncio.create_task(self._faults()),
        ]
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

    async def _faults(self) -> None:
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

    # --- the report ------------------------------------------------------------------------------

    def window(self, f: Fault) -> tuple[float, float]:
        """A fault lasts from its start until what it broke is back: the restarted process ready
        (pod_kill, epp_sigterm) or the fault lifted (the others); then `grace` more seconds."""
        back = f.ready if not math.isnan(f.ready) else f.end
        if math.isnan(back):
            back = self.cfg.duration
        return f.start, back + self.cfg.grace

    def in_fault(self, r: Record) -> Fault | None:
        """The fault whose window the request overlapped (a request in flight when a pod is
        killed fails too)."""
        for f in self.faults:
            lo, hi = self.window(f)
            if r.t <= hi and r.t + r.latency >= lo:
                return f
        return None

    def report(self) -> dict[str, Any]:
        cfg = self.cfg
        recs = sorted(self.records, key=lambda r: r.t)
        failed = [r for r in recs if r.status != 200]
        lost = [r for r in failed if self.in_fault(r) is None]
        intervals = _intervals(recs, cfg)
        steady = [i for i in intervals if i["start"] >= cfg.warmup and i["n"]]
        drift = (
            steady[-1]["p99_ms"] / steady[0]["p99_ms"] if len(steady) >= 2 and steady[0]["p99_ms"] else None
        )
        faults = []
        for f in self.faults:
            window = [r for r in recs if self.in_fault(r) is f]
            errors: dict[str, int] = {}
            for r in window:
                if r.status != 200:
                    errors[r.error.split(":")[0]] = errors.get(r.error.split(":")[0], 0) + 1
            faults.append(
                {
                    **dataclasses.asdict(f),
                    "requests": len(window),
                    "failed": sum(r.status != 200 for r in window),
                    "errors": errors,
                    **self._recovery(f, recs),
                }
            )
        return {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()},
            "requests": len(recs),
            "ok": len(recs) - len(failed),
            "failed_in_faults": len(failed) - len(lost),
            "lost": len(lost),
            "lost_samples": [dataclasses.asdict(r) for r in lost[:20]],
            "p50_ms": _pct([r.latency for r in recs if r.status == 200], 50),
            "p99_ms": _pct([r.latency for r in recs if r.status == 200], 99),
            "p99_drift": drift,
            "intervals": intervals,
            "rss": _rss_summary(self.rss, cfg.warmup),
            "degraded_picks": _last_total(self.samples, "epp_routing_degraded_total"),
            "faults": faults,
        }

    def _recovery(self, f: Fault, recs: list[Record]) -> dict[str, Any]:
        """Seconds from the fault's end (or the process's return) to: a request served by the pod
        again and the pod back at half its fair share over 10 s (pod_kill); every endpoint routable
        again on epp A (scrape_hang); epp A applying the pod's events again (publisher_drop); epp B
        routing again (epp_sigterm)."""
        if math.isnan(f.end):
            return {}
        out: dict[str, Any] = {}
        if f.kind == "pod_kill":
            back = [r.t for r in recs if r.t >= f.ready and r.pod == f.target and r.status == 200]
            out["first_served_s"] = back[0] - f.ready if back else None
            out["share_s"] = _share_time(recs, f, len(self.pods))
        elif f.kind == "scrape_hang":
            out["readmitted_s"] = self._first_sample(f.end, "epp-a", lambda s: s.get("excluded", 1) == 0)
        elif f.kind == "publisher_drop":
            port = f.target.rsplit(":", 1)[1]
            before = [s for t, n, s in self.samples if n == "epp-a" and t <= f.end]
            base = before[-1].get(f"batches:{port}", 0.0) if before else 0.0
            out["events_again_s"] = self._first_sample(
                f.end, "epp-a", lambda s: s.get(f"batches:{port}", 0.0) > base
            )
        elif f.kind == "epp_sigterm":
            out["serving_s"] = f.ready - f.end
            out["routing_s"] = self._first_sample(f.ready, "epp-b", lambda s: s.get("requests", 0.0) > 0)
        return out

    def _first_sample(self, after: float, name: str, ok: Any) -> float | None:
        for t, n, s in self.samples:
            if n == name and t >= after and ok(s):
                return round(t - after, 2)
        return None


def parse_series(text: str) -> dict[str, float]:
    """The few epp series the soak follows, summed: excluded endpoints, requests, degraded picks,
    and KV batches per pod port (`batches:<port>`)."""
    out: dict[str, float] = {"excluded": 0.0, "requests": 0.0, "epp_routing_degraded_total": 0.0}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        if name.startswith("epp_endpoint_excluded{"):
            out["excluded"] += v
        elif name.startswith("inference_objective_request_total{"):
            out["requests"] += v
        elif name.startswith("epp_routing_degraded_total"):
            out["epp_routing_degraded_total"] += v
        elif name.startswith("epp_kv_events_batches_total{"):
            port = name.rsplit(":", 1)[-1].split('"')[0].split("@")[0]
            if port.isdigit():
                out[f"batches:{port}"] = out.get(f"batches:{port}", 0.0) + v
    return out


def _pct(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(1000 * s[min(len(s) - 1, int(len(s) * p / 100))], 1)


def _intervals(recs: list[Record], cfg: SoakConfig) -> list[dict[str, Any]]:
    width = max(10.0, min(300.0, cfg.duration / 12))
    out = []
    for k in range(math.ceil(cfg.duration / width)):
        lo, hi = k * width, (k + 1) * width
        ok = [r.latency for r in recs if lo <= r.t < hi and r.status == 200]
        n = sum(1 for r in recs if lo <= r.t < hi)
        out.append(
            {"start": lo, "n": n, "failed": n - len(ok), "p50_ms": _pct(ok, 50), "p99_ms": _pct(ok, 99)}
        )
    return out


def _share_time(recs: list[Record], f: Fault, pods: int) -> float | None:
    """Seconds after the pod's return until, over the next 10 s, it served >= half its share."""
    served = [r for r in recs if r.t >= f.ready and r.status == 200]
    for start in [r.t for r in served if r.pod == f.target]:
        window = [r for r in served if start <= r.t < start + 10.0]
        if window and recs[-1].t >= start + 10.0:
            mine = sum(1 for r in window if r.pod == f.target)
            if mine >= 0.5 * len(window) / pods:
                return round(start - f.ready, 2)
    return None


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope in MB per minute of (seconds, MB) points."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return round(60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den, 4) if den else None


def _rss_summary(rss: list[tuple[float, str, int, float, float]], warmup: float) -> dict[str, Any]:
    """Per epp process lifetime (name, pid): RSS and anonymous RSS at start and end, and the
    anonymous RSS's slope after warm-up (a restarted process warms up again: its first `warmup`
    seconds are left out)."""
    lives: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for t, name, pid, mb, anon in rss:
        lives.setdefault((name, pid), []).append((t, mb, anon))
    out = {}
    for (name, pid), pts in lives.items():
        began = max(warmup, pts[0][0] + (warmup if pts[0][0] > 1 else 0.0))
        steady = [p for p in pts if p[0] >= began]
        out[f"{name} pid {pid}"] = {
            "from_s": round(pts[0][0], 1),
            "to_s": round(pts[-1][0], 1),
            "first_mb": round(pts[0][1], 1),
            "last_mb": round(pts[-1][1], 1),
            "max_mb": round(max(p[1] for p in pts), 1),
            "anon_first_mb": round(pts[0][2], 1),
            "anon_steady_first_mb": round(steady[0][2], 1) if steady else None,
            "anon_last_mb": round(pts[-1][2], 1),
            "anon_slope_mb_per_min": _slope([(t, anon) for t, _, anon in steady]),
            "rss_slope_mb_per_min": _slope([(t, mb) for t, mb, _ in steady]),
        }
    return out


def _last_total(samples: list[tuple[float, str, dict[str, float]]], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for _, name, s in samples:
        out[name] = s.get(key, 0.0)
    return out


def render(r: dict[str, Any]) -> str:
    c = r["config"]
    lines = [
        f"# Soak: {c['duration']:.0f} s at {c['rate']:g} req/s, {c['pods']} pods, "
        "2 epp replicas behind Envoy",
        "",
        f"- requests {r['requests']}, ok {r['ok']}, failed inside fault windows {r['failed_in_faults']}, "
        f"**lost (failed outside any fault window) {r['lost']}**",
        f"- latency p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms; p99 drift (last interval / first after "
        f"warm-up) {r['p99_drift'] if r['p99_drift'] is None else round(r['p99_drift'], 2)}",
        f"- picks made in degraded mode (every endpoint's metrics stale): {r['degraded_picks']}",
        "",
        "| epp process | from s | to s | RSS first / last / max MB | anon RSS first / after warm-up / "
        "last MB | anon slope MB/min | RSS slope MB/min |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in r["rss"].items():
        lines.append(
            f"| {name} | {v['from_s']} | {v['to_s']} | {v['first_mb']} / {v['last_mb']} / {v['max_mb']} | "
            f"{v['anon_first_mb']} / {v['anon_steady_first_mb']} / {v['anon_last_mb']} | "
            f"{v['anon_slope_mb_per_min']} | {v['rss_slope_mb_per_min']} |"
        )
    lines += [
        "",
        "| t s | fault | target | requests in window | failed | errors | recovery |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = ("first_served_s", "share_s", "readmitted_s", "events_again_s", "serving_s", "routing_s")
    for f in r["faults"]:
        rec = ", ".join(f"{k} {f[k] if f[k] is None else round(f[k], 2)}" for k in keys if k in f)
        lines.append(
            f"| {f['start']:.0f} | {f['kind']} | {f['target']} | {f['requests']} | {f['failed']} | "
            f"{f['errors'] or ''} | {rec} |"
        )
    lines += ["", "| interval start s | requests | failed | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for i in r["intervals"]:
        lines.append(f"| {i['start']:.0f} | {i['n']} | {i['failed']} | {i['p50_ms']} | {i['p99_ms']} |")
    return "\n".join(lines) + "\n"


def diff_snapshots(a: str, b: str, top: int = 25) -> str:
    """The allocation sites that grew most between two tracemalloc dumps."""
    import tracemalloc

    old, new = tracemalloc.Snapshot.load(a), tracemalloc.Snapshot.load(b)
    stats = new.compare_to(old, "traceback")
    lines = []
    for s in stats[:top]:
        lines.append(f"{s.size_diff / 1024:+9.1f} KiB {s.count_diff:+7d} blocks")
        lines.extend("      " + line for line in s.traceback.format(limit=8))
    return "\n".join(lines)


async def _run_until_signalled(soak: Soak) -> dict[str, Any]:
    """Run the soak; SIGTERM/SIGINT cut it short but still stop every process it started."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    return await soak.run()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epp.bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("soak-out"))
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--pods", type=int, default=3)
    p.add_argument("--warmup", type=float, default=120.0)
    p.add_argument("--fault-every", type=float, default=300.0)
    p.add_argument("--fault-duration", type=float, default=20.0)
    p.add_argument("--grace", type=float, default=10.0)
    p.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated, in rotation order ('' = none)"
    )
    p.add_argument("--time-scale", type=float, default=0.05)
    p.add_argument("--tracemalloc", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--epp-arg", action="append", default=[], help="an extra `epp serve` argument (repeat)")
    p.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="diff two tracemalloc dumps and exit")
    args = p.parse_args(argv)
    if args.diff:
        print(diff_snapshots(*args.diff))
        return 0
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = set(faults) - set(FAULTS)
    if unknown:
        p.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    cfg = SoakConfig(
        out=args.out,
        duration=args.duration,
        rate=args.rate,
        pods=args.pods,
        warmup=args.warmup,
        fault_every=args.fault_every,
        fault_duration=args.fault_duration,
        grace=args.grace,
        faults=faults,
        time_scale=args.time_scale,
        tracemalloc_every=args.tracemalloc,
        epp_args=tuple(args.epp_arg),
    )
    report = asyncio.run(_run_until_signalled(Soak(cfg)))
    print(render(report))
    return 0 if report["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
