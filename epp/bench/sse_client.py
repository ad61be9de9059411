"""The load generator of `epp bench overhead --stream`: streamed chat requests, timed per chunk.

`--concurrency` workers each send streaming chat requests back to back for `--duration` seconds
(a request started in time is read to its end, so every chunk of every counted request falls
inside the run). For every SSE event the worker notes its arrival time (CLOCK_MONOTONIC) and:

* the inter-token latency (ITL): the gap since the previous event of the same response, which is
  what a user watching tokens sees;
* the chunk delay: arrival minus the `"t"` stamp the backend (`epp.bench.sse_backend`, same
  machine, same clock) wrote into the event when it sent it, i.e. the time the chunk spent in the
  gateway and on loopback, independent of the backend's pacing;
* the time to first token, from sending the request.

It prints one JSON object (counts and percentiles) on stdout. It runs as its own process so that
its CPU is apart from the gateway's; it uses aiohttp's client, whose cost is the same in every arm.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from epp.bench.sse_backend import CHUNKS_HEADER

_STAMP = b'"t":'
PERCENTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (NaN when there are none)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def stamp_ns(event: bytes) -> int | None:
    """The backend's `"t":<ns>` stamp of one SSE event, if it has one."""
    i = event.rfind(_STAMP)
    if i == -1:
        return None
    j = i + len(_STAMP)
    k = j
    while k < len(event) and 48 <= event[k] <= 57:
        k += 1
    return int(event[j:k]) if k > j else None


class Stats:
    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.events = 0
        self.itl_ms: list[float] = []
        self.delay_ms: list[float] = []
        self.ttft_ms: list[float] = []
        self.first_error = ""

    def summary(self, wall_s: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "errors": self.errors,
            "events": self.events,
            "wall_s": wall_s,
            "first_error": self.first_error,
        }
        for name, values in (("itl", self.itl_ms), ("delay", self.delay_ms), ("ttft", self.ttft_ms)):
            values.sort()
            for pct in PERCENTILES:
                out[f"{name}_p{pct}_ms"] = percentile(values, pct)
            out[f"{name}_n"] = len(values)
        return out


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], stats: Stats
) -> None:
    sent = time.monotonic_ns()
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            await resp.read()
            raise RuntimeError(f"HTTP {resp.status}")
        prev = 0
        while True:
            try:
                event = await resp.content.readuntil(b"\n\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial.strip():
                    raise RuntimeError("stream cut inside an event") from None
                break
            if not event:
                break
            now = time.monotonic_ns()
            stats.events += 1
            if prev:
                stats.itl_ms.append((now - prev) / 1e6)
            else:
                stats.ttft_ms.append((now - sent) / 1e6)
            prev = now
            t = stamp_ns(event)
            if t is not None:
                stats.delay_ms.append((now - t) / 1e6)
            if event.startswith(b"data: [DONE]"):
                break
        await resp.read()  # to the end of the body, so the connection is reused
    stats.requests += 1


async def run(
    url: str, body: bytes, concurrency: int, duration: float, chunks: int | None = None
) -> dict[str, Any]:
    stats = Stats()
    headers = {"content-type": "application/json"}
    if chunks is not None:
        headers[CHUNKS_HEADER] = str(chunks)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    t0 = time.monotonic()
    end = t0 + duration

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < end:
            try:
                await _one(session, url, body, headers, stats)
            except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                stats.errors += 1
                stats.first_error = stats.first_error or repr(exc)
                await asyncio.sleep(0.05)  # no hot loop against a gateway that refuses

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return stats.summary(time.monotonic() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epp.bench.sse_client", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--body-file", required=True, help="the JSON chat request to POST")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument(
        "--chunks", type=int, default=None, help=f"ask the backend for this many ({CHUNKS_HEADER})"
    )
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.duration <= 0:
        parser.error("--concurrency and --duration must be positive")
    with open(args.body_file, "rb") as f:
        body = f.read()
    result = asyncio.run(run(args.url, body, args.concurrency, args.duration, args.chunks))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
