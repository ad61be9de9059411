"""Time of one scheduling decision with the default configuration, over 8 and 64 endpoints.

Run: .venv/bin/python tests/scheduling/bench_scheduler.py
Not a test (timings are machine-dependent). Budget: well under 100 µs for 8 endpoints. Each run
covers `Scheduler.schedule` end to end: three scorers, the picker and the five Prometheus
histogram observations; endpoint metrics vary so the picker sees few ties, as in production.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `epp`

from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.scheduling import config
from epp.scheduling.interfaces import Handle


def bench(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Average and p99 in microseconds, after a warm-up, with the GC collected beforehand."""
    for _ in range(min(runs, 200)):
        fn()
    gc.collect()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.fmean(times) * 1e6, times[int(len(times) * 0.99) - 1] * 1e6


def endpoints(n: int) -> list[Endpoint]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        spec = EndpointSpec(name=f"pod-{i}", address=f"10.0.{i // 250}.{i % 250 + 1}", port=8000)
        ep = Endpoint(spec=spec, hostport=spec.hostport)
        ep.metrics.waiting = rng.randrange(10)
        ep.metrics.kv_usage = rng.random()
        ep.inflight_requests = rng.randrange(20)
        out.append(ep)
    return out


def main() -> None:
    scheduler = config.load_config(None, Handle(datastore=Datastore())).scheduler
    request = InferenceRequest(request_id="r", api=Api.CHAT, path="/v1/chat/completions", headers={})
    for n in (8, 64):
        eps = endpoints(n)
        avg, p99 = bench(lambda: scheduler.schedule(request, eps), 20000)  # noqa: B023
        xavg, xp99 = bench(lambda: scheduler.schedule(request, eps, explain=True), 5000)  # noqa: B023
        print(
            f"{n:3d} endpoints: schedule avg {avg:6.1f} us  p99 {p99:6.1f} us   "
            f"explain=True avg {xavg:6.1f} us  p99 {xp99:6.1f} us"
        )


if __name__ == "__main__":
    main()
