"""Benchmark (a script, not a test): small requests' latency while 8 clients send epp the largest
bodies it allows (issue 19, "one request can stall everyone").

A real `epp serve` process (KV events on, so the precise config, the shipped tokenizer and chat
rendering run) over two simulated pods, spoken to over ext-proc gRPC as Envoy does. A probe sends
a small chat request every 20 ms and times the routing answer; 8 heavy clients, in another process
so their own CPU does not delay the probe, each send one largest-allowed chat body after another
(by default `--max-request-messages` 10,000 messages filling `--max-body-bytes` 16 MiB: the most
per-message work epp accepts in one body). Phases, in one run: idle, loaded, idle again.

    .venv/bin/python -m tests.api.bench_big_bodies [--seconds 20] [--messages 10000] [--mib 16]
        [--buffered] [--clients-nice 10] [--clients-idle] [--split] [--epp-arg=--large-body-rate=16Mi]

Without `--buffered` the bodies come in 1 MiB chunks and epp sends each back in 62000-byte
chunks (FULL_DUPLEX_STREAMED, GIE's config); with it, whole (BUFFERED, epp's own). Results:
docs/bench/overhead.md#large-bodies.

`--split` sends the heavy bodies to a second `epp serve` instead: the probed epp does none of
their work, so what remains of the probe's tail is the machine's (the load sharing its cores).
`--clients-idle` runs the heavy clients under SCHED_IDLE, as if on cores of their own; with
`EPP_E2E_COMMAND="taskset -c 0 .venv/bin/python -P -m epp"` and the script under `taskset -c 1`,
epp has a core to itself.

Prints p50/p99/max of the probe per phase and the loaded/idle p99 ratio, and epp's own event-loop
lag p99 per phase (epp times its loop every 5 ms here, `--event-loop-lag-interval`; the bound of
the `epp_event_loop_lag_seconds` bucket holding the 99th percentile, and the share of samples
over 2 ms): what the bodies cost epp itself, apart from the machine's share of the probe's latency.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import msgspec
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from e2e.harness import EppProcess
from epp.bench import measure
from epp.sim.engine import SimConfig
from epp.sim.fleet import SimFleet
from tests.extproc import helpers as h

SMALL = msgspec.json.encode({"model": "sim-model", "messages": [{"role": "user", "content": "hello there"}]})
CHUNK = 1 << 20  # Envoy's body chunks to ext-proc are at most its buffer size


def big_body(messages: int, mib: int) -> bytes:
    overhead = len(msgspec.json.encode({"role": "user", "content": ""})) + 1
    size = max(1, ((mib << 20) - (64 << 10)) // messages - overhead - 4)
    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "w " * (size // 2)}
        for i in range(messages)
    ]
    return msgspec.json.encode({"model": "sim-model", "messages": msgs})


async def one_request(stub: pb_grpc.ExternalProcessorStub, body: bytes, *, buffered: bool = False) -> int:
    """Headers, the body (in chunks as with FULL_DUPLEX_STREAMED, GIE's config, or whole as with
    BUFFERED, epp's own); done at the routing answer: 200, or epp's error status."""
    call = stub.Process()
    headers = h.post_headers(**{"content-length": str(len(body))})  # as Envoy passes the client's
    await call.write(h.headers_msg(headers, mode=h.BUFFERED if buffered else h.DUPLEX))
    step = len(body) or 1 if buffered else CHUNK
    for i in range(0, len(body), step):
        await call.write(h.body_msg(body[i : i + step], eos=i + step >= len(body)))
    resp = await call.read()
    # BUFFERED: the headers are answered at once, and a body that waits for a large-body lane
    # first gets Envoy's message timeout extended (`override_message_timeout`); the routing
    # answer comes after both. Taking the extension for the answer cancelled waiting bodies and
    # sent the next at once: clients then sent ~4 times the bodies Envoy would.
    while resp.HasField("override_message_timeout") or (buffered and resp.HasField("request_headers")):
        resp = await call.read()
    call.cancel()
    if resp.HasField("immediate_response"):
        return int(resp.immediate_response.status.code)
    return 200


def heavy_clients(
    address: str, body: bytes, stop_at: float, n: int, done: Any, nice: int, idle: bool, buffered: bool
) -> None:
    os.nice(nice)
    if idle:  # run only when nothing else wants a core (EEVDF lets a niced task finish its slice)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

    async def run() -> None:
        async with grpc.aio.insecure_channel(
            address, options=[("grpc.max_send_message_length", 64 << 20)]
        ) as ch:
            stub = pb_grpc.ExternalProcessorStub(ch)

            async def loop() -> None:
                while time.time() < stop_at:
                    status = await one_request(stub, body, buffered=buffered)
                    with done.get_lock():
                        done.value += 1 if status == 200 else 1_000_000  # an error: visible

            await asyncio.gather(*(loop() for _ in range(n)))

    asyncio.run(run())


async def probe(address: str, seconds: float) -> list[float]:
    out: list[float] = []
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.ExternalProcessorStub(ch)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await one_request(stub, SMALL)
            out.append(time.perf_counter() - t0)
            await asyncio.sleep(0.02)
    return out


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds of `pid` itself, and of its descendants (the body parsers)."""
    own = measure.own_cpu_seconds(pid)
    return own, measure.cpu_seconds(pid) - own


def summary(name: str, xs: list[float]) -> str:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    ms = [statistics.median(xs) * 1e3, p99 * 1e3, xs[-1] * 1e3]
    return f"{name:>8}: n={len(xs):4d} p50={ms[0]:7.2f} ms p99={ms[1]:7.2f} ms max={ms[2]:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument(
        "--clients-nice",
        type=int,
        default=0,
        help="run the heavy clients at this nice value: on a small machine their own CPU (16 MiB "
        "messages built and sent) competes with epp's, which clients elsewhere would not",
    )
    ap.add_argument("--clients-idle", action="store_true", help="run the heavy clients under SCHED_IDLE")
    ap.add_argument(
        "--split",
        action="store_true",
        help="send the heavy bodies to a second epp: the probe then measures the machine's floor",
    )
    ap.add_argument(
        "--buffered",
        action="store_true",
        help="bodies as Envoy sends them in BUFFERED mode (epp's own config): one message, no "
        "body sent back; default FULL_DUPLEX_STREAMED, GIE's",
    )
    ap.add_argument(
        "--max-model-len",
        default="sim-model=100000000",
        help="epp's --max-model-len: by default a context no body reaches, so heavy requests are "
        "tokenized and scheduled (200); a real context (sim-model=131072) refuses them after tokenizing",
    )
    ap.add_argument("--epp-arg", action="append", default=[], help="an extra `epp serve` argument (repeat)")
    args = ap.parse_args()
    body = big_body(args.messages, args.mib)
    print(f"heavy body: {len(body) / (1 << 20):.2f} MiB, {args.messages} messages; {args.clients} clients")
    sims = SimFleet([SimConfig(time_scale=0.02, name=f"s{i}") for i in range(2)])
    sims.start()
    with tempfile.TemporaryDirectory() as tmp:
        args_ = ["--kv-events", "connect", "--max-model-len", args.max_model_len]
        args_ += ["--event-loop-lag-interval", "5ms", *args.epp_arg]
        epp = EppProcess(Path(tmp), endpoints=sims.addresses, extra_args=args_)
        epp.start(wait="serving")
        other: EppProcess | None = None
        if args.split:
            (Path(tmp) / "other").mkdir()
            other = EppProcess(Path(tmp) / "other", endpoints=sims.addresses, extra_args=args_, name="other")
            other.start(wait="serving")
        try:
            time.sleep(1.0)
            asyncio.run(probe(epp.grpc_address, 2.0))  # warm-up
            pid = epp.process.pid
            lags: dict[str, tuple[dict[float, float], dict[float, float]]] = {}

            def lag_buckets() -> dict[float, float]:
                return measure.histogram_buckets(epp.metrics_text(), "epp_event_loop_lag_seconds")

            t0, idle0, lag0 = time.perf_counter(), cpu_seconds(pid), lag_buckets()
            phases = {"idle": asyncio.run(probe(epp.grpc_address, args.seconds))}
            lags["idle"] = (lag0, lag_buckets())
            idle_rate = (cpu_seconds(pid)[0] - idle0[0]) / (time.perf_counter() - t0)  # the probe's
            ctx = multiprocessing.get_context("spawn")
            done = ctx.Value("q", 0)
            worker = ctx.Process(
                target=heavy_clients,
                args=(
                    (other or epp).grpc_address,
                    body,
                    time.time() + args.seconds + 3,
                    args.clients,
                    done,
                    args.clients_nice,
                    args.clients_idle,
                    args.buffered,
                ),
            )
            worker.start()
            time.sleep(3.0)  # the heavy clients are up and sending
            t0, cpu0, heavy0, lag0 = time.perf_counter(), cpu_seconds(pid), done.value, lag_buckets()
            phases["loaded"] = asyncio.run(probe(epp.grpc_address, args.seconds))
            cpu1, heavy1 = cpu_seconds(pid), done.value
            lags["loaded"] = (lag0, lag_buckets())
            # epp's CPU for the heavy requests: what the probe alone cost in the idle phase is
            # taken off (the parsers' CPU is theirs alone)
            cpu1 = (cpu1[0] - idle_rate * (time.perf_counter() - t0), cpu1[1])
            worker.join()
            heavy = done.value
            lag0 = lag_buckets()
            phases["idle2"] = asyncio.run(probe(epp.grpc_address, args.seconds))
            lags["idle2"] = (lag0, lag_buckets())
        finally:
            epp.stop()
            if other is not None:
                other.stop()
            sims.stop()
    print(f"heavy requests routed: {heavy % 1_000_000}, answered with an error: {heavy // 1_000_000}")
    n = (heavy1 - heavy0) % 1_000_000 + (heavy1 - heavy0) // 1_000_000
    cpus = {"epp": (cpu0[0], cpu1[0]), "its body parsers": (cpu0[1], cpu1[1])}
    for name, (a, b) in cpus.items() if not args.split else ():  # the probed epp did none of it
        print(
            f"CPU of {name} while loaded: {1e3 * (b - a) / max(1, n):.1f} ms per heavy request ({n} answered)"
        )
    for name, xs in phases.items():
        before, after = lags[name]
        bound, n = measure.bucket_quantile(before, after, 0.99)
        over = n - (after.get(0.002, 0.0) - before.get(0.002, 0.0))
        print(
            f"{summary(name, xs)}  epp loop lag p99 <= {bound * 1e3:g} ms, "
            f"{100 * over / max(1, n):.1f}% > 2 ms ({n} samples)"
        )

    def p99(xs: list[float]) -> float:
        return sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))]

    idle = max(p99(phases["idle"]), p99(phases["idle2"]))
    print(f"loaded p99 / idle p99 = {p99(phases['loaded']) / idle:.2f}")


if __name__ == "__main__":
    main()
