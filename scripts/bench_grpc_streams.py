"""grpc.aio's own cost per ext-proc-shaped stream, without epp (a script, not a test): what the
gRPC runtime charges before epp does any work, and how fast it takes a burst of new streams.

    .venv/bin/python scripts/bench_grpc_streams.py                       # this venv's grpcio
    .venv/bin/python scripts/bench_grpc_streams.py --server-python /tmp/g183/bin/python
        # the server under another interpreter, e.g. a venv with `pip install grpcio==1.83.2`

The server (a process of its own, started with `--server-python`, default this interpreter)
serves ExternalProcessor/Process at the bytes level: every message in gets a 200-byte answer, as
epp answers an off-sample request's three messages (request headers, body, response headers).
The client (this process, grpc.aio, one channel like Envoy's) runs two phases:

- `rate`: `--streams` streams, `--concurrency` at a time, each sending a 600-byte headers
  message, a 16,000-byte body and a 300-byte response-headers message and reading each answer;
  prints the server's CPU per stream.
- `burst`: `--burst` streams opened at once; prints when each got its first answer (p50, p99,
  last) and the server's CPU. epp's handler cannot see a stream before grpc.aio hands it over, so
  this is the floor under what a probe request waits behind a burst
  (docs/reliability.md#thousands-of-new-streams-at-once-what-a-client-gets).

`--server grpclib` serves the same bytes with grpclib (a pure-Python gRPC server on h2) instead
of grpc.aio: whether another runtime takes a burst sooner. Give it a `--server-python` whose
environment has grpclib (`python -m venv /tmp/gl && /tmp/gl/bin/pip install grpclib`).

`--registered` also registers the method (`add_registered_method_handlers`, as epp does):
grpcio 1.84 changed the server's accept loop to an `asyncio.wait` over one task per registered
method and RPC (grpc/grpc#41796); docs/bench/overhead.md#streamed has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
PATH = f"/{SERVICE}/Process"
ANSWER = b"x" * 200
MESSAGES = (b"h" * 600, b"b" * 16_000, b"r" * 300)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


async def serve_grpclib(port: int, stats: Path) -> None:
    """The same servicer on grpclib, messages passed through as bytes."""
    from grpclib.const import Cardinality, Handler  # type: ignore[import-not-found,unused-ignore]
    from grpclib.encoding.base import CodecBase  # type: ignore[import-not-found,unused-ignore]
    from grpclib.server import Server as GrpclibServer  # type: ignore[import-not-found,unused-ignore]

    class Raw(CodecBase):  # type: ignore[misc]
        __content_subtype__ = "proto"

        def encode(self, message: bytes, message_type: object) -> bytes:
            return message

        def decode(self, data: bytes, message_type: object) -> bytes:
            return data

    async def process(stream: Any) -> None:
        async for _ in stream:
            await stream.send_message(ANSWER)

    class Service:
        def __mapping__(self) -> dict[str, object]:
            return {PATH: Handler(process, Cardinality.STREAM_STREAM, bytes, bytes)}

    server = GrpclibServer([Service()], codec=Raw())
    await server.start("127.0.0.1", port)
    await _until_stopped(stats, "grpclib")
    server.close()
    await server.wait_closed()


async def _until_stopped(stats: Path, version: str) -> None:
    """Answer SIGUSR1 with this process's CPU (in `stats`) until SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, lambda: stats.write_text(json.dumps({"cpu": _cpu()})))
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(json.dumps({"ready": version}), flush=True)
    await stop.wait()


async def serve(port: int, registered: bool, stats: Path) -> None:
    async def process(request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        while await context.read() is not grpc.aio.EOF:
            await context.write(ANSWER)

    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", 100_000),
            ("grpc.server.max_pending_requests", 100_000),
            ("grpc.server.max_pending_requests_hard_limit", 100_000),
        ]
    )
    handler = grpc.stream_stream_rpc_method_handler(process)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Process": handler}),))
    if registered:
        server.add_registered_method_handlers(SERVICE, {"Process": handler})
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await _until_stopped(stats, f"grpcio {grpc.__version__}")
    await server.stop(None)


class Server:
    def __init__(self, python: str, registered: bool, kind: str) -> None:
        self._stats = Path(tempfile.mkstemp(suffix=".json")[1])
        # Imported here: the server side runs this file under `--server-python`, which may be a
        # venv holding grpcio alone.
        from epp.gateway.processes import free_ports

        (self.port,) = free_ports(1)
        argv = [python, __file__, "--serve", str(self.port), "--stats", str(self._stats), "--server", kind]
        self._proc = subprocess.Popen(argv + (["--registered"] if registered else []), stdout=subprocess.PIPE)
        assert self._proc.stdout is not None
        self.version = json.loads(self._proc.stdout.readline())["ready"]

    def cpu(self) -> float:
        self._stats.unlink(missing_ok=True)
        self._proc.send_signal(signal.SIGUSR1)
        while not self._stats.exists() or not self._stats.read_text():
            time.sleep(0.01)
        return float(json.loads(self._stats.read_text())["cpu"])

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)
        self._stats.unlink(missing_ok=True)


async def one(call_of: grpc.aio.StreamStreamMultiCallable, firsts: list[float] | None = None) -> None:
    call = call_of()
    for k, message in enumerate(MESSAGES):
        await call.write(message)
        await call.read()
        if k == 0 and firsts is not None:
            firsts.append(time.monotonic())
    await call.done_writing()
    await call.read()


async def drive(server: Server, streams: int, concurrency: int, burst: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call_of = channel.stream_stream(PATH)
        await one(call_of)  # the connection up
        gate = asyncio.Semaphore(concurrency)

        async def paced() -> None:
            async with gate:
                await one(call_of)

        before = server.cpu()
        await asyncio.gather(*(paced() for _ in range(streams)))
        per_stream = (server.cpu() - before) / streams
        print(
            f"rate:  {streams} streams, {concurrency} at a time: "
            f"server CPU {per_stream * 1e3:.3f} ms per stream"
        )

        firsts: list[float] = []
        before = server.cpu()
        started = time.monotonic()
        results = await asyncio.gather(*(one(call_of, firsts) for _ in range(burst)), return_exceptions=True)
        done = time.monotonic() - started
        spent = server.cpu() - before
        failed = sum(isinstance(r, BaseException) for r in results)
        waits = sorted(t - started for t in firsts)
        p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))] if waits else float("nan")
        median = statistics.median(waits) if waits else float("nan")
        print(
            f"burst: {burst} streams at once, {failed} failed: first answer p50 {median:.2f} s, "
            f"p99 {p99:.2f} s, all done {done:.2f} s; server CPU {spent:.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-python", default=sys.executable)
    parser.add_argument("--server", choices=("grpc.aio", "grpclib"), default="grpc.aio")
    parser.add_argument("--registered", action="store_true")
    parser.add_argument("--streams", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--burst", type=int, default=3000)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stats", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.registered and args.server == "grpclib":
        parser.error("--registered is grpc.aio's (grpclib has no registered methods)")
    if args.serve:
        if args.server == "grpclib":
            asyncio.run(serve_grpclib(args.serve, args.stats))
        else:
            asyncio.run(serve(args.serve, args.registered, args.stats))
        return
    server = Server(args.server_python, args.registered, args.server)
    try:
        print(f"server: {server.version}{', method registered' if args.registered else ''}")
        asyncio.run(drive(server, args.streams, args.concurrency, args.burst))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
