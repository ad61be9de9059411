"""epp CPU per streamed request: GIE's full-duplex config against epp's mode-override config.

    .venv/bin/python scripts/bench_mode_override.py --chunks 200 --requests 160 --rounds 3

One streaming backend process (N SSE token events written and flushed one by one, `--interval-ms`
apart, so Envoy hands each to ext_proc as its own message), one `epp serve` per arm and one Envoy
(1 worker thread) per arm, a client process with `--concurrency` streams. Per arm and round: the
CPU seconds (utime + stime from /proc, epp's process tree) spent while the client ran
`--requests` streamed chat requests, divided by the requests, and the same net of epp's idle
background (its CPU over an equal idle time right after). Arms run interleaved in each round:

* `duplex`: GIE's standard config (request and response bodies FULL_DUPLEX_STREAMED);
* `override@R`: `epp envoy-config`'s default (request BUFFERED, response STREAMED,
  allow_mode_override) with `epp serve --response-sample-ratio R`; with `--min-intervals`, one
  such arm per ratio and `--response-sample-min-interval T` (`override@R+minT`).

Prints one JSON line per measurement and a Markdown table of medians (min-max) at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from epp.gateway import envoy as ge
from epp.gateway.processes import HOST, EnvoyServer, EppServer, free_ports

TOKEN = (
    b'data: {"id":"c","object":"chat.completion.chunk","model":"bench-model",'
    b'"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}],"usage":null}\n\n'
)


def serve_backend(port: int, chunks: int, interval_ms: float) -> None:
    """The model server (its own process): `chunks` token events flushed one by one, then usage."""
    from aiohttp import web

    from epp.gateway.envoy import STATIC_BACKEND_METRICS

    usage = (
        b'data: {"id":"c","object":"chat.completion.chunk","model":"bench-model","choices":[],'
        b'"usage":{"prompt_tokens":100,"completion_tokens":%d,"total_tokens":%d,'
        b'"prompt_tokens_details":{"cached_tokens":0}}}\n\ndata: [DONE]\n\n' % (chunks, chunks + 100)
    )

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(chunks):
            await resp.write(TOKEN)
            await asyncio.sleep(interval_ms / 1000)
        await resp.write(usage)
        await resp.write_eof()
        return resp

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=STATIC_BACKEND_METRICS)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    web.run_app(app, host=HOST, port=port, print=None)


BODY = {
    "model": "bench-model",
    "messages": [{"role": "user", "content": "stream me some tokens " * 40}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


def tree_cpu(pid: int) -> float:
    """utime + stime (seconds) of `pid` and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        stats[int(entry)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            f = stats[p]
            total += (int(f[11]) + int(f[12])) / tick
        todo.extend(children.get(p, []))
    return total


async def client(url: str, requests: int, concurrency: int) -> tuple[int, int]:
    import aiohttp

    done = chunks = 0
    queue = iter(range(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done, chunks
        for _ in queue:
            async with session.post(url, json=BODY) as resp:
                assert resp.status == 200, resp.status
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        chunks += 1
            done += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return done, chunks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, default=200)
    p.add_argument("--interval-ms", type=float, default=2.0)
    p.add_argument("--requests", type=int, default=160)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ratios", default="0,0.05,1", help="override arms' --response-sample-ratio values")
    p.add_argument(
        "--min-intervals",
        default="",
        help="override arms' --response-sample-min-interval values, e.g. 0,2s (default: epp's default)",
    )
    p.add_argument("--serve-backend", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_backend:
        serve_backend(args.serve_backend, args.chunks, args.interval_ms)
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-override-"))
    (port,) = free_ports(1)
    backend = subprocess.Popen(
        [
            sys.executable,
            __file__,
            f"--serve-backend={port}",
            f"--chunks={args.chunks}",
            f"--interval-ms={args.interval_ms}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "backend.log", "wb"),  # noqa: SIM115
    )
    arms: list[tuple[str, float | None]] = [("duplex", None)]
    floors: dict[str, str] = {}  # arm -> its --response-sample-min-interval
    for r in args.ratios.split(","):
        if not args.min_intervals:
            arms.append((f"override@{r}", float(r)))
        for t in filter(None, args.min_intervals.split(",")):
            arms.append((f"override@{r}+min{t}", float(r)))
            floors[arms[-1][0]] = t
    rig: dict[str, tuple[EppServer, EnvoyServer, str]] = {}
    rows: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)
        for name, ratio in arms:
            extra = ["--log-level", "warning"]
            if ratio is not None:
                extra += ["--response-sample-ratio", str(ratio)]
            if name in floors:
                extra += ["--response-sample-min-interval", floors[name]]
            epp = EppServer(
                work / f"epp-{name}.log", endpoints=[f"{HOST}:{port}"], extra_args=extra, name=name
            )
            epp.start()
            listen, admin = free_ports(2)
            params = ge.GatewayParams(
                listen_port=listen, admin_port=admin, epp_addresses=(epp.grpc_address,), route_timeout=120.0
            )
            if ratio is not None:
                params = ge.override_params(params)
            front = EnvoyServer(work, params, name=f"envoy-{name}")
            front.start()
            url = f"http://{HOST}:{listen}/v1/chat/completions"
            rig[name] = (epp, front, url)
            asyncio.run(client(url, 4, 2))  # warm-up: connections, scraper, tokenizer
        for rnd in range(args.rounds):
            for name, _ in arms:
                epp, front, url = rig[name]
                assert epp.process.proc is not None
                pid = epp.process.proc.pid
                msgs0 = _msgs(front)
                cpu0, envoy0, t0 = tree_cpu(pid), tree_cpu(front.pid), time.monotonic()
                done, chunks = asyncio.run(client(url, args.requests, args.concurrency))
                wall = time.monotonic() - t0
                cpu = tree_cpu(pid) - cpu0
                envoy_cpu = tree_cpu(front.pid) - envoy0
                msgs = _msgs(front) - msgs0
                # epp's background work (metrics scraping, timers) over the same wall time, idle.
                idle0 = tree_cpu(pid)
                time.sleep(wall)
                idle = tree_cpu(pid) - idle0
                row = {
                    "arm": name,
                    "round": rnd,
                    "requests": done,
                    "chunks_per_request": chunks / done,
                    "ext_proc_msgs_per_request": msgs / done,
                    "epp_cpu_ms_per_request": 1000 * cpu / done,
                    "epp_net_cpu_ms_per_request": 1000 * (cpu - idle) / done,
                    "envoy_cpu_ms_per_request": 1000 * envoy_cpu / done,
                    "req_per_s": done / wall,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for epp, front, _ in rig.values():
            front.stop()
            epp.stop()
        backend.terminate()
        backend.wait(5)
    print()
    print("| arm | epp CPU ms / request | same, net of idle background | Envoy CPU ms / request | req/s |")
    print("|---|---|---|---|---|")
    for name, _ in arms:
        mine = [r for r in rows if r["arm"] == name]

        def cell(key: str, rows: list[dict[str, Any]] = mine) -> str:
            vals = [r[key] for r in rows]
            return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"

        print(
            f"| {name} | {cell('epp_cpu_ms_per_request')} | {cell('epp_net_cpu_ms_per_request')} "
            f"| {cell('envoy_cpu_ms_per_request')} "
            f"| {cell('req_per_s')} |"
        )
    return 0


def _msgs(front: EnvoyServer) -> int:
    """Messages Envoy sent to epp so far (its ext_proc filter's counter)."""
    return int(front.admin_stats().get("http.gateway.ext_proc.stream_msgs_sent", "0"))


if __name__ == "__main__":
    sys.exit(main())
