"""Flow control's targets in fast mode (virtual time: the figures do not depend on the machine's
load), over several seeds: docs/bench/flow-control.md#flow-control.

    .venv/bin/python scripts/bench_flow_control.py --seeds 1,2,3,4,5 --out bench-results/flow-control

Runs `overload-3x`, `tenant-burst`, `tenant-steady` and `cold-start` (`epp.bench.overload`) under
the admission policies (`epp.bench.policies.ADMISSION`: flow control off, SGLang's overload veto,
llm-d's flow-control defaults, epp's flow control), and reports, per policy, the mean over the
seeds and the worst seed of:

- Priority (overload-3x): critical TTFT p99 at 3x over its p99 unloaded, i.e. the same critical
  requests sent alone (target <= 1.5), critical requests shed (target 0), sheddable requests
  shed and the longest a shed one waited for its answer (target: a 429 within the 60 s budget);
- Goodput (overload-3x, 3x stage): the share of requests served within the latency targets
  (target: flow control >= every other policy, and >= 1.2x flow control off);
- Fairness (tenant-burst vs tenant-steady): the nine steady tenants' TTFT p99 in the burst stage
  over the same without the burst (target <= 1.2, with round-robin fairness), and Jain's index
  over the tenants' served requests while all are backlogged (target >= 0.95);
- Cold start: the share of the requests sent before the first pod came up that were served.

Writes `flow-control.json` (every figure per seed), `flow-control.md` (the tables) and
`queue-over-time.png` (requests held per band under overload, first seed) into --out.

`--mode live` runs the same (but cold-start) through a real Envoy and `epp serve` over simulated
pods in real time: timing-sensitive, for a quiet machine
(docs/bench/flow-control.md#flow-control-live has the command).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from epp.bench import admission_report as ar
from epp.bench import fast, fast_scrapes, records, report
from epp.bench.overload import CRITICAL, PriorityOverload
from epp.bench.policies import ADMISSION, POLICIES
from epp.bench.workload import Fleet, Prompt, Workload
from epp.bench.workloads import WORKLOADS
from epp.flags.serve import BOOKED_METRICS_INTERVAL_S
from epp.sim.profiles import get_profile

WORKLOAD_NAMES = ("overload-3x", "critical-only", "tenant-burst", "tenant-steady", "cold-start")
OFF = "gie-approx"
ON = "flow-control"


class CriticalOnly(PriorityOverload):
    """overload-3x's critical requests alone (the same ones: the class draws are independent of
    the arrival times and prompts): what "unloaded" is for the critical class."""

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        return ((t, p) for t, p in super().arrivals() if p.priority == CRITICAL)


LIVE: dict[str, Any] = {}  # --mode live: {"time_scale": ..., "workdir": ...}
FAST: dict[str, Any] = {}  # fast mode: {"booked_interval_s": ...} from --booked-scrape-interval


def run(name: str, policy: str, seed: int, scale: float, pods: int) -> tuple[records.RunResult, Workload]:
    cls = CriticalOnly if name == "critical-only" else WORKLOADS[name]
    profile = get_profile(cls.default_profile)
    fleet = Fleet(pods, profile.num_gpu_blocks * profile.block_size, profile.max_model_len)
    workload = cls(seed=seed, scale=scale, fleet=fleet)
    if LIVE:
        from epp.bench.gateways import EppGateway
        from epp.bench.live import LiveRun

        gateway = EppGateway(POLICIES[policy])
        live = LiveRun(workload, gateway, profile=profile, pods=pods, seed=seed, **LIVE)
        result = live.run()
        if live.behind_s > 0.5:
            print(f"warning: {name} / {policy} fell {live.behind_s:.1f} s behind real time", file=sys.stderr)
        return result, workload
    result = fast.FastRun(workload, POLICIES[policy], profile=profile, pods=pods, seed=seed, **FAST).run()
    return result, workload


def measure(
    seeds: Sequence[int], scale: float, pods: int, policies: Sequence[str], log: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, records.RunResult], Sequence[Any]]:
    slo = report.slo_for(PriorityOverload.default_profile)
    figures: dict[str, Any] = {p: {"seeds": {}} for p in policies}
    plot_runs: dict[str, records.RunResult] = {}
    plot_stages: Sequence[Any] = ()
    for seed in seeds:
        for policy in policies:
            t0 = time.perf_counter()
            entry: dict[str, Any] = {}
            results = {}
            for name in WORKLOAD_NAMES:
                if LIVE and name == "cold-start":
                    continue  # live mode starts the pods with the run
                result, workload = run(name, policy, seed, scale, pods)
                results[name] = (result, workload)
                if name == "overload-3x" and seed == seeds[0]:
                    plot_runs[policy] = result
                    plot_stages = workload.stages
            result, workload = results["overload-3x"]
            over = ar.by_priority(result, workload.stages, slo)["3x"]
            alone = ar.by_priority(*_rw(results["critical-only"]), slo)["3x"]["10"]
            entry["priority"] = {
                "critical_ttft_p99_unloaded_s": alone["ttft_p99_s"],
                "critical_ttft_p99_3x_s": over["10"]["ttft_p99_s"],
                "critical_ratio": over["10"]["ttft_p99_s"] / alone["ttft_p99_s"],
                "critical_shed": over["10"]["shed_429"] + over["10"]["shed_503"],
                "standard_shed": over["0"]["shed_429"] + over["0"]["shed_503"],
                "sheddable": over["-1"],
                "critical": over["10"],
                "standard": over["0"],
            }
            entry["goodput"] = over["all"]["goodput"]
            burst = ar.by_tenant(*_rw(results["tenant-burst"]), slo)
            steady = ar.by_tenant(*_rw(results["tenant-steady"]), slo)
            nine = [f"tenant-{i}" for i in range(1, 10)]
            p99_burst = _pooled_p99(results["tenant-burst"][0], 1, nine)
            p99_steady = _pooled_p99(results["tenant-steady"][0], 1, nine)
            entry["fairness"] = {
                "steady_ttft_p99_burst_s": p99_burst,
                "steady_ttft_p99_no_burst_s": p99_steady,
                "steady_ratio": p99_burst / p99_steady,
                "worst_tenant_ratio": max(
                    burst["burst"]["tenants"][t]["ttft_p99_s"] / steady["burst"]["tenants"][t]["ttft_p99_s"]
                    for t in nine
                ),
                "jains_backlogged": burst["backlogged"]["jains_served"],
                "burst_tenant": burst["burst"]["tenants"]["tenant-0"],
            }
            cold, _ = results.get("cold-start", (records.RunResult("", "", 0, 0, "", [], []), None))
            before = ar.in_stage(cold.records, 0)
            entry["cold_start"] = {
                "requests_before_pods": len(before),
                "served_share": sum(1 for r in before if r.status == 200) / len(before)
                if before
                else math.nan,
                "shed_503": sum(1 for r in before if r.status == 503),
            }
            figures[policy]["seeds"][seed] = entry
            log(f"seed {seed} {policy}: {time.perf_counter() - t0:.1f} s wall")
    return figures, plot_runs, plot_stages


def _rw(pair: tuple[records.RunResult, Workload]) -> tuple[records.RunResult, Sequence[Any]]:
    return pair[0], pair[1].stages


def _pooled_p99(result: records.RunResult, stage: int, tenants: Sequence[str]) -> float:
    ttft = sorted(
        r.first_token - r.arrival
        for r in result.records
        if r.stage == stage and r.fairness_id in tenants and r.status == 200 and r.first_token is not None
    )
    return report.percentile(ttft, 99)


def _agg(values: Sequence[float], worst: Callable[[Sequence[float]], float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "-"
    return f"{statistics.fmean(finite):.3g} ({worst(finite):.3g})"


def tables(figures: dict[str, Any], seeds: Sequence[int]) -> str:
    def col(policy: str, path: Sequence[str], worst: Callable[[Sequence[float]], float] = max) -> str:
        values = []
        for seed in seeds:
            node: Any = figures[policy]["seeds"][seed]
            for key in path:
                node = node[key]
            values.append(float(node))
        return _agg(values, worst)

    rows = [
        "| policy | critical TTFT p99 3x / alone | critical shed | standard shed "
        "| sheddable shed (429 / 503) "
        "| longest wait of a shed request (s) | goodput at 3x | steady tenants' TTFT p99, burst / none "
        "| worst tenant | Jain's index, backlogged | cold start: served before pods |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for policy in figures:
        shed = [figures[policy]["seeds"][s]["priority"]["sheddable"] for s in seeds]
        rows.append(
            "| "
            + " | ".join(
                [
                    policy,
                    col(policy, ["priority", "critical_ratio"]),
                    col(policy, ["priority", "critical_shed"]),
                    col(policy, ["priority", "standard_shed"]),
                    " / ".join(
                        f"{statistics.fmean(x[k] for x in shed):.0f}" for k in ("shed_429", "shed_503")
                    ),
                    col(policy, ["priority", "sheddable", "shed_wait_max_s"]),
                    col(policy, ["goodput"], min),
                    col(policy, ["fairness", "steady_ratio"]),
                    col(policy, ["fairness", "worst_tenant_ratio"]),
                    col(policy, ["fairness", "jains_backlogged"], min),
                    col(policy, ["cold_start", "served_share"], min),
                ]
            )
            + " |"
        )
    return "\n".join(rows) + "\n\nEach cell: the mean over the seeds (the worst seed).\n"


def verdicts(figures: dict[str, Any], seeds: Sequence[int]) -> list[str]:
    """The issue's targets, per seed, for epp's flow control."""
    if ON not in figures:
        return []
    out = []
    for seed in seeds:
        on = figures[ON]["seeds"][seed]
        others = [figures[p]["seeds"][seed]["goodput"] for p in figures if p != ON]
        off = figures[OFF]["seeds"][seed]["goodput"] if OFF in figures else math.nan
        checks = {
            "critical p99 <= 1.5x unloaded": on["priority"]["critical_ratio"] <= 1.5,
            "no critical shed": on["priority"]["critical_shed"] == 0,
            "sheds are 429 within the budget": on["priority"]["sheddable"]["shed_503"] == 0
            and on["priority"]["sheddable"]["shed_wait_max_s"] <= 60.0 + 1e-6,
            "goodput >= every other": all(on["goodput"] >= g for g in others),
            "goodput >= 1.2x off": on["goodput"] >= 1.2 * off,
            "steady tenants' p99 moves <= 20%": on["fairness"]["steady_ratio"] <= 1.2,
            "Jain's >= 0.95": on["fairness"]["jains_backlogged"] >= 0.95,
        }
        out.append(f"seed {seed}: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="share of each workload's time (0.1: a smoke run)"
    )
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--policies", default=",".join(ADMISSION))
    parser.add_argument("--out", default="bench-results/flow-control")
    parser.add_argument(
        "--mode",
        default="fast",
        choices=("fast", "live"),
        help="live: through Envoy and `epp serve` over simulated pods in real time (not cold-start)",
    )
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="live mode: wall seconds per simulated second"
    )
    fast_scrapes.add_booked_scrape_argument(parser, default=None)
    args = parser.parse_args(argv)
    if (problem := fast_scrapes.booked_interval_problem(args.booked_scrape_interval)) is not None:
        parser.error(problem)
    if args.booked_scrape_interval is not None:
        if args.mode == "live":
            parser.error("--booked-scrape-interval is for fast mode (live: epp serve's own pace)")
        FAST.update(booked_interval_s=args.booked_scrape_interval)
    if args.mode == "live":
        from pathlib import Path

        LIVE.update(time_scale=args.time_scale, workdir=Path(args.out) / "logs")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    os.makedirs(args.out, exist_ok=True)
    figures, plot_runs, stages = measure(
        seeds, args.scale, args.pods, policies, lambda line: print(line, file=sys.stderr, flush=True)
    )
    text = tables(figures, seeds)
    lines = verdicts(figures, seeds)
    with open(os.path.join(args.out, "flow-control.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "seeds": seeds,
                "scale": args.scale,
                "pods": args.pods,
                "booked_scrape_interval_s": FAST.get("booked_interval_s", BOOKED_METRICS_INTERVAL_S),
                "figures": figures,
            },
            f,
            indent=1,
            default=str,
        )
    with open(os.path.join(args.out, "flow-control.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n" + "\n".join(lines) + "\n")
    png = os.path.join(args.out, "queue-over-time.png")
    drawn = ar.queue_plot(png, f"overload-3x, seed {seeds[0]}: requests held per band", plot_runs, stages)
    print(text)
    print("\n".join(lines))
    print(f"\nwritten: {args.out}/flow-control.json, flow-control.md" + (f", {png}" if drawn else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
