"""Model servers for `epp bench overhead --stream`: OpenAI chat-completion SSE streams, paced.

One process listens on several ports (one "pod" each). A POST answers `text/event-stream` with
`--chunks` chat.completion.chunk events (one output token each), then a usage event and
`data: [DONE]`. Each event is written and flushed on its own, `--interval-ms` apart, so Envoy
reads it from the socket alone and hands it to ext_proc as one response-body message (the
benchmark checks this with its floor arm, which counts the messages it answers). A request may ask
for another count with the `x-bench-chunks` header.

Every token event carries `"t"`: CLOCK_MONOTONIC in nanoseconds when the backend wrote it. The
client (`epp.bench.sse_client`, same machine, same clock) subtracts it from the arrival time: the
delay a chunk took through the gateway, whatever the backend's own pacing jitter.

GET /metrics answers a fixed vLLM exposition so epp's scraper keeps the pods routable. This runs
in its own process, so its CPU is never counted as epp's or Envoy's.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Sequence

from aiohttp import web

from epp.gateway.envoy import STATIC_BACKEND_METRICS

CHUNKS_HEADER = "x-bench-chunks"
MAX_CHUNKS = 100_000

_HEAD = b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"bench-model",'


def token_event(i: int, t_ns: int) -> bytes:
    """One streamed token in OpenAI's chunk shape, stamped with the backend's write time."""
    return (
        _HEAD
        + b'"choices":[{"index":0,"delta":{"content":" tok%d"},"logprobs":null,"finish_reason":null}],' % i
        + b'"t":%d}\n\n' % t_ns
    )


def usage_event(n: int) -> bytes:
    return (
        _HEAD
        + b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}],'
        + b'"usage":{"prompt_tokens":1000,"completion_tokens":%d,"total_tokens":%d}}\n\n' % (n, n + 1000)
        + b"data: [DONE]\n\n"
    )


def _chunk_count(request: web.Request, default: int) -> int:
    text = request.headers.get(CHUNKS_HEADER)
    if text is None:
        return default
    try:
        n = int(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{CHUNKS_HEADER} must be an integer") from None
    if not 0 <= n <= MAX_CHUNKS:
        raise web.HTTPBadRequest(text=f"{CHUNKS_HEADER} must be in 0..{MAX_CHUNKS}")
    return n


def make_app(chunks: int, interval_s: float) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()  # the body is not needed, but the connection must be drained
        n = _chunk_count(request, chunks)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        await resp.prepare(request)
        for i in range(n):
            await resp.write(token_event(i, time.monotonic_ns()))
            await asyncio.sleep(interval_s)
        await resp.write(usage_event(n))
        await resp.write_eof()
        return resp

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=STATIC_BACKEND_METRICS, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/{tail:.*}", completions)
    return app


async def serve(host: str, ports: Sequence[int], chunks: int, interval_s: float) -> None:
    runner = web.AppRunner(make_app(chunks, interval_s), access_log=None, handle_signals=False)
    await runner.setup()
    for port in ports:
        await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"sse backends on {host}:{','.join(map(str, ports))}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epp.bench.sse_backend", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ports", required=True, help="comma-separated ports, one pod each")
    parser.add_argument("--chunks", type=int, default=200, help="token events per response")
    parser.add_argument("--interval-ms", type=float, default=5.0, help="pause between token events")
    args = parser.parse_args(argv)
    ports = [int(p) for p in args.ports.split(",") if p]
    if not ports or args.chunks < 0 or args.interval_ms < 0:
        parser.error("need ports, and non-negative --chunks and --interval-ms")
    asyncio.run(serve(args.host, ports, args.chunks, args.interval_ms / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
