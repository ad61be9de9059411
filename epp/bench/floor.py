"""grpc-python's floor for the ext-proc protocol: a servicer that does nothing but answer.

`epp bench overhead --stream` runs this behind the same Envoy config as epp to measure what the
gRPC runtime alone costs per streamed chunk. It answers exactly the messages epp answers under
GIE's config (FULL_DUPLEX_STREAMED both ways): it routes each request round-robin over the given
endpoints once the request body is complete (the destination header and `envoy.lb` metadata, the
body echoed back), continues the response headers and trailers, and echoes every response-body
chunk as a StreamedBodyResponse, serialized as epp serializes it (`streamed_response_body_wire`).
No parsing, no scheduling, no metrics.

Servers (`--server`), to see what the runtime's shape costs:

* ``aio-generator``: grpc.aio, the handler an async generator (as epp's was);
* ``aio-readwrite``: grpc.aio, the handler a coroutine using `context.read()`/`context.write()`;
* ``sync``: grpcio's thread-pool server, one thread per stream;
* ``grpclib``: grpclib (pure Python HTTP/2 on asyncio, from PyPI; `pip install grpclib`), to see
  whether another gRPC server package costs less per message than grpcio's C core.

It counts the messages it answers by kind and writes them as JSON to `--stats-file` (at most
twice a second, and at exit), which is how the benchmark checks that Envoy sent each SSE event
as its own response-body message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.bench.overhead import FLOOR_SERVERS
from epp.extproc import messages as m

SERVERS = FLOOR_SERVERS


class _Floor:
    def __init__(self, endpoints: Sequence[str]) -> None:
        self._next = itertools.cycle(endpoints).__next__
        self.counts: Counter[str] = Counter()

    def answer(self, msg: m.ProcessingRequest, body: list[bytes]) -> list[m.ProcessingResponse | bytes]:
        """The responses to one message; `body` collects the request body of the stream."""
        kind = msg.WhichOneof("request")
        self.counts[kind or "empty"] += 1
        if kind == "response_body":
            rb = msg.response_body
            return list(m.streamed_response_body_wire(rb.body, rb.end_of_stream))
        if kind == "request_body":
            body.append(msg.request_body.body)
            if not msg.request_body.end_of_stream:
                return []
            dest = self._next()
            whole = b"".join(body)
            return [
                m.routed_headers(dest, {"content-length": str(len(whole))}),
                *m.streamed_request_body(whole),
            ]
        if kind == "request_headers":
            return [m.routed_headers(self._next(), {})] if msg.request_headers.end_of_stream else []
        if kind == "response_headers":
            return [m.CONTINUE_RESPONSE_HEADERS]
        if kind == "request_trailers":
            return [m.CONTINUE_REQUEST_TRAILERS]
        if kind == "response_trailers":
            return [m.CONTINUE_RESPONSE_TRAILERS]
        return []


class AioGenerator(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, floor: _Floor) -> None:
        self.floor = floor

    async def Process(
        self, request_iterator: AsyncIterator[m.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[m.ProcessingResponse | bytes]:
        body: list[bytes] = []
        async for msg in request_iterator:
            for response in self.floor.answer(msg, body):
                yield response


class AioReadWrite(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, floor: _Floor) -> None:
        self.floor = floor

    async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        body: list[bytes] = []
        read, write, answer, eof = context.read, context.write, self.floor.answer, grpc.aio.EOF
        while True:
            msg = await read()
            if msg is eof:
                return
            for response in answer(msg, body):
                await write(response)


class Sync(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, floor: _Floor) -> None:
        self.floor = floor
        self._lock = threading.Lock()  # the counters are shared by the pool's threads

    def Process(
        self, request_iterator: Iterator[m.ProcessingRequest], context: grpc.ServicerContext
    ) -> Iterator[m.ProcessingResponse | bytes]:
        body: list[bytes] = []
        for msg in request_iterator:
            with self._lock:
                responses = self.floor.answer(msg, body)
            yield from responses


_OPTIONS = [("grpc.max_concurrent_streams", 100000), ("grpc.so_reuseport", 0)]


def _serialize(response: m.ProcessingResponse | bytes) -> bytes:
    if type(response) is bytes:
        return response
    return response.SerializeToString()  # type: ignore[union-attr,no-any-return]


def _register(server: grpc.Server | grpc.aio.Server, servicer: Any) -> None:
    """As epp registers its servicer: answers may come serialized already (the streamed chunks)."""
    handlers = {
        "Process": grpc.stream_stream_rpc_method_handler(
            servicer.Process,
            request_deserializer=m.ProcessingRequest.FromString,
            response_serializer=_serialize,
        )
    }
    service = "envoy.service.ext_proc.v3.ExternalProcessor"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


def _write_stats(path: Path | None, floor: _Floor, last: dict[str, Any]) -> None:
    if path is None:
        return
    counts = dict(floor.counts)
    if counts != last:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(counts))
        tmp.replace(path)
        last.clear()
        last.update(counts)


async def _until_stopped(floor: _Floor, stats: Path | None) -> dict[str, Any]:
    """Until SIGTERM or SIGINT, the message counts go to `stats` every 0.5 s (off the message
    path); returns the counts last written."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    last: dict[str, Any] = {}
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
        _write_stats(stats, floor, last)
    return last


