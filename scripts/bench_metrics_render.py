"""Benchmark (a script): what a Prometheus scrape of epp's /metrics costs the event loop.

Fills every client-chosen label to its cap as `scripts/metrics_page_size.py` does (routing through
a Director with distinct model names, rewrites and fairness IDs), serves the metrics port's app
in this process, and scrapes it while a probe task measures the event loop's lag (a 1 ms sleep's
overshoot). Two arms alternate scrape by scrape: `loop` writes the page with `generate_latest` in
the handler, as epp did; `render` is epp's handler (epp.observability.exposition: collected in
steps on the loop, written in a thread). The GIL's switch interval is set as `epp serve` sets it.

    .venv/bin/python scripts/bench_metrics_render.py [--requests 3000] [--scrapes 20]

Prints, per arm: the page size, the scrape's wall time (p50, max), the process's CPU per scrape, and
the loop lag while scrapes run (p50, p99, max; samples taken only while a scrape is in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import aiohttp
import metrics_page_size  # the sibling script that fills the labels (this script's directory)
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epp.observability import http, metrics
from epp.serve import GIL_SWITCH_INTERVAL


async def _on_loop(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(metrics.REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def main(requests: int, scrapes: int) -> None:
    await metrics_page_size.drive(requests, requests)
    app = http.build_app()
    app.router.add_get("/metrics-on-loop", _on_loop)
    runner = await http.start(app, host="127.0.0.1", port=0)
    port = runner.addresses[0][1]
    samples: list[tuple[float, float]] = []  # (when the probe woke, its lag)
    windows: dict[str, list[tuple[float, float]]] = {"loop": [], "render": []}

    async def probe() -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            samples.append((now, now - t0 - 0.001))

    probing = asyncio.create_task(probe())
    walls: dict[str, list[float]] = {"loop": [], "render": []}
    cpus: dict[str, list[float]] = {"loop": [], "render": []}
    sizes: dict[str, int] = {}
    paths = {"loop": "/metrics-on-loop", "render": "/metrics"}
    async with aiohttp.ClientSession() as session:
        for i in range(2 * scrapes + 2):
            arm = "loop" if i % 2 == 0 else "render"
            c0, t0 = time.process_time(), time.perf_counter()
            async with session.get(f"http://127.0.0.1:{port}{paths[arm]}") as response:
                body = await response.read()
            t1 = time.perf_counter()
            await asyncio.sleep(0.05)  # the probe's sample that ends a stall falls in the window
            if i < 2:  # one warm-up scrape per arm
                continue
            windows[arm].append((t0, t1 + 0.01))
            walls[arm].append(t1 - t0)
            cpus[arm].append(time.process_time() - c0)
            sizes[arm] = len(body)
    probing.cancel()
    await runner.cleanup()
    for name in ("loop", "render"):
        xs = sorted(lag for at, lag in samples if any(a <= at <= b for a, b in windows[name]))
        w = sorted(walls[name])
        print(
            f"{name:>6}: page {sizes[name] / 1e6:.2f} MB; "
            f"scrape wall p50 {1e3 * statistics.median(w):.1f} ms, max {1e3 * w[-1]:.1f}; "
            f"CPU {1e3 * statistics.median(cpus[name]):.1f} ms per scrape; "
            f"loop lag during scrapes p50 {1e3 * statistics.median(xs):.2f} ms, "
            f"p99 {1e3 * xs[int(0.99 * (len(xs) - 1))]:.2f}, max {1e3 * xs[-1]:.2f} ({len(xs)} samples)"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--requests", type=int, default=3000, help="distinct names routed (the caps bind past ~1,000)"
    )
    ap.add_argument("--scrapes", type=int, default=20, help="scrapes per arm")
    args = ap.parse_args()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    asyncio.run(main(args.requests, args.scrapes))
