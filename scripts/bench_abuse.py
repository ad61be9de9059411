"""Overload and hostile clients against a real stack (a script, not a test): `epp serve`, the
generated Envoy (`--config override`, epp's default, or `duplex`, GIE's full-duplex config) and
paced SSE model servers (`epp.bench.sse_backend`, their own process).
docs/reliability.md#overload-and-hostile-clients holds the figures and the commands that made them.

    .venv/bin/python scripts/bench_abuse.py streams --concurrent 3000 [--config duplex]
        C streamed requests opened at once (each --chunks tokens, --interval-ms apart), while a
        probe in a process of its own (one small request every 100 ms, asking for no tokens) is
        timed; before them the probe alone (idle). Prints every answer's status (a 500 is a
        failure; 503/429 must carry a reason), the probe's p50/p99 idle, during the burst (until
        every stream had its headers) and held (every stream open), epp's event-loop lag p99
        (sampled every 5 ms), its peak RSS and CPU, Envoy's CPU, and the machine's idle CPU
        during the burst (--envoy-concurrency sets Envoy's worker threads; 1 by default).
    .venv/bin/python scripts/bench_abuse.py unfinished --bodies 1000 --mib 1 [--via-envoy]
        N request bodies sent all but their last KiB and held (--hold seconds): straight to epp's
        ext-proc port as FULL_DUPLEX_STREAMED (what a full-duplex gateway passes on as it
        arrives), or through Envoy as HTTP/1.1 uploads. Prints epp's peak RSS against its budget
        (from its sized limits: epp.extproc.limits), the answers, the probe and the loop lag.
    .venv/bin/python scripts/bench_abuse.py restart --restarts 3 [--replicas 2]
        --clients closed-loop clients through Envoy while epp (replica 0) is SIGTERMed and started
        again, --restarts times. Prints every non-200 answer by status: with one replica the
        generated Envoy holds new requests (retries) across the gap; with two, none may fail.

Common: --epp-arg (repeat) passes a flag to `epp serve`, --seconds sets the probe's phases.
Run it on a quiet machine: the probe and the lag measure the machine as much as epp otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import itertools
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.bench import measure
from epp.bench.soak.pods import rss_mb
from epp.extproc import limits
from epp.gateway.envoy import GatewayParams, PodsMode, override_params
from epp.gateway.processes import HOST, EnvoyServer, EppServer, free_ports

LAG = "epp_event_loop_lag_seconds"


def chat(text: str, stream: bool = True) -> bytes:
    body = {"model": "bench-model", "messages": [{"role": "user", "content": text}], "stream": stream}
    return json.dumps(body).encode()


def headers_msg(size: int) -> pb.ProcessingRequest:
    """A POST's headers as Envoy sends them in FULL_DUPLEX_STREAMED (GIE's config)."""
    items = {":method": "POST", ":path": "/v1/chat/completions", "content-length": str(size)}
    hm = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in items.items()]
    )
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm))


def body_msg(chunk: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=chunk, end_of_stream=False))


class Stack:
    """SSE backends, `replicas` epp processes and one Envoy, in `workdir`."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.backend_ports = free_ports(args.pods)
        self.backends: subprocess.Popen[bytes] | None = None
        extra = ["--event-loop-lag-interval", "5ms", *args.epp_arg]
        pods = [f"{HOST}:{p}" for p in self.backend_ports]
        self.epps = [
            EppServer(workdir / f"epp-{i}.log", endpoints=pods, extra_args=extra, name=f"epp-{i}")
            for i in range(args.replicas)
        ]
        listen, admin = free_ports(2)
        params = GatewayParams(
            listen_port=listen,
            admin_port=admin,
            epp_addresses=tuple(e.grpc_address for e in self.epps),
            epp_health_check=True,
            access_log_path=str(workdir / "access.log"),
        )
        if args.fail_open:  # envoy.failOpen: the pods listed, the least-loaded one without epp
            params = dataclasses.replace(
                override_params(params),
                pods_mode=PodsMode.OVERRIDE_HOST,
                pod_endpoints=tuple(pods),
                failure_mode_allow=True,
            )
        self.envoy = EnvoyServer(
            workdir,
            override_params(params) if args.config == "override" else params,
            concurrency=args.envoy_concurrency,
        )
        self.url = f"http://{HOST}:{listen}/v1/chat/completions"
        self.listen = listen

    def start(self) -> None:
        ports = ",".join(map(str, self.backend_ports))
        argv = [sys.executable, "-m", "epp.bench.sse_backend", "--ports", ports]
        argv += ["--chunks", str(self.args.chunks), "--interval-ms", str(self.args.interval_ms)]
        with open(self.workdir / "backends.log", "wb") as out:
            self.backends = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        for epp in self.epps:
            epp.start(timeout=120)
        self.envoy.start()

    def stop(self) -> None:
        self.envoy.stop()
        for epp in self.epps:
            epp.stop()
        if self.backends is not None:
            self.backends.send_signal(signal.SIGTERM)
            self.backends.wait(10)

    def lag(self) -> dict[float, float]:
        return measure.histogram_buckets(self.epps[0].metrics_text(), LAG)


