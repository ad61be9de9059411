"""Benchmark (a script, not a test): what asking the model servers' /render for token ids adds to a
routing decision, against epp's local tokenizer, in the same run.

    .venv/bin/python -m tests.tokenize.bench_render [--vllm URL --model NAME] [--requests 200]
        [--concurrency 1,8] [--sizes short,4k]

Each measure is the time epp's request path waits for a chat request's ids: locally
(`Tokenizers.encode_dialect`, the template rendered after vLLM's preprocessing, then encoded) and
through `epp.tokenize.render.Renderer` (one HTTP call to `/v1/chat/completions/render`, the
answer decoded). Prompts: `short` (one user message, ~30 tokens) and `4k` (a 10-turn chat of
~4,000 tokens), each request with a unique prefix (cold: nothing cached anywhere) or the same
body again (`repeat`: the renderer's cache, the local prefix cache). At each concurrency the
requests run that many at a time. Reported: p50 / p90 / p99 ms per request, and the CPU seconds
of this process per request (the renderer's HTTP client against the local tokenizer's work).

The server: `--vllm URL` (a vLLM 0.32 started with `--enable-scale-out` serving `--model`, whose
tokenizer directory `--tokenizer` names for the local side), or by default an `epp sim` subprocess
on this machine (epp-tiny; its render route is epp's own code, so only the HTTP and the server's
Python differ from a real vLLM). The ids of both sides are compared on every request.

On a shared machine the timings are noise; the ratio in one run is what this is for. Run it
on a quiet machine:
    .venv/bin/python -m tests.tokenize.bench_render --requests 400 --concurrency 1,8,32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from epp.tokenize import render
from epp.tokenize.dialects import Dialect
from epp.tokenize.registry import Tokenizers
from epp.tokenize.render import Renderer, RenderSpec
from epp.tokenize.tokenizer import Tokenizer, load_shipped

WORDS = [
    "gateway",
    "router",
    "token",
    "prefix",
    "cache",
    "block",
    "replica",
    "latency",
    "queue",
    "picker",
    "scorer",
    "filter",
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def chat(rng: random.Random, size: str, model: str, unique: bool) -> dict[str, Any]:
    head = f"Request {rng.randrange(10**9)}. " if unique else "A fixed opening. "  # a cold prefix
    if size == "short":
        messages = [{"role": "user", "content": head + _text(rng, 20)}]
    else:
        messages = [{"role": "system", "content": head + _text(rng, 200)}]
        for _ in range(5):
            messages.append({"role": "user", "content": _text(rng, 300)})
            messages.append({"role": "assistant", "content": _text(rng, 300)})
        messages.append({"role": "user", "content": _text(rng, 100)})
    return {"model": model, "messages": messages, "max_tokens": 1}


@contextlib.contextmanager
def sim_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "epp", "sim", "--port", str(port), "--served-model-name", "m"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/health", timeout=1).close()
                break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def measure(
    get: Callable[[dict[str, Any]], Awaitable[list[int] | None]],
    bodies: list[dict[str, Any]],
    concurrency: int,
) -> tuple[list[float], float, list[list[int] | None]]:
    """Per-request wall ms, this process's CPU s per request, and the ids, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)
    times: list[float] = [0.0] * len(bodies)
    ids: list[list[int] | None] = [None] * len(bodies)

    async def one(i: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            ids[i] = await get(bodies[i])
            times[i] = (time.perf_counter() - t0) * 1e3

    cpu0 = time.process_time()
    await asyncio.gather(*(one(i) for i in range(len(bodies))))
    return times, (time.process_time() - cpu0) / len(bodies), ids


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--vllm", help="a vLLM 0.32 --enable-scale-out base URL (default: an epp sim)")
    parser.add_argument("--model", default="m")
    parser.add_argument("--tokenizer", help="the model's tokenizer directory (default epp-tiny)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--sizes", default="short,4k")
    args = parser.parse_args()
    tok = Tokenizer.load(Path(args.tokenizer)) if args.tokenizer else load_shipped()
    local = Tokenizers(by_model={args.model: tok}, workers=2)
    server = contextlib.nullcontext(args.vllm) if args.vllm else sim_server()
    print(
        f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; server {args.vllm or 'epp sim'}"
    )
    print("size | cache | concurrency | side | p50 ms | p90 ms | p99 ms | CPU ms/request | ids equal")
    with server as url:
        assert url is not None
        for size in args.sizes.split(","):
            for repeat in (False, True):
                for concurrency in map(int, args.concurrency.split(",")):
                    rng = random.Random(f"{size}{repeat}{concurrency}")
                    if repeat:  # the same body every time
                        bodies = [chat(rng, size, args.model, unique=True)] * args.requests
                    else:
                        bodies = [chat(rng, size, args.model, unique=True) for _ in range(args.requests)]
                    renderer = Renderer({"": RenderSpec(url=url)}, lambda: [])
                    await renderer.render(
                        args.model, render.CHAT, chat(rng, size, args.model, True)
                    )  # connect

                    async def locally(body: dict[str, Any]) -> list[int] | None:
                        found = await local.encode_dialect(args.model, Dialect.CHAT, body)
                        return None if found is None else found[0]

                    async def rendered(body: dict[str, Any], r: Renderer = renderer) -> list[int] | None:
                        return await r.render(args.model, render.CHAT, body)

                    mine = await measure(locally, bodies, concurrency)
                    theirs = await measure(rendered, bodies, concurrency)
                    await renderer.close()
                    equal = sum(a == b for a, b in zip(mine[2], theirs[2], strict=True))
                    cache = "repeat" if repeat else "cold"
                    for side, (times, cpu, _) in (("local", mine), ("render", theirs)):
                        print(
                            f"{size} | {cache} | {concurrency} | {side} | {_pct(times, 50):.2f} | "
                            f"{_pct(times, 90):.2f} | {_pct(times, 99):.2f} | {cpu * 1e3:.3f} | "
                            f"{equal}/{len(bodies)}"
                        )
    local.close()


if __name__ == "__main__":
    asyncio.run(main())
