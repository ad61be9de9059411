"""End-to-end KV-event ingestion throughput (a script, not a test): blocks per second from a
publisher process over ZMQ into a `BlockIndex`, through `KVEventIngester`.

    .venv/bin/python -m tests.kvcache.bench_ingest [--batches N] [--runs R]
    .venv/bin/python -m tests.kvcache.bench_ingest --paced RATE [--pods P] [--seconds S] [--runs R]

A publisher process (`KVEventPublisher`, vLLM's map form with int hashes, unbounded high-water
mark so nothing is dropped) sends batches shaped like vLLM prefill steps: one BlockStored per
batch, 8-64 blocks of 16 tokens (uniform), random uint64 hashes, half of them continuing the
previous batch's chain (a parent the index must resolve), tokens from a 152k vocabulary. The
batches are built before the clock starts. Each run gets a fresh index, ingester and publisher
process, `gc.collect()` first; medians over runs, with the consumer process's CPU time (all its
threads, ZMQ's I/O thread included). Two clocks:

- publisher sending concurrently: from the "go" sent to the publisher until the ingester has
  applied the last batch. On a 2-core VM the publisher's encoding competes with the consumer
  while it sends (the first third of the run or so).
- consumer alone: the event loop is held while the publisher sends everything (the backlog
  queues in ZMQ), then timed until the last batch is applied: the ingester's capacity.

`--paced`: the steady trickle a serving fleet sends instead (each pod a few small batches a second,
one decode step's blocks each), where the cost is per wake-up rather than per block: P publishers
in one process send RATE batches a second in all, round robin, each batch 1-2 blocks; the
consumer's CPU time (all its threads) per batch over S seconds, medians over runs; then the
floor, a plain SUB receiving the same stream with blocking calls and nothing else.

Breakdown of the consumer-alone time, each part measured apart on the same stream: receive (a
plain SUB draining the queued stream with the ingester's receive function), decode
(`decode_batch`) and apply (`BlockIndex.apply` into a fresh index, right after each decode); the rest is
the ingester's own work (frame checks, sequence state, counters, the event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing as mp
import random
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import zmq

from epp.kvcache import events, zmqread
from epp.kvcache.events import BlockStored
from epp.kvcache.index import BlockIndex
from epp.kvcache.ingest import FeedSpec, KVEventIngester
from epp.sim.kvpublisher import KVEventPublisher

BLOCK = 16
VOCAB = 151_936
LOCAL = "tcp://127.0.0.1:0"


def make_batches(seed: int, n: int) -> list[BlockStored]:
    """`n` prefill-like events (one per batch), deterministic for `seed`."""
    rng = random.Random(seed)
    pool = [rng.randrange(VOCAB) for _ in range(1 << 16)]
    out: list[BlockStored] = []
    last: int | None = None
    for _ in range(n):
        blocks = rng.randint(8, 64)
        start = rng.randrange(len(pool) - blocks * BLOCK)
        hashes = [rng.getrandbits(64) for _ in range(blocks)]
        parent = last if last is not None and rng.random() < 0.5 else None
        out.append(BlockStored(hashes, parent, pool[start : start + blocks * BLOCK], BLOCK, medium="gpu"))
        last = hashes[-1]
    return out


def publisher_main(conn: Connection, seed: int, n: int) -> None:
    """Child process: build the batches, wait for a subscriber and "go", send, report, wait."""
    batches = make_batches(seed, n)
    with KVEventPublisher(LOCAL, hwm=0) as pub:
        conn.send(pub.endpoint)
        while not pub.subscriptions:
            time.sleep(0.001)
        conn.send("subscribed")
        conn.recv()
        t0 = time.perf_counter()
        for ev in batches:
            pub.publish([ev], ts=1.0)
        conn.send(time.perf_counter() - t0)
        conn.recv()  # until the consumer has everything (closing would drop the backlog)


class Publisher:
    """A publisher process, driven over a pipe."""

    def __init__(self, seed: int, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=publisher_main, args=(child, seed, n), daemon=True)
        self.proc.start()
        self.endpoint: str = self.conn.recv()

    def release(self, *, expect_report: bool = True) -> None:
        """Let the child exit (after its send-time report, unless already read)."""
        if expect_report:
            self.conn.recv()
        self.conn.send("quit")
        self.proc.join(10)


async def wait_until(cond: Any, limit: float = 300.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("the ingester did not get every batch")
        await asyncio.sleep(0.001)


async def end_to_end(seed: int, n: int, blocks: int, *, backlog: bool) -> tuple[float, float]:
    """(seconds, consumer CPU seconds) for one run. `backlog`: the clock starts once the publisher
    has sent everything (the loop is held meanwhile), so only the consumer runs while timed."""
    pub = Publisher(seed, n)
    index = BlockIndex()
    ing = KVEventIngester(index)
    ing.set_feeds([FeedSpec("pod", "model", pub.endpoint)])
    await ing.start()
    try:
        await asyncio.to_thread(pub.conn.recv)  # "subscribed"
        gc.collect()
        if backlog:
            pub.conn.send("go")
            pub.conn.recv()  # blocks the loop on purpose: the backlog queues in ZMQ
            cpu0, t0 = time.process_time(), time.perf_counter()
        else:
            cpu0, t0 = time.process_time(), time.perf_counter()
            pub.conn.send("go")
        await wait_until(lambda: ing.status()["pod"].batches == n)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        st = ing.status()["pod"]
        assert (st.blocks_stored, st.gaps, st.decode_errors) == (blocks, 0, 0), st
        assert index.stats().orphans == 0
    finally:
        await ing.stop()
        pub.release(expect_report=not backlog)
    return wall, cpu


def paced_publisher_main(conn: Connection, pods: int, rate: float, seconds: float, blocks: int = 0) -> None:
    """Child process: `pods` publishers; after "go", `rate` batches a second, round robin. Each
    batch holds `blocks` blocks (a prefill's), or 1-2 (a decode step's) when `blocks` is 0."""
    rng = random.Random(2)
    n = int(rate * seconds)
    pool = [rng.randrange(VOCAB) for _ in range(1 << 16)]

    def step(size: int) -> BlockStored:
        hashes = [rng.getrandbits(64) for _ in range(size)]
        start = rng.randrange(len(pool) - size * BLOCK)
        return BlockStored(hashes, None, pool[start : start + size * BLOCK], BLOCK, medium="gpu")

    batches = [step(blocks or rng.randint(1, 2)) for _ in range(n)]
    pubs = [KVEventPublisher(LOCAL, hwm=0) for _ in range(pods)]
    try:
        conn.send([p.endpoint for p in pubs])
        while not all(p.subscriptions for p in pubs):
            time.sleep(0.001)
        conn.send("subscribed")
        conn.recv()
        t0 = time.perf_counter()
        for i, ev in enumerate(batches):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pubs[i % pods].publish([ev], ts=1.0)
        conn.send(n)
        conn.recv()
    finally:
        for p in pubs:
            p.close()


def start_paced_publisher(pods: int, rate: float, seconds: float, blocks: int = 0) -> tuple[Connection, Any]:
    """`paced_publisher_main` in a process of its own: (its pipe, the process)."""
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=paced_publisher_main, args=(child, pods, rate, seconds, blocks), daemon=True)
    proc.start()
    return conn, proc


async def paced(pods: int, rate: float, seconds: float, blocks: int = 0) -> tuple[float, float]:
    """Consumer CPU seconds per batch over one paced run: all its threads, the event loop's."""
    conn, proc = start_paced_publisher(pods, rate, seconds, blocks)
    endpoints = conn.recv()
    ing = KVEventIngester(BlockIndex())
    ing.set_feeds([FeedSpec(f"pod-{i}", "model", e) for i, e in enumerate(endpoints)])
    await ing.start()
    try:
        await asyncio.to_thread(conn.recv)  # "subscribed"
        gc.collect()
        cpu0, loop0 = time.process_time(), time.thread_time()
        conn.send("go")
        n = await asyncio.to_thread(conn.recv)
        await wait_until(lambda: sum(st.batches for st in ing.status().values()) == n)
        cpu, loop = time.process_time() - cpu0, time.thread_time() - loop0
    finally:
        await ing.stop()
        conn.send("quit")
        proc.join(10)
    return cpu / n, loop / n


