"""Benchmark (a script, not a test): how long grpcio's own receive of one large message holds an
asyncio loop, with no epp code at all (issue 19's floor; docs/bench/overhead.md#large-bodies).

A bare grpc.aio server takes raw bytes (no deserializer) on one bidirectional stream and answers
each message with two bytes; a client in another process sends `--count` messages of `--mib` MiB,
one every `--every` seconds. Meanwhile a ticker on the server's loop sleeps 1 ms at a time and
records how late each wake-up is: a message's receive (grpcio builds the Python bytes from the
message's slices, holding the GIL) shows up as one late wake-up.

    .venv/bin/python tests/api/bench_grpc_receive.py [--mib 16] [--count 20] [--every 0.2] [--malloc]

`--malloc` applies epp's glibc settings (epp/malloc.py) in the server first, as `epp serve` does.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from typing import Any

import grpc

SERVICE, METHOD = "bench.Receive", "Stream"


def client(port: int, mib: int, count: int, every: float) -> None:
    body = os.urandom(mib << 20)
    options = [("grpc.max_send_message_length", 1 << 30)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.stream_stream(f"/{SERVICE}/{METHOD}")

        def messages() -> Any:
            for _ in range(count):
                yield body
                time.sleep(every)

        for _ in call(messages()):
            pass


async def serve(args: argparse.Namespace) -> None:
    if args.malloc:
        from epp import malloc

        malloc.tune()
    received: list[int] = []

    async def handler(_: object, context: grpc.aio.ServicerContext) -> None:
        while (msg := await context.read()) is not grpc.aio.EOF:
            received.append(len(msg))
            await context.write(b"ok")

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 30)])
    handlers = {METHOD: grpc.stream_stream_rpc_method_handler(handler)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sender = multiprocessing.get_context("spawn").Process(
        target=client, args=(port, args.mib, args.count, args.every)
    )
    sender.start()
    late: list[float] = []
    last = time.perf_counter()
    while sender.is_alive() or len(received) < args.count:
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        late.append(max(0.0, now - last - 0.001))
        last = now
        if not sender.is_alive() and len(received) < args.count:
            break
    sender.join()
    await server.stop(0)
    # In order: whether the slow receives are the first ones (memory not yet reused) or any.
    slow = [f"{i}:{x * 1e3:.1f}" for i, x in enumerate(late) if x > 0.001]
    print(f"ticks over 1 ms late, in order (tick:ms): {' '.join(slow)}")
    late.sort()
    worst = [round(x * 1e3, 1) for x in late[-args.count - 5 :]]
    print(f"{len(received)} messages of {args.mib} MiB received; {len(late)} ticks")
    p50, p99 = late[len(late) // 2] * 1e3, late[int(len(late) * 0.99)] * 1e3
    print(f"tick lateness: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    print(f"the {len(worst)} latest ticks (ms): {worst}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--every", type=float, default=0.2)
    ap.add_argument("--malloc", action="store_true")
    asyncio.run(serve(ap.parse_args()))


if __name__ == "__main__":
    main()
