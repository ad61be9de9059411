"""Median and worst over seeds: `python -m epp.bench.seeds DIR/seed-*/results.json`.

`epp bench --seed N --out DIR/seed-N` writes one results.json per seed; this reads several and
prints, per workload, a table whose cells are `median (worst)` over the seeds for each policy, and
for each of epp's targets (issue 18) the seeds on which it holds. Worst means the largest for
latencies and miss shares, the smallest for hit rates, SLO share and throughput.

`--against POLICY` adds, per workload, epp's figures over POLICY's: the ratio of the means over
the seeds, its 95% interval (`seed_interval`), and on how many seeds epp's is the worse. A p99 is
one run's slowest 1%, a dozen requests on a 300 s run: three seeds cannot tell a 5% gap from the
draw of seeds, twenty can say whether it is one.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Final

# (column, key, kind, higher is better)
COLUMNS: tuple[tuple[str, str, str, bool], ...] = (
    ("req hit", "request_hit_rate", "pct", True),
    ("TTFT p99", "ttft_p99_s", "s", False),
    ("queue p90", "queueing_p90_s", "s", False),
    ("queue p99", "queueing_p99_s", "s", False),
    ("TPOT p50", "tpot_p50_s", "ms", False),
    ("TPOT p99", "tpot_p99_s", "ms", False),
    ("E2E p50", "e2e_p50_s", "s", False),
    ("E2E p99", "e2e_p99_s", "s", False),
    ("SLO met", "slo_met", "pct", True),
    ("out tok/s", "output_tok_per_s", "f0", True),
)


def load(paths: Sequence[str]) -> list[Mapping[str, Any]]:
    docs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            docs.append(json.load(f))
    return docs


def values(docs: Sequence[Mapping[str, Any]], workload: str, policy: str, key: str) -> list[float]:
    """`key` of `policy` on `workload` in each document that has it (nulls left out)."""
    out = []
    for doc in docs:
        entry = doc["workloads"].get(workload, {}).get("policies", {}).get(policy)
        if entry is not None and entry.get(key) is not None:
            out.append(float(entry[key]))
    return out


BOOTSTRAP_ROUNDS: Final = 2000


def _pairs(
    num: Sequence[Mapping[str, Any]], den: Sequence[Mapping[str, Any]], key: str
) -> list[tuple[float, float]]:
    """`key` of each seed's two runs, paired; seeds where either is missing (null, NaN) left out."""
    return [
        (float(a[key]), float(b[key]))
        for a, b in zip(num, den, strict=True)
        if a.get(key) is not None and b.get(key) is not None
        if not (math.isnan(a[key]) or math.isnan(b[key]))
    ]


def _ratio_of_means(pairs: Sequence[tuple[float, float]]) -> float:
    return statistics.fmean(a for a, _ in pairs) / max(statistics.fmean(b for _, b in pairs), 1e-12)


def seed_interval(
    num: Sequence[Mapping[str, Any]],
    den: Sequence[Mapping[str, Any]],
    key: str,
    *,
    rounds: int = BOOTSTRAP_ROUNDS,
) -> tuple[float, float]:
    """The 95% interval of mean(num[key]) / mean(den[key]) over the seeds, paired by seed (each
    resample draws seeds, both policies' runs of a drawn seed together): how far a ratio moves with
    which seeds were run. Seeds where either figure is missing (null, NaN) are left out. A p99 here
    is one run's ~20 slowest requests, and on pd-mixed at `--load 6` the same two policies' TTFT
    p99 ratio over 5 seeds ranged 0.86x-1.18x across eight blocks of 5 seeds (1.01x over the 40)."""
    pairs = _pairs(num, den, key)
    if not pairs:
        return math.nan, math.nan
    rng = random.Random(0)  # the same interval for the same runs
    ratios = []
    for _ in range(rounds):
        ratios.append(_ratio_of_means([pairs[rng.randrange(len(pairs))] for _ in pairs]))
    ratios.sort()
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]


def against_table(docs: Sequence[Mapping[str, Any]], workload: str, other: str, policy: str = "epp") -> str:
    """`policy` over `other` on `workload`, on the seeds that ran both: per figure, the ratio of
    the means, its interval (`seed_interval`) and the seeds where `policy`'s figure is the worse."""
    num: list[Mapping[str, Any]] = []
    den: list[Mapping[str, Any]] = []
    for doc in sorted(docs, key=lambda d: d["seed"]):
        runs = doc["workloads"].get(workload, {}).get("policies", {})
        if policy in runs and other in runs:
            num.append(runs[policy])
            den.append(runs[other])
    if not num:
        return f"{workload}: no seed ran both {policy} and {other}"
    lines = [
        f"{workload}: {policy} / {other}, {len(num)} seeds: ratio of the means [95% interval], seeds worse",
        "",
        "| figure | ratio | interval | seeds worse |",
        "|---|---|---|---|",
    ]
    for column, key, _, high in COLUMNS:
        pairs = _pairs(num, den, key)
        if not pairs:
            continue
        ratio = _ratio_of_means(pairs)
        lo, hi = seed_interval(num, den, key)
        worse = sum(1 for a, b in pairs if (a < b if high else a > b))
        lines.append(f"| {column} | {ratio:.3f}x | {lo:.3f}-{hi:.3f} | {worse} of {len(pairs)} |")
    return "\n".join(lines)


