"""Flow control's bounds under a flood: docs/bench/flow-control.md#flow-control-bounded.

    .venv/bin/python scripts/bench_flow_control_bounded.py --requests 100000

One Director as `epp serve` builds it (GIE's default profile, 8 endpoints, the `flowControl`
gate, a global `maxBytes` cap of --max-bytes and per-band request limits above --requests), its
pool held saturated (every endpoint reporting a long vLLM queue). --requests requests arrive,
one task each, as ext-proc streams would; the ones past the byte cap are answered at once. Then
the pool frees up, every held request is dispatched, routed, booked and its stream ended.

Reported: the queued bytes at the peak against the cap; the memory Python holds in objects
(`sys.getallocatedblocks`) and the process's resident memory, before, at the peak and after the
drain (after a garbage collection; glibc keeps freed memory in the resident set, up to epp's
trim threshold in `epp serve`: `epp.malloc`, so the objects are what must come back); in-flight
bookings left on the endpoints after every stream ended (lost bookings: target 0); and the
answers: admitted requests must all be routed (no 5xx), refused ones 429 `rejected-saturated`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import sys
import time

import msgspec

from epp import clock
from epp.api import errors
from epp.datastore.endpoints import Datastore, EndpointSpec, ModelServerMetrics
from epp.flowcontrol import controller as flowcontrol
from epp.requestcontrol import admission
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle

CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
  - type: queue-scorer
  - type: max-score-picker
  # The script sets the pods' metrics itself, between bursts of thousands of arrivals.
  - type: utilization-detector
    parameters: {{metricsStalenessThreshold: 1h}}
schedulingProfiles:
  - name: default
    plugins: [{{pluginRef: queue-scorer}}, {{pluginRef: max-score-picker}}]
flowControl:
  saturationDetector: {{pluginRef: utilization-detector}}
  maxBytes: {max_bytes}
  defaultPriorityBand: {{maxRequests: {band}, maxBytes: {band_bytes}}}
"""


def rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def set_load(datastore: Datastore, waiting: int) -> None:
    now = clock.now()
    for ep in datastore.endpoints():
        ep.metrics = ModelServerMetrics(waiting=waiting, running=8, kv_usage=0.2, updated_at=now)


async def flood(args: argparse.Namespace) -> int:
    datastore = Datastore()
    datastore.sync(
        "bench", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i}", port=8000) for i in range(8)]
    )
    text = CONFIG.format(max_bytes=args.max_bytes, band=args.requests * 2, band_bytes=args.max_bytes * 2)
    config = sched_config.load_config(text, Handle(datastore=datastore))
    detector, flow, _ = flowcontrol.from_scheduler_config(config, datastore.candidates)
    assert flow is not None
    director = Director(
        datastore=datastore,
        scheduler=config.scheduler,
        admission_controller=admission.LegacyAdmissionController(detector),
        flow_control=flow,
    )
    body = msgspec.json.encode({"model": "m", "prompt": "x" * args.body_bytes, "max_tokens": 8})
    answers: collections.Counter[str] = collections.Counter()
    contexts = []

    async def one(i: int) -> None:
        headers = {"x-request-id": str(i), "x-llm-d-inference-fairness-id": f"tenant-{i % 50}"}
        try:
            ctx = await director.route(path="/v1/completions", headers=headers, body=body, subset=None)
        except errors.RequestError as exc:
            answers[f"{exc.status} {exc.headers.get('x-llm-d-request-dropped-reason', exc.reason)}"] += 1
            return
        answers["routed"] += 1
        contexts.append(ctx)

    gc.collect()
    baseline, blocks0 = rss(), sys.getallocatedblocks()
    # Keep the pool fresh and saturated while the flood arrives (the utilization detector reads
    # stale metrics as saturated too; this is load, as at a real overload).
    set_load(datastore, waiting=50)
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(one(i)) for i in range(args.requests)]
    while flow.registry.len + sum(answers.values()) < args.requests:  # let them all arrive
        set_load(datastore, waiting=50)
        await asyncio.sleep(0)
    queued, queued_bytes = flow.registry.len, flow.registry.bytes
    gc.collect()
    peak, blocks1 = rss(), sys.getallocatedblocks()
    arrived = time.perf_counter() - t0
    # The pool frees up: dispatch everything held (one per 1 ms tick, and one per arrival: none).
    set_load(datastore, waiting=0)
    t1 = time.perf_counter()
    while flow.registry.len:
        set_load(datastore, waiting=0)
        await asyncio.sleep(0.01)
    for task in tasks:  # (not gather: its future would keep every task to the end of this frame)
        await task
    drained = time.perf_counter() - t1
    for ctx in contexts:
        ctx.finish(complete=True)
    left = sum(ep.inflight_requests for ep in datastore.endpoints())
    contexts.clear()
    tasks.clear()
    answers_left = dict(answers)
    gc.collect()
    after, blocks2 = rss(), sys.getallocatedblocks()
    mib = 1 << 20
    print(f"requests: {args.requests:,} of {len(body)} bytes; global maxBytes {args.max_bytes:,}")
    share = queued_bytes / args.max_bytes
    print(f"queued at the peak: {queued:,} requests, {queued_bytes:,} bytes ({share:.1%} of the cap)")
    print(f"answers: {answers_left}")
    print(
        f"Python objects (allocated blocks): baseline {blocks0:,}, peak {blocks1:,} "
        f"(+{(blocks1 - blocks0) / max(queued, 1):.0f} per queued request), after the drain {blocks2:,} "
        f"({blocks2 - blocks0:+,})"
    )
    print(
        f"RSS: baseline {baseline / mib:.0f} MiB, peak {peak / mib:.0f} MiB "
        f"(+{(peak - baseline) / max(queued, 1):.0f} B per queued request), "
        f"after the drain {after / mib:.0f} MiB"
    )

    print(f"in-flight bookings left after every stream ended: {left}")
    print(f"wall: arrivals {arrived:.1f} s, drain {drained:.1f} s (machine shared: not a throughput figure)")
    returned = blocks2 - blocks0 < 0.01 * (blocks1 - blocks0) + 5000  # what caches keep: a few thousand
    ok = (
        queued_bytes <= args.max_bytes
        and left == 0
        and not any(k.startswith("5") for k in answers)
        and returned
    )
    print("bounded: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--body-bytes", type=int, default=600, help="prompt characters per request body")
    parser.add_argument("--max-bytes", type=int, default=48 << 20, help="flowControl.maxBytes")
    return asyncio.run(flood(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
