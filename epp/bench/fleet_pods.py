"""Cheap simulated vLLM pods for `epp bench fleet`: many per process, each a /metrics and a KV-event
stream, nothing else.

What a router pays per pod is in the pages it scrapes and the events it decodes, so these pods
serve exactly those and no model: each listens on its own port of 127.0.0.1 and answers
- `GET /metrics`: a real vLLM 0.32 page (epp/bench/data/vllm-0.32-metrics.txt: 54.6 KB, 642 lines,
  histograms included, captured by scripts/capture_vllm_metrics.py after 24 requests), and
  `GET /metrics/?name[]=...` the series named, as vLLM's prometheus_client app under `/metrics/`
  filters them (`epp.sim.metrics_page.restrict`). The page is re-rendered once a second with new
  `process_*` values, as a live server's changes even when idle, and, while events flow, with the
  queue, running and KV-usage gauges moving;
- `GET /v1/models`: one model card;
over raw asyncio protocols with keep-alive (a few microseconds a request, so that hundreds of pods
fit in one process beside the router on a small machine);
- and a ZMQ PUB socket per pod publishing vLLM's wire format (`[topic, seq, msgpack batch]`, map
  form, integer hashes) at `rate` blocks per second: chunked-prefill `BlockStored` events of
  `blocks_per_event` blocks of 16 tokens, each request's chain continuing its parent, and a
  `BlockRemoved` for every block past `cache_blocks` (the pod's LRU). Each pod cycles through a
  fixed, pre-encoded set of requests (its cache turns over, the index sees stores and removals
  of the same records again and again), so publishing costs a send, not an encode: the rate
  measured is the router's. Only the batch timestamp is written at send time.

Control: JSON lines on stdin (`{"rate": blocks/s per pod}`, `{"stats": true}`, `{"stop": true}`);
answers and the start-up line (`{"pods": [{"name", "address", "port", "kv_events"}]}`) on stdout.
Run by `epp.bench.fleet`, several processes for large fleets (`python -m epp.bench.fleet_pods`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import struct
import sys
import threading
import time
import urllib.parse
from collections import deque
from importlib import resources
from typing import Any

import zmq

from epp.kvcache.events import BlockRemoved, BlockStored
from epp.sim.kvpublisher import encode_map_events
from epp.sim.metrics_page import as_vllm_serves

HOST = "127.0.0.1"
BLOCK_SIZE = 16
MODEL = "tiny"
_GAUGES = (
    b'vllm:num_requests_running{engine="0",model_name="tiny"} ',
    b'vllm:num_requests_waiting{engine="0",model_name="tiny"} ',
    b'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} ',
)


def load_page() -> bytes:
    return resources.files("epp.bench").joinpath("data/vllm-0.32-metrics.txt").read_bytes()


class Pages:
    """The page every pod serves, re-rendered once a second (shared: values are what differ
    between pods, and a router's cost does not depend on them)."""

    def __init__(self, page: bytes) -> None:
        self._template = page
        self.busy = False
        self.body = b""
        self.response = b""
        self._rng = random.Random(1)
        self._cpu = 8.65
        self.render()

    def render(self) -> None:
        self._cpu += 0.01 + (0.2 if self.busy else 0.0)
        lines = self._template.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(b"process_cpu_seconds_total "):
                lines[i] = b"process_cpu_seconds_total %.2f" % self._cpu
            elif self.busy and line.startswith(_GAUGES):
                name, _ = line.rsplit(b" ", 1)
                value = self._rng.random() if b"kv_cache" in name else float(self._rng.randrange(8))
                lines[i] = name + b" %r" % value
        self.body = b"\n".join(lines)
        self.response = _ok(self.body)
        self._filtered: dict[bytes, bytes] = {}

    def filtered(self, query: bytes) -> bytes:
        """The response to `/metrics/?<query>`: the page restricted to the `name[]`s it names."""
        response = self._filtered.get(query)
        if response is None:
            names = urllib.parse.parse_qs(query.decode("latin-1")).get("name[]", [])
            response = self._filtered[query] = _ok(
                as_vllm_serves(self.body.decode(), "/metrics/", names).encode()
            )
        return response


def _ok(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body


_MODELS_BODY = json.dumps(
    {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 262_144, "parent": None}]}
).encode()
_MODELS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(_MODELS_BODY),
    _MODELS_BODY,
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class _Http(asyncio.Protocol):
    """HTTP/1.1 GETs with keep-alive; requests carry no body (a scraper's)."""

    def __init__(self, pages: Pages, counts: list[int]) -> None:
        self._pages = pages
        self._counts = counts
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while (end := self._buf.find(b"\r\n\r\n")) >= 0:
            head, self._buf = self._buf[:end], self._buf[end + 4 :]
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
            if path.startswith(b"/metrics/?"):
                self._counts[0] += 1
                reply = self._pages.filtered(path[len(b"/metrics/?") :])
            elif path.startswith(b"/metrics"):
                self._counts[0] += 1
                reply = self._pages.response
            elif path.startswith(b"/v1/models"):
                reply = _MODELS
            else:
                reply = _NOT_FOUND
            assert self._transport is not None
            self._transport.write(reply)