def median_worst(xs: Sequence[float], higher_is_better: bool) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    return statistics.median(xs), (min(xs) if higher_is_better else max(xs))


def _fmt(value: float, kind: str) -> str:
    if math.isnan(value):
        return "-"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "ms":
        return f"{value * 1000:.1f}"
    if kind == "f0":
        return f"{value:,.0f}"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def table(docs: Sequence[Mapping[str, Any]], workload: str) -> str:
    runs = [d["workloads"].get(workload, {}).get("policies", {}) for d in docs]
    policies = list(dict.fromkeys(p for r in runs for p in r))
    seeds = sorted({d["seed"] for d in docs if workload in d["workloads"]})
    lines = [
        f"**{workload}**: median (worst) over seeds {', '.join(map(str, seeds))}; TPOT in ms, times in s",
        "",
        "| policy | " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for policy in policies:
        cells = []
        for _, key, kind, better_high in COLUMNS:
            med, worst = median_worst(values(docs, workload, policy, key), better_high)
            cells.append(f"{_fmt(med, kind)} ({_fmt(worst, kind)})")
        name = f"**{policy}**" if policy == "epp" else policy
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


TARGETS: tuple[tuple[str, float, bool], ...] = (
    # (key, tolerance, higher is better): within `tolerance` of the best (a negative one: at
    # least that much better than the best, issue 18's "strictly better" 10%).
    ("e2e_p50_s", 0.05, False),
    ("e2e_p99_s", 0.05, False),
    ("ttft_p99_s", 0.02, False),
    ("output_tok_per_s", 0.02, True),
    ("queueing_p90_s", -0.10, False),
    ("queueing_p99_s", -0.10, False),
    ("slo_met", -0.10, True),
)


def ratios(
    doc: Mapping[str, Any], workload: str, policy: str = "epp", exclude: Sequence[str] = ("epp-ttft",)
) -> dict[str, tuple[float, str, bool]]:
    """`policy` against the best of the other policies (less `exclude`: epp's own former default
    is not a peer) on each of `TARGETS`: key -> (ratio to the best, who is best, target met)."""
    runs = doc["workloads"].get(workload, {}).get("policies", {})
    mine = runs.get(policy)
    others = {p: s for p, s in runs.items() if p != policy and p not in exclude}
    out: dict[str, tuple[float, str, bool]] = {}
    if mine is None or not others:
        return out
    for key, tol, high in TARGETS:
        xs = [(s[key], p) for p, s in others.items() if s.get(key) is not None]
        if mine.get(key) is None or not xs:
            continue
        best, who = max(xs) if high else min(xs)
        ratio = (mine[key] / best) if best else math.inf
        out[key] = (ratio, who, ratio >= 1 - tol if high else ratio <= 1 + tol)
    return out


def targets(docs: Sequence[Mapping[str, Any]], workload: str, policy: str = "epp") -> list[str]:
    """Per seed, `policy` against the best peer on issue 18's targets (`TARGETS`)."""
    lines = []
    for doc in sorted(docs, key=lambda d: d["seed"]):
        got = ratios(doc, workload, policy)
        if got:
            parts = [f"{k} {r:.3f}x {who} {'ok' if ok else 'MISS'}" for k, (r, who, ok) in got.items()]
            lines.append(f"seed {doc['seed']}: " + "; ".join(parts))
    return lines


def target_table(docs: Sequence[Mapping[str, Any]], workloads: Sequence[str], policy: str = "epp") -> str:
    """One row per workload: per target, epp's ratio to the best peer, median (worst) over the
    seeds, and on how many seeds the target holds."""
    lines = [
        "| workload | " + " | ".join(k for k, _, _ in TARGETS) + " |",
        "|" + "---|" * (len(TARGETS) + 1),
    ]
    for w in workloads:
        per_seed = [ratios(d, w, policy) for d in docs if w in d["workloads"]]
        cells = []
        for key, _, high in TARGETS:
            got = [r[key] for r in per_seed if key in r]
            if not got:
                cells.append("-")
                continue
            rs = [g[0] for g in got]
            med, worst = median_worst(rs, high)
            met = sum(1 for g in got if g[2])
            cells.append(f"{med:.3f} ({worst:.3f}) {met}/{len(got)}")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# epp against the real routers: (column, key, higher is better, shown as "ratio" or "points":
# the difference of two shares in percentage points). Two hit rates: the pods' own prefix-cache
# counters count every prefill a pod ran, epp's pre-warms too (a pre-warm is a miss by design, so
# they lower epp's figure); the answers' cached tokens over their prompt tokens count the clients'
# requests alone. "headroom": the best router's own figure below the workload's ceiling (the most
# any router's requests could find cached, `hit_rate_ceiling`), in points: where it is near 0, a
# router's pods' counters pass the best router's only if it makes no copies of a prefix.
PEER_COLUMNS: tuple[tuple[str, str, bool, str], ...] = (
    ("TTFT p99", "ttft_p99_s", False, "ratio"),
    ("TTFT p99 from 30 s", "ttft_p99_from_30s_s", False, "ratio"),  # past the cold start
    ("E2E p99", "e2e_p99_s", False, "ratio"),
    ("goodput", "goodput", True, "ratio"),
    ("hit rate, pods", "fleet_hit_rate", True, "points"),
    ("hit rate, requests", "hit_rate", True, "points"),
    ("best router's pods below the ceiling", "fleet_hit_rate", True, "headroom"),
    ("router CPU ms/request", "router_cpu_ms_per_request", False, "ratio"),
)


def peer_table(
    docs: Sequence[Mapping[str, Any]], workloads: Sequence[str], peers: Sequence[str], policy: str = "epp"
) -> str:
    """One row per workload: per column, `policy`'s value over the best of `peers` (the real
    routers) on the same seed, median (min-max) over the seeds, and who was best on each seed.
    Times and CPU: below 1 is better; goodput: above 1 is; the hit rate is the difference in
    percentage points."""
    lines = [
        "| workload | seeds | " + " | ".join(c for c, _, _, _ in PEER_COLUMNS) + " |",
        "|" + "---|" * (len(PEER_COLUMNS) + 2),
    ]
    for w in workloads:
        runs = [d["workloads"][w]["policies"] for d in docs if w in d["workloads"]]
        runs = [r for r in runs if policy in r and any(p in r for p in peers)]
        if not runs:
            continue
        cells = []
        for _, key, high, kind in PEER_COLUMNS:
            got: list[tuple[float, str]] = []
            for r in runs:
                xs = [(float(r[p][key]), p) for p in peers if p in r and r[p].get(key) is not None]
                mine = r[policy].get(key)
                if mine is None or not xs:
                    continue
                best, who = max(xs) if high else min(xs)
                if kind == "headroom":
                    ceiling = r[who].get("hit_rate_ceiling")
                    if ceiling is not None:
                        got.append((100.0 * (float(ceiling) - best), who))
                elif kind == "points":
                    got.append((100.0 * (float(mine) - best), who))
                else:
                    got.append((float(mine) / best if best else math.inf, who))
            if not got:
                cells.append("-")
                continue
            rs = [g[0] for g in got]
            whom = ", ".join(dict.fromkeys(g[1] for g in got))
            if kind == "points":
                cells.append(f"{statistics.median(rs):+.1f} ({min(rs):+.1f} to {max(rs):+.1f}) {whom}")
            elif kind == "headroom":
                cells.append(f"{statistics.median(rs):.1f} ({min(rs):.1f}-{max(rs):.1f}) {whom}")
            else:
                cells.append(f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f}) {whom}")
        lines.append(f"| {w} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m epp.bench.seeds",
        description="Median and worst over seeds of `epp bench` results (one results.json per seed, "
        "every policy of a seed in the same file).",
    )
    ap.add_argument("results", nargs="+", metavar="RESULTS.json")
    ap.add_argument(
        "--against",
        metavar="POLICY",
        help="also epp's figures over POLICY's: ratio of the means, 95%% interval over the seeds, "
        "seeds where epp's is the worse",
    )
    args = ap.parse_args(argv)
    try:
        docs = load(args.results)
    except (OSError, ValueError, KeyError) as exc:  # a missing or foreign file: say which
        ap.error(f"cannot read the results: {exc}")
    workloads = list(dict.fromkeys(w for d in docs for w in d["workloads"]))
    for w in workloads:
        print(table(docs, w), end="\n\n")
        for line in targets(docs, w):
            print("  " + line)
        print()
        if args.against:
            print(against_table(docs, w, args.against), end="\n\n")
    print(target_table(docs, workloads))
    from epp.bench.peers import PEERS  # the real routers, when the runs had them as arms

    if any(p in d["workloads"][w]["policies"] for d in docs for w in d["workloads"] for p in PEERS):
        print()
        print(peer_table(docs, workloads, list(PEERS)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