async def wait_routable(session: aiohttp.ClientSession, url: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            async with session.post(url, data=chat("warm", False), headers={"x-bench-chunks": "1"}) as r:
                await r.read()
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the stack never routed a request")
        await asyncio.sleep(0.2)


async def probe(session: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> list[tuple[float, float]]:
    """One small request every 100 ms until `stop`: each one's start (time.monotonic(), which
    other processes on the machine share) and its latency to its last byte. It asks for no
    tokens, so its latency is the gateway's and epp's, not the backend's pacing."""
    out: list[tuple[float, float]] = []
    while not stop.is_set():
        t0 = time.monotonic()
        async with session.post(url, data=chat("probe", False), headers={"x-bench-chunks": "0"}) as r:
            await r.read()
        out.append((t0, time.monotonic() - t0))
        await asyncio.sleep(0.1)
    return out


async def probe_main(url: str) -> None:
    """The probe in a process of its own (`bench_abuse.py probe URL`), so that the load's client
    loop is not in its latency: it runs until stdin closes, then prints its latencies as JSON."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def closed() -> None:
        loop.remove_reader(sys.stdin.fileno())
        stop.set()

    loop.add_reader(sys.stdin.fileno(), closed)
    async with aiohttp.ClientSession() as session:
        xs = await probe(session, url, stop)
    print(json.dumps(xs))


class ProbeProcess:
    """The probe as its own process, started and stopped around a phase."""

    def __init__(self, url: str) -> None:
        argv = [sys.executable, __file__, "probe", "--url", url]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    async def stop(self) -> list[tuple[float, float]]:
        out, _ = await asyncio.to_thread(self.proc.communicate, b"", timeout=600)
        return [(t, x) for t, x in json.loads(out)]


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def show_probe(name: str, xs: Sequence[float]) -> str:
    return f"probe {name:>6}: n={len(xs)} p50={pct(xs, 0.5) * 1e3:.1f} ms p99={pct(xs, 0.99) * 1e3:.1f} ms"


def machine_cpu() -> tuple[float, float]:
    """The machine's idle and total CPU ticks so far, every core (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [float(x) for x in f.readline().split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)  # idle + iowait


class Sampler:
    """epp replica 0's RSS (and, given its admin port, Envoy's heap) every 0.2 s: the peaks; and
    the machine's CPU ticks (`machine_cpu`) at each sample, to read its idle share between two
    instants (`idle_share`)."""

    def __init__(self, pid: int, envoy_admin: int | None = None) -> None:
        self.pid, self.peak_mb = pid, 0.0
        self.envoy_admin, self.envoy_peak_mb = envoy_admin, 0.0
        self.ticks: list[tuple[float, float, float]] = []  # (time.monotonic(), idle, total)
        self.task: asyncio.Task[None] | None = None

    def idle_share(self, start: float, end: float) -> float:
        """The machine's idle CPU between the samples nearest `start` and `end` (nan: none)."""
        inside = [t for t in self.ticks if start - 0.2 <= t[0] <= end + 0.2]
        if len(inside) < 2 or inside[-1][2] == inside[0][2]:
            return float("nan")
        return (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])

    async def _run(self) -> None:
        while True:
            self.ticks.append((time.monotonic(), *machine_cpu()))
            self.peak_mb = max(self.peak_mb, rss_mb(self.pid)[0])
            if self.envoy_admin is not None:
                heap = await asyncio.to_thread(envoy_heap_mb, self.envoy_admin)
                self.envoy_peak_mb = max(self.envoy_peak_mb, heap)
            await asyncio.sleep(0.2)

    def __enter__(self) -> Sampler:
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self.task is not None
        self.task.cancel()


async def idle_probe(stack: Stack, seconds: float) -> list[float]:
    """The probe's latencies with nothing else running."""
    probing = ProbeProcess(stack.url)
    await asyncio.sleep(seconds)
    return [x for _, x in await probing.stop()]


# --- streams ---------------------------------------------------------------------------------------


class Answer(NamedTuple):
    """One streamed request: its status (0: none), the reason of a refusal, when its headers
    came and when it ended (time.monotonic())."""

    status: int
    reason: str
    headers_at: float
    ended_at: float


async def one_stream(session: aiohttp.ClientSession, url: str, chunks: int) -> Answer:
    try:
        async with session.post(url, data=chat("go"), headers={"x-bench-chunks": str(chunks)}) as r:
            answered = time.monotonic()
            body = await r.read()
            reason = "" if r.status == 200 else body[:160].decode(errors="replace")
            return Answer(r.status, reason, answered, time.monotonic())
    except (aiohttp.ClientError, TimeoutError) as exc:
        now = time.monotonic()
        return Answer(0, type(exc).__name__, now, now)


async def streams(stack: Stack, args: argparse.Namespace) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        await wait_routable(session, stack.url)
        pid = stack.epps[0].process.pid
        idle = await idle_probe(stack, args.seconds)
        lag0, cpu0, t0 = stack.lag(), measure.cpu_seconds(pid), time.perf_counter()
        assert stack.envoy.proc is not None
        envoy_pid = stack.envoy.proc.pid
        envoy0 = measure.cpu_seconds(envoy_pid)
        probing = ProbeProcess(stack.url)
        with Sampler(pid) as rss:
            sent = time.monotonic()
            answers = await asyncio.gather(
                *(one_stream(session, stack.url, args.chunks) for _ in range(args.concurrent))
            )
        loaded = await probing.stop()
        lag = measure.bucket_quantile(lag0, stack.lag(), 0.99)
        cpu = measure.cpu_seconds(pid) - cpu0
        envoy_cpu = measure.cpu_seconds(envoy_pid) - envoy0
        wall = time.perf_counter() - t0
    statuses = collections.Counter(a.status for a in answers)
    reasons = collections.Counter(a.reason[:100] for a in answers if a.status not in (200, 0))
    # The burst: until the last stream had its answer's headers. After it, every stream that
    # was admitted is open and streaming: the probe then meets the concurrency, not the burst's
    # queue (docs/reliability.md#thousands-of-new-streams-at-once-what-a-client-gets).
    admitted = max(a.headers_at for a in answers)
    first_done = min(a.ended_at for a in answers if a.status == 200) if statuses.get(200) else admitted
    held = [x for t, x in loaded if admitted < t and t + x < first_done]
    burst = [x for t, x in loaded if t <= admitted]
    burst_s = admitted - sent
    print(f"{args.concurrent} streams of {args.chunks} chunks, config {args.config}: {dict(statuses)}")
    for reason, n in reasons.most_common(5):
        print(f"  {n} x {reason}")
    print(show_probe("idle", idle))
    print(show_probe("burst", burst) + f" (the {burst_s:.1f} s until every stream had its headers)")
    print(show_probe("held", held) + " (every stream open)")
    print(f"probe p99 held / idle = {pct(held, 0.99) / pct(idle, 0.99):.2f}")
    print(f"epp: loop lag p99 <= {lag[0] * 1e3:g} ms ({lag[1]} samples), peak RSS {rss.peak_mb:.0f} MB, ")
    print(f"     CPU {cpu:.1f} s in {wall:.1f} s (its body parsers' included)")
    print(f"Envoy ({args.envoy_concurrency} worker threads): CPU {envoy_cpu:.1f} s")
    print(f"the machine's idle CPU during the burst: {rss.idle_share(sent, admitted):.0%}")
    print(f"500s: {statuses.get(500, 0)} (must be 0); no answer: {statuses.get(0, 0)}")


# --- unfinished ------------------------------------------------------------------------------------


async def unfinished_grpc(address: str, size: int, hold: float) -> int:
    """Headers and all but the last KiB of a `size`-byte body, held; epp's status or 0."""
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        call = pb_grpc.ExternalProcessorStub(ch).Process()
        await call.write(headers_msg(size))
        sent, step = 0, 1 << 20
        body = b'{"model":"bench-model","messages":[{"role":"user","content":"' + b"x" * size
        try:
            while sent < size - 1024:
                n = min(step, size - 1024 - sent)
                await call.write(body_msg(body[sent : sent + n]))
                sent += n
            resp = await asyncio.wait_for(call.read(), hold)
        except TimeoutError:
            call.cancel()
            return 0
        except grpc.aio.AioRpcError:  # epp answered (and ended the stream) while it was sent
            return 1
        call.cancel()
        return int(resp.immediate_response.status.code) if resp.HasField("immediate_response") else 200


async def unfinished_http(port: int, size: int, hold: float) -> int:
    reader, writer = await asyncio.open_connection(HOST, port)
    head = f"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: {size}\r\n\r\n"
    try:
        writer.write(head.encode())
        chunk = b"x" * (1 << 20)
        sent = 0
        while sent < size - 1024:
            n = min(len(chunk), size - 1024 - sent)
            writer.write(chunk[:n])
            await writer.drain()
            sent += n
        line = await asyncio.wait_for(reader.readline(), hold)
        return int(line.split()[1]) if line.startswith(b"HTTP/") else 0
    except (TimeoutError, ConnectionError):
        return 0
    finally:
        writer.close()


def envoy_heap_mb(admin_port: int) -> float:
    with urllib.request.urlopen(f"http://{HOST}:{admin_port}/memory", timeout=5) as r:
        return int(json.loads(r.read())["allocated"]) / 1e6


def log_limits(path: Path) -> tuple[int, int] | None:
    m = re.search(r"--max-buffered-body-bytes (\d+), --max-concurrent-streams (\d+)", path.read_text())
    return (int(m.group(1)), int(m.group(2))) if m else None


async def unfinished(stack: Stack, args: argparse.Namespace) -> None:
    size = int(args.mib * (1 << 20))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await wait_routable(session, stack.url)
        epp = stack.epps[0]
        idle = await idle_probe(stack, args.seconds)
        base = rss_mb(epp.process.pid)[0]
        lag0 = stack.lag()
        probing = ProbeProcess(stack.url)
        with Sampler(epp.process.pid, stack.envoy.admin_port if args.via_envoy else None) as rss:
            if args.via_envoy:
                sends = [unfinished_http(stack.listen, size, args.hold) for _ in range(args.bodies)]
            else:
                sends = [unfinished_grpc(epp.grpc_address, size, args.hold) for _ in range(args.bodies)]
            answers = await asyncio.gather(*sends)
        loaded = await probing.stop()
        lag = measure.bucket_quantile(lag0, stack.lag(), 0.99)
    sized = log_limits(epp.process.log_path)
    print(
        f"{args.bodies} unfinished bodies of {args.mib:g} MiB, {'via Envoy' if args.via_envoy else 'to epp'}:"
    )
    print(f"  answers {dict(collections.Counter(answers))} (0: none within --hold; 1: ended while sent)")
    held = sum(1 for a in answers if a == 0) or 1
    per = (rss.peak_mb - base) * 1e3 / held
    print(f"  epp RSS: {base:.0f} MB before, peak {rss.peak_mb:.0f} MB ({per:.0f} KB per body held)")
    if args.via_envoy:
        heap = await asyncio.to_thread(envoy_heap_mb, stack.envoy.admin_port)
        print(f"  Envoy heap: peak {rss.envoy_peak_mb:.0f} MB, after {heap:.0f} MB (allocated)")
    if sized is not None:
        buffered, streams_ = sized
        budget = (
            limits.PROCESS_RESERVE + buffered * limits.BUFFERED_COST + streams_ * limits.STREAM_COST
        ) / 1e6
        print(f"  epp's limits: {buffered >> 20} MiB buffered, {streams_} streams: budget {budget:.0f} MB")
    print(show_probe("idle", idle))
    print(show_probe("loaded", [x for _, x in loaded]))
    print(f"  epp loop lag p99 <= {lag[0] * 1e3:g} ms ({lag[1]} samples)")


# --- restart ---------------------------------------------------------------------------------------


async def restart(stack: Stack, args: argparse.Namespace) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await wait_routable(session, stack.url)
        answers: list[tuple[float, int]] = []
        stop = asyncio.Event()
        t0 = time.monotonic()

        async def client() -> None:
            while not stop.is_set():
                try:
                    async with session.post(
                        stack.url, data=chat("x", False), headers={"x-bench-chunks": "1"}
                    ) as r:
                        await r.read()
                        answers.append((time.monotonic() - t0, r.status))
                except aiohttp.ClientError:
                    answers.append((time.monotonic() - t0, 0))

        clients = [asyncio.create_task(client()) for _ in range(args.clients)]
        gaps = []
        for _ in range(args.restarts):
            await asyncio.sleep(args.seconds)
            epp = stack.epps[0]
            epp.process.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            t_stop = time.monotonic()
            await asyncio.to_thread(epp.process.proc.wait, 60)  # type: ignore[union-attr]
            t_gone = time.monotonic()
            await asyncio.to_thread(epp.start, timeout=120)
            gaps.append((t_gone - t_stop, time.monotonic() - t_gone))
        await asyncio.sleep(args.seconds)
        stop.set()
        await asyncio.gather(*clients)
    statuses = collections.Counter(s for _, s in answers)
    print(
        f"{len(answers)} requests, {args.clients} clients, {args.replicas} replica(s), "
        f"config {'fail-open' if args.fail_open else args.config}"
    )
    print(f"  answers: {dict(statuses)}; not 200: {len(answers) - statuses.get(200, 0)}")
    for i, (drain, gap) in enumerate(gaps):
        print(f"  restart {i}: drained and exited in {drain:.1f} s, the next one serving {gap:.1f} s later")
    if len(answers) > 1:
        apart = statistics.median(b - a for (a, _), (b, _) in itertools.pairwise(answers))
        print(f"  requests {apart:.3f} s apart (median)")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("mode", choices=("streams", "unfinished", "restart", "probe"))
    p.add_argument("--url", help="probe: the gateway's chat URL (the probe process)")
    p.add_argument("--keep", type=Path, help="keep the stack's logs (epp, Envoy, backends) in this directory")
    p.add_argument("--config", choices=("override", "duplex"), default="override")
    p.add_argument("--pods", type=int, default=2)
    p.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy's worker threads")
    p.add_argument(
        "--fail-open",
        action="store_true",
        help="Envoy fails open over the pods' list (epp's override config; `--config` is ignored)",
    )
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument(
        "--seconds", type=float, default=10.0, help="the idle probe phase (restart: between restarts)"
    )
    p.add_argument("--concurrent", type=int, default=3000)
    p.add_argument("--chunks", type=int, default=200, help="tokens per streamed response")
    p.add_argument("--interval-ms", type=float, default=50.0, help="between tokens")
    p.add_argument("--bodies", type=int, default=1000)
    p.add_argument("--mib", type=float, default=1.0)
    p.add_argument("--hold", type=float, default=20.0)
    p.add_argument("--via-envoy", action="store_true")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--epp-arg", action="append", default=[])
    args = p.parse_args(argv)
    if args.mode == "probe":
        asyncio.run(probe_main(args.url))
        return 0
    run: dict[str, Any] = {"streams": streams, "unfinished": unfinished, "restart": restart}
    with tempfile.TemporaryDirectory(prefix="bench-abuse-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        stack = Stack(args, workdir)
        try:
            stack.start()
            asyncio.run(run[args.mode](stack, args))
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