async def _serve_aio(address: str, floor: _Floor, style: str, stats: Path | None) -> None:
    server = grpc.aio.server(options=_OPTIONS)
    servicer = AioGenerator(floor) if style == "aio-generator" else AioReadWrite(floor)
    _register(server, servicer)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    print(f"floor ({style}) on {address}", flush=True)
    last = await _until_stopped(floor, stats)
    await server.stop(1)
    _write_stats(stats, floor, last)


def _serve_sync(address: str, floor: _Floor, stats: Path | None, threads: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=_OPTIONS)
    servicer = Sync(floor)
    _register(server, servicer)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    print(f"floor (sync, {threads} threads) on {address}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    last: dict[str, Any] = {}
    while not stop.wait(0.5):
        with servicer._lock:
            _write_stats(stats, floor, last)
    server.stop(1).wait()
    _write_stats(stats, floor, last)


async def _serve_grpclib(address: str, floor: _Floor, stats: Path | None) -> None:
    try:
        # Not a dependency of epp: only this floor variant uses it.
        from grpclib.const import Cardinality, Handler  # type: ignore[import-not-found,unused-ignore]
        from grpclib.encoding.proto import ProtoCodec  # type: ignore[import-not-found,unused-ignore]
        from grpclib.server import Server, Stream  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise SystemExit("--server grpclib needs grpclib: pip install grpclib") from None

    class Codec(ProtoCodec):  # type: ignore[misc,unused-ignore]
        def encode(self, message: Any, message_type: Any) -> bytes:
            return _serialize(message)

    class Servicer:
        def __mapping__(self) -> dict[str, Handler]:
            path = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
            types = (m.ProcessingRequest, m.ProcessingResponse)
            return {path: Handler(self.process, Cardinality.STREAM_STREAM, *types)}

        async def process(self, stream: Stream[m.ProcessingRequest, Any]) -> None:
            body: list[bytes] = []
            async for msg in stream:
                for response in floor.answer(msg, body):
                    await stream.send_message(response)

    host, _, port = address.rpartition(":")
    server = Server([Servicer()], codec=Codec())
    await server.start(host, int(port))
    print(f"floor (grpclib) on {address}", flush=True)
    last = await _until_stopped(floor, stats)
    server.close()
    await server.wait_closed()
    _write_stats(stats, floor, last)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epp.bench.floor", description=__doc__)
    parser.add_argument("--address", required=True, help="host:port to listen on")
    parser.add_argument("--endpoints", required=True, help="comma-separated host:port to route to")
    parser.add_argument("--server", choices=SERVERS, default="aio-readwrite")
    parser.add_argument("--threads", type=int, default=256, help="sync server: pool size (one per stream)")
    parser.add_argument("--stats-file", default="", help="where to write the message counts (JSON)")
    args = parser.parse_args(argv)
    endpoints = [e for e in args.endpoints.split(",") if e]
    if not endpoints:
        parser.error("--endpoints is empty")
    floor = _Floor(endpoints)
    stats = Path(args.stats_file) if args.stats_file else None
    t0 = time.monotonic()
    if args.server == "sync":
        _serve_sync(args.address, floor, stats, args.threads)
    elif args.server == "grpclib":
        asyncio.run(_serve_grpclib(args.address, floor, stats))
    else:
        asyncio.run(_serve_aio(args.address, floor, args.server, stats))
    print(f"floor stopped after {time.monotonic() - t0:.1f} s: {dict(floor.counts)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