def paced_floor(pods: int, rate: float, seconds: float, blocks: int = 0) -> tuple[float, float]:
    """As `paced`, but a plain SUB connected to every publisher receives each message with a
    blocking call and does nothing else: ZMQ's own cost per message at this pace (all threads,
    the receiving thread)."""
    conn, proc = start_paced_publisher(pods, rate, seconds, blocks)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    for endpoint in conn.recv():
        sub.connect(endpoint)
    try:
        while not conn.poll(0.001):
            sub.poll(1)  # lets the SUB send its subscriptions
        conn.recv()  # "subscribed"
        gc.collect()
        cpu0, own0 = time.process_time(), time.thread_time()
        conn.send("go")
        n = int(rate * seconds)  # as the publisher counts them
        for _ in range(n):
            sub.recv_multipart()
        conn.recv()
        cpu, own = time.process_time() - cpu0, time.thread_time() - own0
    finally:
        conn.send("quit")
        proc.join(10)
        sub.close(linger=0)
        ctx.term()
    return cpu / n, own / n


def receive_only(seed: int, n: int) -> float:
    """Seconds for a plain SUB to drain the same stream once it is all queued: ZMQ and the Python
    frames, no decoding."""
    pub = Publisher(seed, n)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(pub.endpoint)
    while not pub.conn.poll(0.001):
        sub.poll(1)  # lets the SUB send its subscription
    pub.conn.recv()
    pub.conn.send("go")
    pub.conn.recv()  # all sent
    gc.collect()
    t0 = time.perf_counter()
    got = 0
    while got < n:
        sub.poll()
        while True:
            try:
                zmqread.recv(sub)
            except zmq.Again:
                break
            got += 1
    wall = time.perf_counter() - t0
    pub.release(expect_report=False)
    sub.close(linger=0)
    ctx.term()
    return wall


