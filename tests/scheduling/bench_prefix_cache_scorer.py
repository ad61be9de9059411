"""Microbenchmark (a script, not a test): `prefix-cache-scorer` score and pre_request cost.

8 endpoints whose LRUs are first filled to capacity (31,250 blocks each) with unrelated 16 KB
prompts, then three cases of 3,000 requests each; `gc.collect()` before each timed loop; mean and
p99 per call.

    .venv/bin/python tests/scheduling/bench_prefix_cache_scorer.py
"""

from __future__ import annotations

import gc
import itertools
import random
import statistics
import time
from collections.abc import Callable

from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import prefix_cache_scorer

RNG = random.Random(7)
IDS = itertools.count()


def request(texts: list[str]) -> InferenceRequest:
    return InferenceRequest(
        str(next(IDS)), Api.CHAT, "/v1/chat/completions", {}, "llama", "llama", prompt_texts=texts
    )


def text(n: int) -> str:
    return "".join(RNG.choices("abcdefghijklmnopqrstuvwxyz  ,.\n", k=n))


def routed_to(ep: Endpoint) -> interfaces.SchedulingResult:
    return interfaces.SchedulingResult("d", {"d": interfaces.ProfileResult("d", [ep])})


def stats(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[int(len(ordered) * 0.99)]
    return f"mean {statistics.fmean(ordered) * 1e6:6.1f} us  p99 {p99 * 1e6:6.1f} us"


def main() -> None:
    ds = Datastore()
    eps, _ = ds.sync("b", [EndpointSpec(name=f"ep{i}", address=f"10.0.0.{i}", port=8000) for i in range(8)])
    plugin = registry.default.build("prefix-cache-scorer", "prefix", {}, interfaces.Handle(datastore=ds))
    assert isinstance(plugin, prefix_cache_scorer.PrefixCacheScorer)

    def route(req: InferenceRequest, ep: Endpoint) -> None:
        plugin.score({}, req, eps)
        plugin.pre_request(req, routed_to(ep))

    for ep in eps:
        for _ in range(31250 // 256 + 1):
            route(request([text(16384)]), ep)
    system = text(12000)
    route(request([system, text(4384)]), eps[0])
    shared = text(16384)
    for ep in eps:
        route(request([shared]), ep)

    def run(label: str, make: Callable[[], InferenceRequest], target: Endpoint, n: int = 3000) -> None:
        reqs = [make() for _ in range(n)]
        hashing, scoring, recording = [], [], []
        gc.collect()
        for req in reqs:
            t0 = time.perf_counter()
            plugin.block_hashes(req)
            hashing.append(time.perf_counter() - t0)
        gc.collect()
        for req in reqs:
            t0 = time.perf_counter()
            plugin.score({}, req, eps)
            t1 = time.perf_counter()
            plugin.pre_request(req, routed_to(target))
            recording.append(time.perf_counter() - t1)
            scoring.append(t1 - t0)
        print(f"{label}\n  hash only    {stats(hashing)}\n  score        {stats(scoring)}")
        print(f"  pre_request  {stats(recording)}")

    run(
        "A) shared 12 KB system prompt + new 4 KB text, held by 1 endpoint",
        lambda: request([system, text(4384)]),
        eps[0],
    )
    run("B) identical 16 KB prompt held by all 8 endpoints", lambda: request([shared]), eps[3])
    run("C) new 16 KB prompt, cold miss (256 inserts + evictions)", lambda: request([text(16384)]), eps[5])


if __name__ == "__main__":
    main()
