"""`epp bench --workload NAME ...`: every routing policy over the same workload, compared.

For each workload, each policy runs over a fresh simulated fleet (`epp.bench.fast`) with the same
seed, so every policy sees the same requests. Output: a table per workload on stdout, a progress
bar on stderr (on a terminal, or with `--progress`), and in `--out DIR`: `results.json` (written
after each policy, so a long run keeps what it finished) and PNG plots when matplotlib is
installed (`pip install epp[bench]`).

A bench configuration error (unknown workload, policy, profile, bad scale) names the option and
the allowed values, and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from epp.bench import fast, report
from epp.bench.policies import POLICIES, Policy
from epp.bench.progress import Progress
from epp.bench.trace import Trace, TraceError
from epp.bench.workload import Fleet, Workload
from epp.bench.workloads import WORKLOADS
from epp.sim.profiles import PROFILES, Profile, get_profile

TRACE_PREFIX = "trace:"


class BenchConfigError(ValueError):
    """A bench option epp cannot run with; the message names the option and the allowed values."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME",
        help=f"workload(s), repeatable or comma-separated: {', '.join(WORKLOADS)}, "
        f"{TRACE_PREFIX}<path.jsonl>, or all",
    )
    parser.add_argument(
        "--policies", default="all", help=f"comma-separated (default all): {', '.join(POLICIES)}"
    )
    parser.add_argument(
        "--mode", default="fast", help="fast (virtual time, in process); live is not there yet"
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the workload and the pickers (default 1)"
    )
    parser.add_argument(
        "--out", default="bench-results/fast", help="output directory (default bench-results/fast)"
    )
    parser.add_argument("--list", action="store_true", help="list workloads and policies, then exit")
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--scale",
        type=float,
        default=None,
        help="run this share of each workload's time (e.g. 0.05 for a smoke run)",
    )
    size.add_argument(
        "--duration", type=float, default=None, help="seconds of arrivals per workload (virtual time)"
    )
    parser.add_argument(
        "--profile", default=None, help=f"engine profile for every pod: {', '.join(PROFILES)}"
    )
    parser.add_argument("--pods", type=int, default=None, help="pods in the fleet (default: the workload's)")
    parser.add_argument(
        "--kv-delay", type=float, default=0.0, help="seconds from a step's end to its KV events in the index"
    )
    parser.add_argument("--progress", action="store_true", help="draw the progress bar even off a terminal")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def listing() -> str:
    lines = ["workloads:"]
    for name, w in WORKLOADS.items():
        lines.append(f"  {name:<20} {w.description} [{w.default_pods} x {w.default_profile}]")
    lines.append(
        f"  {TRACE_PREFIX + '<path.jsonl>':<20} replay a JSONL trace: t, prompt or token ids, max_tokens"
    )
    lines.append("policies:")
    for name, p in POLICIES.items():
        lines.append(f"  {name:<20} {p.description}")
    lines.append("profiles:")
    for name, prof in PROFILES.items():
        lines.append(f"  {name:<20} {prof.description}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(listing())
        return 0
    try:
        plan = _plan(args)
    except BenchConfigError as err:
        print(f"epp bench: {err}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    progress = Progress(enabled=args.progress or sys.stderr.isatty())
    results: dict[str, Any] = {}
    plots: list[str] = []
    path = os.path.join(args.out, "results.json")
    for name, build, profile, pods in plan:
        runs: dict[str, dict[str, Any]] = {}
        ttfts: dict[str, list[float]] = {}
        for policy in plan_policies(args):
            workload = build()  # fresh: a workload holds its random state
            progress.start(f"{name} / {policy.name}")
            result = fast.FastRun(
                workload, policy, profile=profile, pods=pods, seed=args.seed, kv_delay_s=args.kv_delay,
                progress=progress.update,
            ).run()  # fmt: skip
            progress.finish(f"({result.steps:,} engine steps, {len(result.records):,} requests)")
            runs[policy.name] = report.summarize(result, workload.stages)
            ttfts[policy.name] = report.ttft_values(result)
            # Written after every policy: a long run keeps what it finished.
            results[name] = report.workload_entry(workload, profile.name, pods, runs)
            report.write_results(path, seed=args.seed, mode="fast", workloads=results)
        print(report.table(name, results[name]), end="\n\n", flush=True)
        if not args.no_plots:
            plots += report.plot(args.out, _file_name(name), results[name], ttfts)
    print(f"results: {path}")
    if plots:
        print("plots: " + ", ".join(plots))
    elif not args.no_plots:
        print("plots: none (install matplotlib: pip install 'epp[bench]')")
    return 0


_Plan = list[tuple[str, Callable[[], Workload], Profile, int]]


def _plan(args: argparse.Namespace) -> _Plan:
    """(name, workload builder, profile, pods) per requested workload; raises BenchConfigError."""
    if args.mode != "fast":
        if args.mode == "live":
            raise BenchConfigError(
                "--mode live (through Envoy and epp serve, real time) is not implemented yet; use --mode fast"
            )
        raise BenchConfigError(f"--mode: unknown mode {args.mode!r}; allowed: fast, live")
    names = [n.strip() for arg in args.workload for n in arg.split(",") if n.strip()]
    if not names:
        raise BenchConfigError(f"--workload is required; allowed: {_allowed_workloads()}")
    if "all" in names:
        names = [n for n in names if n != "all"] + [n for n in WORKLOADS if n not in names]
    plan_policies(args)  # validate before running anything
    if args.scale is not None and not args.scale > 0:
        raise BenchConfigError(f"--scale must be > 0, got {args.scale}")
    if args.duration is not None and not args.duration > 0:
        raise BenchConfigError(f"--duration must be > 0, got {args.duration}")
    if args.pods is not None and args.pods < 1:
        raise BenchConfigError(f"--pods must be >= 1, got {args.pods}")
    if args.kv_delay < 0:
        raise BenchConfigError(f"--kv-delay must be >= 0, got {args.kv_delay}")
    plan: _Plan = []
    for name in dict.fromkeys(names):
        if name.startswith(TRACE_PREFIX):
            cls: type[Workload] = Trace
        elif name in WORKLOADS:
            cls = WORKLOADS[name]
        else:
            raise BenchConfigError(f"--workload: unknown workload {name!r}; allowed: {_allowed_workloads()}")
        try:
            profile = get_profile(args.profile or cls.default_profile)
        except ValueError as err:
            raise BenchConfigError(f"--profile: {err}") from None
        pods = args.pods or cls.default_pods
        fleet = Fleet(pods, profile.num_gpu_blocks * profile.block_size, profile.max_model_len)
        plan.append((name, _builder(name, cls, args, fleet), profile, pods))
    return plan


def _builder(
    name: str, cls: type[Workload], args: argparse.Namespace, fleet: Fleet
) -> Callable[[], Workload]:
    def build(scale: float) -> Workload:
        if cls is Trace:
            return Trace(name[len(TRACE_PREFIX) :], seed=args.seed, scale=scale, fleet=fleet)
        return cls(seed=args.seed, scale=scale, fleet=fleet)

    scale = args.scale or 1.0
    try:
        probe = build(scale)
    except TraceError as err:
        raise BenchConfigError(f"--workload: {err}") from None
    if args.duration is not None:
        scale = args.duration / probe.duration * scale
    return lambda: build(scale)


def plan_policies(args: argparse.Namespace) -> list[Policy]:
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if names == ["all"] or not names:
        return list(POLICIES.values())
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise BenchConfigError(
            f"--policies: unknown policy {unknown[0]!r}; allowed: {', '.join(POLICIES)}, all"
        )
    return [POLICIES[n] for n in dict.fromkeys(names)]


def _allowed_workloads() -> str:
    return ", ".join([*WORKLOADS, f"{TRACE_PREFIX}<path.jsonl>", "all"])


def _file_name(workload: str) -> str:
    """A workload name as a file name (trace:<path> keeps only the file's stem)."""
    if workload.startswith(TRACE_PREFIX):
        return "trace-" + os.path.splitext(os.path.basename(workload[len(TRACE_PREFIX) :]))[0]
    return workload
