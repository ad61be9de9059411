"""Microbenchmark (a script, not a test): epp's own work per ext-proc stream, no gRPC.

Drives `Stream.handle` with the four messages Envoy sends for a request with response processing
(request headers, a 4 KB chat body, response headers, a JSON response body) against a real
director and scheduler over 2 endpoints, and prints the mean per stream for the default config and
for a round-robin-only config (the framework's floor).

    .venv/bin/python -m tests.extproc.bench_stream
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time

import msgspec

from epp.extproc import messages as m
from epp.extproc.stream import Stream
from tests.extproc import helpers as h

ROUND_ROBIN = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins: [{type: round-robin-picker}]
schedulingProfiles: [{name: default, plugins: [{pluginRef: round-robin-picker}]}]
"""
BODY = msgspec.json.encode(
    {"model": "m", "messages": [{"role": "system", "content": "s" * 3800}, {"role": "user", "content": "hi"}]}
)
MESSAGES = (
    h.headers_msg(h.post_headers()),
    h.body_msg(BODY),
    h.response_headers_msg(200),
    h.response_body_msg(b'{"model":"m","usage":{"prompt_tokens":5,"completion_tokens":1}}', eos=True),
)


async def per_stream_us(config: str | None, n: int = 20_000, rounds: int = 5) -> list[float]:
    director, _ = h.make_director(2, config=config)

    async def one() -> None:
        stream = Stream(director)
        for msg in MESSAGES:  # as the server dispatches them
            if msg.HasField("response_body"):
                stream.response_body(msg)
            else:
                await stream.handle(msg)
        stream.close()

    for _ in range(2_000):
        await one()
    out = []
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter()
        for _ in range(n):
            await one()
        out.append((time.perf_counter() - start) / n * 1e6)
    return out


SSE_HEADERS = {"content-type": "text/event-stream"}
CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n'
)


async def per_chunk_us(n: int = 100_000, rounds: int = 5) -> list[float]:
    director, _ = h.make_director(2)
    stream = Stream(director)
    await stream.handle(h.headers_msg(h.post_headers()))
    await stream.handle(h.body_msg(BODY))
    await stream.handle(h.response_headers_msg(200, **SSE_HEADERS))
    raw = h.response_body_msg(CHUNK, eos=False).SerializeToString()
    parse = m.ProcessingRequest.FromString
    fast = getattr(stream, "response_body", None)
    out = []
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter()
        if fast is not None:
            for _ in range(n):
                fast(parse(raw))
        else:  # before the per-token path: the coroutine, then each message serialized by gRPC
            for _ in range(n):
                for response in await stream.handle(parse(raw)):
                    response.SerializeToString()
        out.append((time.perf_counter() - start) / n * 1e6)
    stream.close()
    return out


async def main() -> None:
    for label, config in (("default config", None), ("round-robin only", ROUND_ROBIN)):
        runs = await per_stream_us(config)
        each = ", ".join(f"{r:.1f}" for r in runs)
        print(f"{label:18} median {statistics.median(runs):6.1f} us per stream  (runs: {each})")
    runs = await per_chunk_us()
    each = ", ".join(f"{r:.2f}" for r in runs)
    print(f"{'streamed chunk':18} median {statistics.median(runs):6.2f} us per chunk   (runs: {each})")


if __name__ == "__main__":
    asyncio.run(main())