class _Pod:
    """One pod's KV-event stream: pre-encoded batches of its requests, cycled."""

    __slots__ = ("batches", "credit", "next", "seq", "sock")

    def __init__(self, sock: zmq.Socket[bytes], batches: list[tuple[bytes, int]]) -> None:
        self.sock = sock
        self.batches = batches  # (encoded events array, blocks stored)
        self.next = 0
        self.seq = 0
        self.credit = 0.0


def pod_batches(
    rng: random.Random, *, blocks_per_event: int, cache_blocks: int, requests: int
) -> list[tuple[bytes, int]]:
    """A pod's cycle of event batches: `requests` prompts of 1-4 events each, chained, with the
    removals its LRU makes (one batch per engine step, as vLLM publishes), then the removal of
    what the cache still holds."""
    out: list[tuple[bytes, int]] = []
    lru: deque[int] = deque()
    for _ in range(requests):
        parent: int | None = None
        for _ in range(rng.randint(1, 4)):
            hashes = [rng.getrandbits(64) for _ in range(blocks_per_event)]
            tokens = [rng.randrange(32_000) for _ in range(blocks_per_event * BLOCK_SIZE)]
            events: list[Any] = [
                BlockStored(
                    block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=BLOCK_SIZE
                )
            ]
            parent = hashes[-1]
            lru.extend(hashes)
            gone = [lru.popleft() for _ in range(max(0, len(lru) - cache_blocks))]
            if gone:
                events.append(BlockRemoved(block_hashes=gone))
            out.append((encode_map_events(events), blocks_per_event))
    # The cycle ends with its cache emptied, so that it can start again from the same stores.
    out.append((encode_map_events([BlockRemoved(block_hashes=list(lru))]), 0))
    return out


def _payload(events: bytes, ts: float) -> bytes:
    """msgpack `[ts, events, 0]`, the events array already encoded (vLLM >= 0.24's map form)."""
    return b"\x93\xcb" + struct.pack(">d", ts) + events + b"\x00"


class Publisher:
    """Every pod's PUB socket, on one thread: a tick every 10 ms sends each pod its due batches."""

    TICK_S = 0.01

    def __init__(self, pods: list[_Pod]) -> None:
        self.pods = pods
        self.rate = 0.0
        self.sent_batches = 0
        self.sent_blocks = 0
        self.dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-publisher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.TICK_S):
            now = time.monotonic()
            dt, last = now - last, now
            if self.rate <= 0:
                continue
            ts = time.time()
            for pod in self.pods:
                pod.credit += self.rate * dt
                while pod.credit > 0:  # the cycle's last batch (removals only) costs no credit
                    events, blocks = pod.batches[pod.next]
                    pod.next = (pod.next + 1) % len(pod.batches)
                    pod.credit -= blocks
                    # Counted before the send: a subscriber that got the batch and then asks for
                    # the stats must find it counted (CI once read 0 batches after one arrived).
                    self.sent_batches += 1
                    self.sent_blocks += blocks
                    try:
                        pod.sock.send_multipart(
                            [b"", pod.seq.to_bytes(8, "big"), _payload(events, ts)], zmq.NOBLOCK
                        )
                    except zmq.Again:  # the subscriber's queue is full: lost, as with vLLM
                        self.sent_batches -= 1
                        self.sent_blocks -= blocks
                        self.dropped += 1
                    pod.seq += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def serve(args: argparse.Namespace) -> None:
    pages = Pages(load_page())
    counts = [0]
    loop = asyncio.get_running_loop()
    ctx = zmq.Context()
    servers = []
    pods = []
    listing = []
    rng = random.Random(args.seed)
    for i in range(args.count):
        server = await loop.create_server(lambda: _Http(pages, counts), HOST, 0, backlog=64)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 100_000)  # vLLM's default
        kv_port = sock.bind_to_random_port(f"tcp://{HOST}")
        batches = pod_batches(
            rng,
            blocks_per_event=args.blocks_per_event,
            cache_blocks=args.cache_blocks,
            requests=args.requests,
        )
        pods.append(_Pod(sock, batches))
        listing.append(
            {
                "name": f"{args.prefix}{i}",
                "address": HOST,
                "port": port,
                "kv_events": f"tcp://{HOST}:{kv_port}",
            }
        )
    publisher = Publisher(pods)
    print(json.dumps({"pods": listing}), flush=True)

    async def rerender() -> None:
        while True:
            await asyncio.sleep(1.0)
            pages.busy = publisher.rate > 0
            pages.render()

    render_task = asyncio.create_task(rerender())
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := await reader.readline():
            try:
                cmd = json.loads(line)
            except ValueError:
                continue
            if "rate" in cmd:
                publisher.rate = float(cmd["rate"])
            if cmd.get("stats"):
                out = {
                    "scrapes": counts[0],
                    "batches": publisher.sent_batches,
                    "blocks": publisher.sent_blocks,
                    "dropped": publisher.dropped,
                }
                print(json.dumps(out), flush=True)
            if cmd.get("stop"):
                break
    finally:
        render_task.cancel()
        publisher.stop()
        for server in servers:
            server.close()
        for pod in pods:
            pod.sock.close(linger=0)
        ctx.term()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--prefix", default="pod-")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--blocks-per-event", type=int, default=16)
    parser.add_argument("--cache-blocks", type=int, default=2048, help="the pod's KV cache, in blocks")
    parser.add_argument("--requests", type=int, default=64, help="requests in each pod's cycle")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
