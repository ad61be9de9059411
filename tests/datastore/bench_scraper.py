"""What the metrics scraper alone costs: epp's `MetricsScraper` in this process against
`epp.bench.fleet_pods` pods (a real vLLM 0.32 page each, the `name[]` filter served as vLLM serves
it), every pod at `--interval` or idle-paced (`--idle-interval`), for `--seconds` after a 2 s
warm-up. Prints this process's CPU as a share of a core and, with `--lag`, the lag of a 5 ms
ticker on the same event loop (p50, p99, max): how long the scrapes hold the loop (the ticker's
own wake-ups are then in the CPU figure).

Run: .venv/bin/python -m tests.datastore.bench_scraper --pods 8 [--idle-interval 0.5] [--lag] [--seconds 20]
Not a test (timings are machine-dependent); the numbers back docs/bench/fleet-cost.md#scrape-grid.
To compare two builds, run each from its own tree (`cd TREE && python -m ...`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.datastore.scraper import MetricsScraper


async def measure(pods: list[dict[str, object]], args: argparse.Namespace) -> str:
    ds = Datastore()
    ds.sync(
        "bench",
        [
            EndpointSpec(name=str(p["name"]), address=str(p["address"]), port=int(str(p["port"])))
            for p in pods
        ],
    )
    lags: list[float] = []

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + 0.005
            await asyncio.sleep(0.005)
            lags.append(loop.time() - due)

    scraper = MetricsScraper(ds, pool_name="bench", interval=args.interval, idle_interval=args.idle_interval)
    async with scraper:
        await asyncio.sleep(2.0)
        tick = asyncio.create_task(ticker()) if args.lag else None
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(args.seconds)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        if tick is not None:
            tick.cancel()
    out = f"{len(pods)} pods, interval {args.interval:g} s, idle interval {args.idle_interval:g} s: "
    out += f"{cpu / wall * 100:.1f}% of a core"
    if lags:
        lags.sort()
        p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
        out += f"; loop lag p50 {lags[len(lags) // 2] * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"
        out += f", max {lags[-1] * 1e3:.1f} ms"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--idle-interval", type=float, default=0.0, help="0: every pod at --interval")
    parser.add_argument("--lag", action="store_true", help="time a 5 ms ticker on the loop")
    args = parser.parse_args()
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.bench.fleet_pods", "--count", str(args.pods), "--requests", "8"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        pods = json.loads(proc.stdout.readline())["pods"]
        print(asyncio.run(measure(pods, args)))
    finally:
        proc.stdin.write(json.dumps({"stop": True}) + "\n")
        proc.stdin.flush()
        proc.wait(10)


if __name__ == "__main__":
    main()