def decode_and_apply(payloads: list[bytes]) -> tuple[float, float]:
    """Seconds spent decoding every payload and applying each batch to a fresh index, timed step
    by step in one loop: each batch is applied right after its decode, as in the ingester (timed
    in separate passes, the batches would be cold in the CPU caches and apply ~40% slower)."""
    decode = events.decode_batch
    index = BlockIndex()
    clock = time.perf_counter
    t_decode = t_apply = 0.0
    gc.collect()
    for p in payloads:
        t0 = clock()
        batch = decode(p)
        t1 = clock()
        index.apply("pod", batch, model="model")
        t_apply += clock() - t1
        t_decode += t1 - t0
    return t_decode, t_apply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=30_000, help="batches per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--paced", type=float, default=0.0, help="batches a second in all (paced mode)")
    parser.add_argument("--pods", type=int, default=8, help="paced mode: publishers")
    parser.add_argument("--seconds", type=float, default=20.0, help="paced mode: seconds per run")
    parser.add_argument(
        "--blocks",
        type=int,
        default=0,
        help="paced mode: blocks per batch (a prefill's); 0: 1-2, a decode step's",
    )
    args = parser.parse_args()
    if args.paced > 0:
        print(
            f"command: {sys.executable} -m tests.kvcache.bench_ingest --paced {args.paced:g} "
            f"--pods {args.pods} --seconds {args.seconds:g} --runs {args.runs} --blocks {args.blocks}"
        )
        per = [asyncio.run(paced(args.pods, args.paced, args.seconds, args.blocks)) for _ in range(args.runs)]
        for run, (c, lp) in enumerate(per):
            print(f"  run {run + 1}: {c * 1e6:6.1f} us of CPU a batch, {lp * 1e6:6.1f} on the loop's thread")
        med = statistics.median(c for c, _ in per)
        on_loop = statistics.median(lp for _, lp in per)
        print(
            f"median: {med * 1e6:.1f} us per batch ({on_loop * 1e6:.1f} on the event loop's thread), "
            f"{med * args.paced:.1%} of a core at {args.paced:g}/s"
        )
        if args.blocks:
            per_block, rate = med / args.blocks, args.paced * args.blocks
            print(
                f"  {per_block * 1e6:.2f} us per block, {med * args.paced:.2f} core at {rate:,.0f} blocks/s"
            )
        floor, own = paced_floor(args.pods, args.paced, args.seconds, args.blocks)
        print(f"floor (a plain SUB's blocking receive, nothing else): {floor * 1e6:.1f} us ({own * 1e6:.1f})")
        return
    n = args.batches
    seed = 1
    batches = make_batches(seed, n)
    blocks = sum(len(b.block_hashes) for b in batches)
    with KVEventPublisher(LOCAL) as encoder:
        payloads = [encoder.encode([b], 1.0) for b in batches]
    del batches
    size = sum(map(len, payloads)) / n
    print(f"command: {sys.executable} -m tests.kvcache.bench_ingest --batches {n} --runs {args.runs}")
    print(f"{n} batches, {blocks} blocks ({blocks / n:.1f} per batch, {size:.0f} bytes per payload)")
    walls: dict[bool, float] = {}
    for backlog in (False, True):
        label = "consumer alone (backlog sent first)" if backlog else "publisher sending concurrently"
        print(f"{label}:")
        results = []
        for run in range(args.runs):
            wall, cpu = asyncio.run(end_to_end(seed, n, blocks, backlog=backlog))
            results.append((wall, cpu))
            rate = f"{blocks / wall / 1e3:5.0f}k blocks/s"
            print(f"  run {run + 1}: {rate}  ({wall:.2f} s, consumer CPU {cpu:.2f} s)")
        wall = walls[backlog] = statistics.median(w for w, _ in results)
        cpu = statistics.median(c for _, c in results)
        print(
            f"  median of {args.runs}: {blocks / wall / 1e3:.0f}k blocks/s ({n / wall:.0f} batches/s),"
            f" {blocks / cpu / 1e3:.0f}k blocks per consumer CPU second"
        )
    recv = statistics.median(receive_only(seed, n) for _ in range(3))
    parts = [decode_and_apply(payloads) for _ in range(3)]
    decode = statistics.median(p[0] for p in parts)
    apply = statistics.median(p[1] for p in parts)
    wall = walls[True]
    rest = wall - recv - decode - apply
    print("consumer alone, per batch (receive, decode and apply measured apart, medians of 3):")
    print(f"  end to end     {wall / n * 1e6:6.1f} us")
    for name, t in (("receive", recv), ("decode", decode), ("apply", apply), ("ingester rest", rest)):
        print(f"  {name:14} {t / n * 1e6:6.1f} us  {t / wall:4.0%}")
    print("  (rest = end to end minus the parts; below 0 when the parts, timed apart over payloads")
    print("  that are no longer in the CPU caches, cost more than inside the ingester)")


if __name__ == "__main__":
    main()
