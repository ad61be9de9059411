"""Microbenchmark (a script, not a test): the precise scorer's speculative entries for one long
prompt, which the loop pays on every routed request that long (issue 19,
docs/bench/overhead.md#large-bodies).

A 200k-token prompt at 16 tokens per block is 12,500 keys: add them for one pod, look the prompt up
(`runs`), expire them. `--runs` fresh entries, p50 of each step.

    .venv/bin/python -m tests.scheduling.bench_speculative [--blocks 12500] [--runs 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from epp.kvcache.keys import BlockKey
from epp.scheduling.plugins.precise_prefix_cache_scorer import _Speculative


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=12_500)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    rng = random.Random(1)
    keys = [BlockKey(rng.getrandbits(60)) for _ in range(args.blocks)]
    steps: dict[str, list[float]] = {"add": [], "runs": [], "expire": []}
    for _ in range(args.runs):
        spec = _Speculative()
        t = time.perf_counter()
        spec.add("pod", keys, 1.0)
        steps["add"].append(time.perf_counter() - t)
        t = time.perf_counter()
        spec.runs(keys, ["pod"])
        steps["runs"].append(time.perf_counter() - t)
        t = time.perf_counter()
        spec.expire(2.0)
        steps["expire"].append(time.perf_counter() - t)
    print(
        f"{args.blocks} keys, {args.runs} runs, p50: "
        + ", ".join(f"{name} {statistics.median(xs) * 1e3:.3f} ms" for name, xs in steps.items())
    )


if __name__ == "__main__":
    main()
