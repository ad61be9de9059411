"""Worker scaling: `epp bench overhead` with `epp serve --workers 1` and `--workers N`, interleaved.

Each round runs the overhead benchmark once per worker count (each run with its own Envoy-alone
baseline arm), so a machine whose load drifts affects every count alike. epp's CPU is the whole
process tree's (the supervisor and its workers: epp.bench.measure.cpu_seconds). Prints one
Markdown table: per worker count, the medians over rounds of req/s, epp CPU ms per request (all
of it, and above epp's idle CPU measured in the same run's baseline arm), epp CPU in cores, and
the baseline's req/s of the same runs; the load average before each run.

    python scripts/bench_workers.py --workers 1,2 --rounds 3 -- --connections 64 --duration 10

Arguments after `--` go to `epp bench overhead` (its --arms default here: baseline,duplex).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Run:
    round: int
    workers: int
    load1: float
    points: list[dict[str, Any]]


def _normalize(run: Run) -> None:
    """`--stream` points name their concurrency `streams` and carry no req/s nor CPU share: the
    same fields as request points, from their requests, wall time and CPU seconds."""
    for p in run.points:
        p.setdefault("conns", p.get("streams"))
        if "rps" not in p:
            p["rps"] = p["requests"] / p["wall_s"] if p["wall_s"] else 0.0
        if "epp_cpu_pct" not in p:
            p["epp_cpu_pct"] = p["epp_cpu_s"] / p["wall_s"] * 100 if p["wall_s"] else 0.0
        if "epp_cpu_ms_per_req" not in p and p["arm"] != "baseline":
            p["epp_cpu_ms_per_req"] = p["epp_cpu_s"] * 1e3 / p["requests"] if p["requests"] else 0.0


def _marginal(run: Run) -> None:
    """Adds `epp_marginal_ms_per_req` to the run's epp points: the CPU above what epp spends idle
    (each worker scrapes every pod every 50 ms), taken from the baseline arm of the same run
    (epp is up, Envoy sends it nothing)."""
    idle = [p["epp_cpu_pct"] for p in run.points if p["arm"] == "baseline"]
    idle_frac = statistics.median(idle) / 100 if idle else 0.0
    for p in run.points:
        if p["arm"] != "baseline" and p["requests"]:
            busy = p["epp_cpu_s"] - idle_frac * p["wall_s"]
            p["epp_marginal_ms_per_req"] = busy * 1e3 / p["requests"]
            p["epp_idle_cores"] = idle_frac


def _median(runs: list[Run], field: str, arm: str, conns: int) -> float:
    return float(
        statistics.median(p[field] for r in runs for p in r.points if p["arm"] == arm and p["conns"] == conns)
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated (default 1,2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default="", help="JSON with every run's points (default: none)")
    parser.add_argument("--summarize", default="", help="print the table of an --output file; run nothing")
    parser.add_argument("overhead", nargs="*", help="arguments for `epp bench overhead` (after --)")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    extra = list(args.overhead)
    if not any(a.startswith("--arms") for a in extra):
        extra += ["--arms", "baseline,duplex"]
    runs: list[Run] = []
    if args.summarize:
        runs = [Run(**r) for r in json.loads(Path(args.summarize).read_text())]
        for run in runs:
            _normalize(run)
            _marginal(run)
        counts = sorted({r.workers for r in runs})
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        for round_ in range(1, 0 if args.summarize else args.rounds + 1):
            for count in counts:
                out = Path(tmp) / f"r{round_}-w{count}.json"
                load = os.getloadavg()[0]
                cmd = [
                    sys.executable, "-m", "epp", "bench", "overhead", "--rounds", "1",
                    f"--epp-arg=--workers={count}", "--output", str(out), *extra,
                ]  # fmt: skip
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                run = Run(round_, count, load, json.loads(out.read_text())["points"])
                _normalize(run)
                _marginal(run)
                runs.append(run)
                print(
                    f"round {round_} workers={count} load={load:.1f}: "
                    + ", ".join(
                        f"{p['arm']} c={p['conns']} {p['rps']:.0f} req/s "
                        f"{p['epp_cpu_ms_per_req']:.3f} ms/req {p['epp_cpu_pct'] / 100:.2f} cores"
                        for p in run.points
                        if p["arm"] != "baseline"
                    ),
                    file=sys.stderr,
                )
    if args.output:
        Path(args.output).write_text(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))
    keys = sorted({(p["arm"], p["conns"]) for r in runs for p in r.points if p["arm"] != "baseline"})
    print(
        "| path | conns | workers | req/s | epp CPU ms/req | above idle ms/req | epp CPU (cores) "
        "| epp idle (cores) | baseline req/s | load avg |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arm, conns in keys:
        for count in counts:
            mine = [r for r in runs if r.workers == count]
            print(
                f"| {arm} | {conns} | {count} | {_median(mine, 'rps', arm, conns):.0f} "
                f"| {_median(mine, 'epp_cpu_ms_per_req', arm, conns):.3f} "
                f"| {_median(mine, 'epp_marginal_ms_per_req', arm, conns):.3f} "
                f"| {_median(mine, 'epp_cpu_pct', arm, conns) / 100:.2f} "
                f"| {_median(mine, 'epp_idle_cores', arm, conns):.3f} "
                f"| {_median(mine, 'rps', 'baseline', conns):.0f} "
                f"| {statistics.median(r.load1 for r in mine):.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
