"""Microbenchmark (a script, not a test): `precise-prefix-cache-scorer` score() with tokens given.

What a routing decision pays for precise prefix scoring once the prompt is tokenized: grouping the
endpoints by (block size, seed), keying the prompt's blocks, the index walk, speculative entries
and the scores. The index holds `--entries` records of unrelated prompts (block size 16, spread
over the pods) plus, for each measured prompt, its leading 75% stored on one pod and its first
half on 3 more (prefix hits are what the walk pays for). Prompts of 1k, 4k, 16k and 100k tokens
over 8 and 64 pods; `gc.collect()` before each timed loop, 600 (100k: 200) decisions each, p50
and p99. Speculative entries are on (the default): each decision's pre_request records its keys.

    .venv/bin/python -m tests.scheduling.bench_precise_prefix_cache_scorer [--entries 2000000]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.events import BlockStored, EventBatch
from epp.kvcache.index import BlockIndex
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import precise_prefix_cache_scorer  # noqa: F401  (registers it)

BLOCK = 16
RNG = random.Random(11)


def tokens(n: int) -> list[int]:
    return [RNG.randrange(50_000) for _ in range(n)]


def stored(ids: list[int], base: int) -> BlockStored:
    n = len(ids) // BLOCK
    return BlockStored([base + i for i in range(n)], None, ids[: n * BLOCK], BLOCK, None, "GPU", None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=2_000_000, help="background index records")
    args = ap.parse_args()
    print(f"index background: {args.entries:,} records; block size {BLOCK}")
    for pods in (8, 64):
        ds = Datastore()
        specs = [EndpointSpec(f"pod-{i}", f"10.0.{i // 250}.{i % 250}", 8000) for i in range(pods)]
        eps, _ = ds.sync("b", specs)
        index = BlockIndex(max_entries=args.entries * 2)
        handle = interfaces.Handle(datastore=ds, kv_index=index)
        plugin = registry.default.build("precise-prefix-cache-scorer", "precise", {}, handle)
        base = 1
        per_prompt = 4096
        for i in range(args.entries // (per_prompt // BLOCK)):
            ev = stored(tokens(per_prompt), base)
            base += len(ev.block_hashes)
            index.apply(eps[i % pods].name, EventBatch(0.0, [ev], 0), model="llama")
        for n in (1024, 4096, 16384, 100_000):
            prompts = [tokens(n) for _ in range(8)]
            for j, ids in enumerate(prompts):
                for k, frac in enumerate((0.75, 0.5, 0.5, 0.5)):
                    ev = stored(ids[: int(n * frac)], base)
                    base += len(ev.block_hashes)
                    index.apply(eps[(j + k) % pods].name, EventBatch(0.0, [ev], 0), model="llama")
            runs = 200 if n >= 100_000 else 600
            samples = []
            gc.collect()
            for r in range(runs):
                req = InferenceRequest(str(r), Api.COMPLETIONS, "/v1/completions", {}, "llama", "llama")
                req.token_ids = prompts[r % len(prompts)]
                t0 = time.perf_counter()
                cycle: interfaces.CycleState = {}
                plugin.score(cycle, req, eps)
                samples.append(time.perf_counter() - t0)
                result = interfaces.SchedulingResult(
                    "d", {"d": interfaces.ProfileResult("d", [eps[r % pods]])}, cycle
                )
                plugin.pre_request(req, result)
            samples.sort()
            p50 = statistics.median(samples) * 1e3
            p99 = samples[int(len(samples) * 0.99)] * 1e3
            print(f"{pods:3d} pods  {n:7,d} tokens: score p50 {p50:6.3f} ms  p99 {p99:6.3f} ms")


if __name__ == "__main__":
    main()
