"""Microbenchmark of the step-based engine (epp.sim.core) on one pod under an llm-d-like load.

Not a test (pytest does not collect `bench_*.py`): run it by hand and compare before/after a
change to the hot loop.

    .venv/bin/python tests/sim/bench_core.py [--qps 7.5] [--seconds 300] [--output 1000]

The load is one pod's share of llm-d's precise-routing benchmark (qwen3-32b-tp2-h100): requests
from `--groups` tenants, each a tenant's 6000-token system prompt plus a unique 1200-token
question, `--output` generated tokens, Poisson arrivals at `--qps`, all of a tenant's requests on
this pod (as precise routing places them). Reports wall time, engine steps per second, simulated
requests finished per wall second, how much faster than real time the pod ran, and the pod's own
TTFT and preemptions, after `gc.collect()`. `--hash-only` times `add_request` (block hashing);
`--share-digests` hands each request its tenant's prompt hashes, computed once.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from epp.sim import blocks, core, profiles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen3-32b-tp2-h100")
    ap.add_argument("--qps", type=float, default=7.5, help="arrivals per simulated second on this pod")
    ap.add_argument("--seconds", type=float, default=300.0, help="simulated seconds of arrivals")
    ap.add_argument("--groups", type=int, default=19, help="tenants (150 over 8 pods in llm-d's run)")
    ap.add_argument("--prefix", type=int, default=6000)
    ap.add_argument("--question", type=int, default=1200)
    ap.add_argument("--output", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hash-only", action="store_true")
    ap.add_argument(
        "--share-digests", action="store_true", help="hash each system prompt once (prefix_digests)"
    )
    args = ap.parse_args()

    rnd = random.Random(args.seed)
    prof = profiles.get_profile(args.profile)
    prefixes = [[rnd.randrange(1, 150_000) for _ in range(args.prefix)] for _ in range(args.groups)]
    shared = [blocks.block_digests(p, prof.block_size) if args.share_digests else [] for p in prefixes]
    arrivals: list[tuple[float, core.EngineRequest]] = []
    t = 0.0
    while True:
        t += rnd.expovariate(args.qps)
        if t >= args.seconds:
            break
        question = [rnd.randrange(1, 150_000) for _ in range(args.question)]
        g = rnd.randrange(args.groups)
        prompt = prefixes[g] + question
        req = core.EngineRequest(f"r{len(arrivals)}", prompt, args.output, prefix_digests=shared[g])
        arrivals.append((t, req))

    engine = core.Engine(prof)
    gc.collect()
    if args.hash_only:
        start = time.perf_counter()
        for at, req in arrivals:
            engine.add_request(req, at)
        wall = time.perf_counter() - start
        print(f"add_request ({args.prefix + args.question}-token prompts): {len(arrivals)} in {wall:.3f} s")
        print(f"  {wall / len(arrivals) * 1e6:.1f} us a request")
        return

    start = time.perf_counter()
    now, i, steps = 0.0, 0, 0
    while i < len(arrivals) or engine.has_unfinished():
        while i < len(arrivals) and arrivals[i][0] <= now:
            engine.add_request(arrivals[i][1], arrivals[i][0])
            i += 1
        if not engine.has_unfinished():
            now = arrivals[i][0]
            continue
        now += engine.step(now).duration
        steps += 1
    wall = time.perf_counter() - start

    reqs = [r for _, r in arrivals]
    ttft = sorted(r.first_token_time - r.arrival_time for r in reqs if r.first_token_time is not None)
    print(
        f"{args.profile}: {len(reqs)} requests ({args.qps} QPS, {args.prefix}+{args.question} tokens, "
        f"{args.output} out, {args.groups} tenants) over {now:.0f} simulated s"
    )
    print(
        f"  wall {wall:.2f} s: {steps / wall:,.0f} steps/s, {len(reqs) / wall:,.1f} requests/s, "
        f"{now / wall:,.0f}x real time"
    )
    print(f"  {steps} steps, mean {now / steps * 1e3:.1f} ms; {engine.num_preemptions} preemptions")
    print(
        f"  TTFT p50 {statistics.median(ttft):.2f} s, p90 {ttft[int(0.9 * (len(ttft) - 1))]:.2f} s; "
        f"hit rate {engine.prefix_cache_hits / max(1, engine.prefix_cache_queries):.1%}"
    )


if __name__ == "__main__":
    main()
