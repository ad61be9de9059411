"""`python -m epp.bench.soak`: the flags, a run that SIGTERM/SIGINT cut short cleanly, the
summary printed at the end (exit 1 if a request was lost), and `--diff` of tracemalloc dumps."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import epp.bench.soak as package
from epp.bench.soak.config import FAULTS, SoakConfig
from epp.bench.soak.memtrace import diff_snapshots
from epp.bench.soak.report import render
from epp.bench.soak.run import Soak


async def _run_until_signalled(soak: Soak) -> dict[str, Any]:
    """Run the soak; SIGTERM/SIGINT cut it short but still stop every process it started."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    return await soak.run()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m epp.bench.soak", description=(package.__doc__ or "").split("\n")[0]
    )
    p.add_argument("--out", type=Path, default=Path("soak-out"))
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--pods", type=int, default=3)
    p.add_argument("--warmup", type=float, default=120.0)
    p.add_argument("--fault-every", type=float, default=300.0)
    p.add_argument("--fault-duration", type=float, default=20.0)
    p.add_argument("--grace", type=float, default=10.0)
    p.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated, in rotation order ('' = none)"
    )
    p.add_argument(
        "--attack-rate",
        type=float,
        default=0.0,
        help="client attacks a second beside the load (epp.bench.soak.attacks; default 0: none)",
    )
    p.add_argument("--time-scale", type=float, default=0.05)
    p.add_argument("--tracemalloc", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--epp-arg", action="append", default=[], help="an extra `epp serve` argument (repeat)")
    p.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="diff two tracemalloc dumps and exit")
    args = p.parse_args(argv)
    if args.diff:
        print(diff_snapshots(*args.diff))
        return 0
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = set(faults) - set(FAULTS)
    if unknown:
        p.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    cfg = SoakConfig(
        out=args.out,
        duration=args.duration,
        rate=args.rate,
        pods=args.pods,
        warmup=args.warmup,
        fault_every=args.fault_every,
        fault_duration=args.fault_duration,
        grace=args.grace,
        faults=faults,
        time_scale=args.time_scale,
        tracemalloc_every=args.tracemalloc,
        epp_args=tuple(args.epp_arg),
        attack_rate=args.attack_rate,
    )
    report = asyncio.run(_run_until_signalled(Soak(cfg)))
    print(render(report))
    return 0 if report["lost"] == 0 and report["attack_5xx"] == 0 else 1
