"""Routing quality of N active-active epp replicas against one (`epp bench --replicas N`), swept.

    nice -n 10 .venv/bin/python scripts/bench_replicas.py        # docs/bench/routing-live.md#replicas
    .venv/bin/python scripts/bench_replicas.py --workloads chat --scale 0.05 --seeds 1 --replicas 1,2

For each workload, policy and seed, runs the fast-mode bench once per replica count (same seeded
requests for every count; `epp.bench.replicas`), prints one line per run, then per (workload,
policy) the median over seeds of each replica count, and against N=1 seed by seed (same
requests) on the issue's measures, the median change and the worst seed's: hit rate (points),
TTFT p99 and E2E p99 (relative). `--out FILE` keeps every run's summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from epp.bench import fast, replicas, report
from epp.bench.policies import POLICIES
from epp.bench.workload import Fleet
from epp.bench.workloads import WORKLOADS
from epp.sim.profiles import get_profile

SCALES = {"hotspot": 1.0, "chat": 0.2}  # as docs/bench/routing.md#five-seeds runs them
MEASURES = ("hit_rate", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "req_per_s")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run_one(
    workload: str, policy: str, seed: int, n: int, scale: float, scrape: float = 0.05
) -> dict[str, Any]:
    cls = WORKLOADS[workload]
    profile = get_profile(cls.default_profile)
    pods = cls.default_pods
    fleet = Fleet(pods, profile.num_gpu_blocks * profile.block_size, profile.max_model_len)
    wl = cls(seed=seed, scale=scale, fleet=fleet)
    kwargs: dict[str, Any] = {"profile": profile, "pods": pods, "seed": seed, "scrape_interval_s": scrape}
    pol = POLICIES[policy]
    if n == 1:
        result = fast.FastRun(wl, pol, **kwargs).run()
    else:
        result = replicas.ReplicatedRun(wl, pol, replicas=n, **kwargs).run()
    summary = report.summarize(result, wl.stages)
    return {"workload": workload, "policy": policy, "seed": seed, "replicas": n, **summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="hotspot,chat")
    ap.add_argument("--policies", default="epp")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--scale", type=float, default=None, help="override every workload's scale")
    ap.add_argument("--scrape-interval", type=float, default=0.05, help="seconds between scrapes (0.05)")
    ap.add_argument("--out", default=None, help="write every run's summary to this JSON file")
    args = ap.parse_args(argv)
    counts = _ints(args.replicas)
    if 1 not in counts:
        counts.insert(0, 1)  # the baseline
    runs: list[dict[str, Any]] = []
    for workload in args.workloads.split(","):
        scale = args.scale or SCALES.get(workload, 1.0)
        for policy in args.policies.split(","):
            for seed in _ints(args.seeds):
                for n in counts:
                    r = run_one(workload, policy, seed, n, scale, args.scrape_interval)
                    runs.append(r)
                    print(
                        f"{workload} {policy} seed={seed} N={n}: hit {r['hit_rate']:.2%} "
                        f"TTFT p50 {r['ttft_p50_s']:.3f} p99 {r['ttft_p99_s']:.3f} "
                        f"E2E p50 {r['e2e_p50_s']:.2f} p99 {r['e2e_p99_s']:.2f} ({r['wall_s']:.1f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
            _table(
                workload,
                policy,
                counts,
                [r for r in runs if (r["workload"], r["policy"]) == (workload, policy)],
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


def _table(workload: str, policy: str, counts: list[int], runs: list[dict[str, Any]]) -> None:
    print(f"\n{workload} / {policy}: medians over {len({r['seed'] for r in runs})} seeds")
    print(
        "| N | hit | TTFT p50 | TTFT p99 | E2E p50 | E2E p99 (s) | req/s "
        "| vs N=1: hit, TTFT p99, E2E p99 (worst) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    base = {r["seed"]: r for r in runs if r["replicas"] == 1}
    for n in counts:
        rows = [r for r in runs if r["replicas"] == n]
        med = {m: statistics.median(r[m] for r in rows) for m in MEASURES}
        paired = ""
        if n != 1:
            # Paired by seed (same requests): the median and the worst of each seed's change.
            d_hit = [(r["hit_rate"] - base[r["seed"]]["hit_rate"]) * 100 for r in rows]
            d_ttft = [r["ttft_p99_s"] / base[r["seed"]]["ttft_p99_s"] - 1 for r in rows]
            d_e2e = [r["e2e_p99_s"] / base[r["seed"]]["e2e_p99_s"] - 1 for r in rows]
            paired = (
                f"{statistics.median(d_hit):+.1f} pt ({min(d_hit):+.1f}), "
                f"{statistics.median(d_ttft):+.1%} ({max(d_ttft):+.1%}), "
                f"{statistics.median(d_e2e):+.1%} ({max(d_e2e):+.1%})"
            )
        print(
            f"| {n} | {med['hit_rate']:.1%} | {med['ttft_p50_s']:.3f} | {med['ttft_p99_s']:.3f} | "
            f"{med['e2e_p50_s']:.2f} | {med['e2e_p99_s']:.2f} | {med['req_per_s']:.2f} | {paired} |"
        )
    print(flush=True)


if __name__ == "__main__":
    sys.exit(main())
