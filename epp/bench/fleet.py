"""`epp bench fleet`: what epp costs in front of 10, 100 or 1,000 pods, idle and busy.

For each pod count and worker count it starts the pods (`epp.bench.fleet_pods`: a real vLLM 0.32
/metrics page and a KV-event stream each, ~`--pods-per-process` per process) and `epp serve` in
front of them (an endpoints file naming every pod and its publisher, `--kv-events connect`, the
default precise config), waits until every pod is scraped, and measures, from the CPU seconds of
epp's process tree (/proc: supervisor, workers, body parsers):

- idle: CPU with no request and no KV event, as a share of one core, in total and per pod;
- requests: `--request-rate` chat requests a second for `--duration` s sent straight to epp's
  ext-proc port (a gRPC client playing Envoy's part: request headers and body, response headers
  and body, no model behind), each sharing a ~2k-token system prompt; CPU per request is the
  stretch's CPU less the idle rate's share;
- KV events: each `--kv-rates` total (blocks per second over all pods) for `--duration` s, the
  CPU per 1,000 blocks, then the catch-up: publishing stops and epp's applied batches
  (`epp_kv_events_batches_total`) are polled until they reach what the pods sent; a rate is
  sustained without lag while the catch-up stays under 100 ms and no message was dropped;
- memory: the tree's proportional set size (PSS) idle, and after the KV stages over the index's
  entries (bytes per indexed block, index and all);
and writes `fleet.json`, a table (`fleet.md`) and, with matplotlib, `fleet-cpu.png` and
`fleet-memory.png` (idle CPU and memory against pods, one line per worker count). The table's
scrapes/s is what the pods served while idle: pods x (scraping processes) / interval when they
kept up; below that, the pods' processes were the limit (add some: `--pods-per-process`) and
epp's idle figure is low.

CPU per request and per 1,000 blocks are each stretch's CPU less the idle rate's share: when
scraping is a large part of the idle CPU and a busy epp scrapes late, the difference
understates them; read them against each other at one pod count.

Every figure is the whole epp pod's (all its workers); divide by the workers for one, and a
replica is one such pod. The pods and the client run on the same machine and are not counted:
on a small machine their CPU competes with epp's, so large fleets need a quiet, larger one.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import grpc
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.gateway.processes import HOST, free_ports

CATCH_UP_OK_S = 0.1
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pods", type=_ints, default=[10, 100, 1000], help="pod counts (default 10,100,1000)"
    )
    parser.add_argument("--workers", type=_ints, default=[1], help="epp --workers values (default 1)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per measured stretch")
    parser.add_argument("--request-rate", type=float, default=20.0, help="requests/s (0: none)")
    parser.add_argument(
        "--kv-rates",
        type=_ints,
        default=[10_000, 50_000, 200_000],
        help="total KV-event rates, blocks/s over all pods (default 10000,50000,200000)",
    )
    parser.add_argument("--pods-per-process", type=int, default=250)
    parser.add_argument(
        "--refresh-metrics-interval", default="50ms", help="epp's scrape interval (GIE's default 50ms)"
    )
    parser.add_argument("--epp-arg", action="append", default=[], help="an extra `epp serve` argument")
    parser.add_argument(
        "--epp-python",
        action="append",
        default=[],
        help="the Python whose epp to run (repeat to compare installs, e.g. a baseline commit's venv; "
        "default: this one)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/fleet"))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


# --- processes ------------------------------------------------------------------------------------


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of `root` and every live descendant."""
    total = 0.0
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def tree_pss(root: int) -> int:
    """Proportional set size of `root` and its descendants, bytes (shared pages split)."""
    total = 0
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class Pods:
    """The simulated pods, in `processes` processes of `epp.bench.fleet_pods`."""

    def __init__(self, count: int, per_process: int) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.listing: list[dict[str, Any]] = []
        for start in range(0, count, per_process):
            n = min(per_process, count - start)
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "epp.bench.fleet_pods",
                    "--count",
                    str(n),
                    "--prefix",
                    f"pod-{start}-",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self.procs.append(proc)
        for proc in self.procs:
            self.listing.extend(json.loads(_readline(proc.stdout))["pods"])

    def send(self, **cmd: Any) -> list[dict[str, Any]]:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(cmd) + "\n")
            proc.stdin.flush()
        if not cmd.get("stats"):
            return []
        return [json.loads(_readline(proc.stdout)) for proc in self.procs]

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for stats in self.send(stats=True):
            for k, v in stats.items():
                out[k] = out.get(k, 0) + int(v)
        return out

    def set_rate(self, total_blocks_per_s: float) -> None:
        self.send(rate=total_blocks_per_s / max(1, len(self.listing)))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                assert proc.stdin is not None
                try:
                    proc.stdin.write(json.dumps({"stop": True}) + "\n")
                    proc.stdin.flush()
                except BrokenPipeError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


def _readline(stream: IO[str] | None) -> str:
    assert stream is not None
    line = stream.readline()
    if not line:
        raise RuntimeError("a fleet_pods process exited before answering")
    return line


class Epp:
    """`epp serve` in front of the pods (its own session: stopped with its workers)."""

    def __init__(
        self, pods: list[dict[str, Any]], workers: int, args: argparse.Namespace, workdir: Path, python: str
    ) -> None:
        endpoints = workdir / "endpoints.yaml"
        entries = [
            {
                "name": p["name"],
                "address": p["address"],
                "port": p["port"],
                "model": "tiny",
                "kvEvents": p["kv_events"],
            }
            for p in pods
        ]
        endpoints.write_text(yaml.safe_dump({"endpoints": entries}))
        self.grpc_port, health, self.metrics_port = free_ports(3)
        self.log = open(workdir / f"epp-{len(pods)}-{workers}-{abs(hash(python)) % 10_000}.log", "w")  # noqa: SIM115 (closed in stop)
        argv = [
            python, "-m", "epp", "serve",
            "--secure-serving=false",
            "--endpoints-file", str(endpoints),
            "--kv-events", "connect",
            "--kv-block-size", "16",
            "--workers", str(workers),
            "--grpc-port", str(self.grpc_port),
            "--grpc-health-port", str(health),
            "--metrics-port", str(self.metrics_port),
            "--refresh-metrics-interval", args.refresh_metrics_interval,
            *args.epp_arg,
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pods = len(pods)

    def metric(self, name: str) -> float:
        """The sum of a family's samples on epp's /metrics (0 if absent)."""
        with urllib.request.urlopen(f"http://{HOST}:{self.metrics_port}/metrics", timeout=30) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"epp exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if self.metric("inference_pool_ready_pods") >= self.pods:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"epp did not see {self.pods} ready pods in {timeout:g}s; see {self.log.name}")

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid)

    def pss(self) -> int:
        return tree_pss(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # SIGINT: no drain delay (epp.drain)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


# --- requests ---------------------------------------------------------------------------------------

SYSTEM_PROMPT = " ".join(f"rule {i}: answer briefly and cite the handbook section." for i in range(200))


def _request(i: int) -> list[pb.ProcessingRequest]:
    body = json.dumps(
        {
            "model": "tiny",
            "max_tokens": 64,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"question {i}: what does section {i % 97} say?"},
            ],
        }
    ).encode()
    headers = {
        ":method": "POST",
        ":path": "/v1/chat/completions",
        ":authority": "fleet",
        "content-type": "application/json",
        "x-request-id": f"fleet-{i}",
    }
    hmap = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )
    rhead = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200"),
            base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
        ]
    )
    first = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hmap))
    # epp's own gateway config buffers the request body; the response is a header-only one here
    # (no model behind), which ends the stream as a finished response does.
    first.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.BUFFERED
    first.protocol_config.response_body_mode = processing_mode_pb2.ProcessingMode.NONE
    return [
        first,
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=rhead, end_of_stream=True)),
    ]


async def send_requests(port: int, rate: float, duration: float) -> tuple[int, int]:
    """Open-loop requests at `rate`/s for `duration` s, each one ext-proc stream; (ok, failed)."""
    ok = failed = 0
    async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)

        async def one(i: int) -> None:
            nonlocal ok, failed
            try:
                call = stub.Process()
                for msg in _request(i):  # one answer each, in BUFFERED mode
                    await call.write(msg)
                    answer = await call.read()
                    if answer is grpc.aio.EOF or answer.HasField("immediate_response"):
                        failed += 1
                        call.cancel()
                        return
                await call.done_writing()
                while await call.read() is not grpc.aio.EOF:
                    pass
                ok += 1
            except grpc.aio.AioRpcError:
                failed += 1

        loop = asyncio.get_running_loop()
        start = loop.time()
        pending: set[asyncio.Task[None]] = set()
        i = 0
        while (now := loop.time()) - start < duration:
            due = start + i / rate
            if due > now:
                await asyncio.sleep(due - now)
            task = asyncio.create_task(one(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
        if pending:
            await asyncio.wait(pending, timeout=30)
    return ok, failed


# --- one run -----------------------------------------------------------------------------------------


def measure(n_pods: int, workers: int, args: argparse.Namespace, python: str) -> dict[str, Any]:
    out: dict[str, Any] = {"epp": python, "pods": n_pods, "workers": workers}
    pods = Pods(n_pods, args.pods_per_process)
    epp: Epp | None = None
    try:
        epp = Epp(pods.listing, workers, args, args.out, python)
        epp.wait_ready()
        time.sleep(3.0)  # the first scrapes' and connections' start-up
        scrapes0 = pods.totals()["scrapes"]
        c0, t0 = epp.cpu(), time.monotonic()
        time.sleep(args.duration)
        idle = (epp.cpu() - c0) / (time.monotonic() - t0)
        # What the pods served: pods x workers (before epp.workers.shared_metrics: each worker
        # scraped) / interval when they keep up; less means the pods' processes were the limit.
        out["scrapes_per_s"] = (pods.totals()["scrapes"] - scrapes0) / (time.monotonic() - t0)
        out["idle_core"] = idle
        out["idle_core_per_pod"] = idle / n_pods
        out["pss_idle"] = epp.pss()
        if args.request_rate > 0:
            c0, t0 = epp.cpu(), time.monotonic()
            ok, failed = asyncio.run(send_requests(epp.grpc_port, args.request_rate, args.duration))
            spent = epp.cpu() - c0 - idle * (time.monotonic() - t0)
            out["requests"] = {"rate": args.request_rate, "ok": ok, "failed": failed}
            out["cpu_ms_per_request"] = 1e3 * spent / max(1, ok)
        stages = []
        for rate in args.kv_rates:
            before = pods.totals()
            applied0 = epp.metric("epp_kv_events_batches_total")
            c0, t0 = epp.cpu(), time.monotonic()
            pods.set_rate(rate)
            time.sleep(args.duration)
            pods.set_rate(0)
            stopped = time.monotonic()
            after = pods.totals()
            sent = after["batches"] - before["batches"]
            dropped = after["dropped"] - before["dropped"]
            catch_up = None
            while time.monotonic() - stopped < 60:
                if epp.metric("epp_kv_events_batches_total") - applied0 >= sent - dropped:
                    catch_up = time.monotonic() - stopped
                    break
                time.sleep(0.02)
            elapsed = time.monotonic() - t0
            blocks = after["blocks"] - before["blocks"]
            spent = epp.cpu() - c0 - idle * elapsed
            stages.append(
                {
                    "rate": rate,
                    "blocks": blocks,
                    "batches": sent,
                    "dropped": dropped,
                    "catch_up_s": catch_up,
                    "sustained": catch_up is not None and catch_up <= CATCH_UP_OK_S and not dropped,
                    "core": spent / (stopped - t0),
                    "cpu_ms_per_1k_blocks": 1e6 * spent / max(1, blocks),
                }
            )
        out["kv"] = stages
        if stages:
            entries = epp.metric("epp_kv_index_entries")
            out["index_entries"] = entries
            out["pss_indexed"] = epp.pss()
            if entries:
                out["bytes_per_indexed_block"] = (out["pss_indexed"] - out["pss_idle"]) / entries
    finally:
        if epp is not None:
            epp.stop()
        pods.stop()
    return out


def table(results: Sequence[dict[str, Any]]) -> str:
    rows = [
        "| epp | pods | workers | scrapes/s | idle (% core) | idle per pod (% core) | CPU/request (ms) |"
        " PSS idle (MB) |"
        " KV: rate -> core, ms/1k blocks, catch-up | bytes per indexed block |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        kv = "; ".join(
            f"{s['rate'] / 1e3:g}k/s -> {s['core']:.2f}, {s['cpu_ms_per_1k_blocks']:.1f}, "
            + (f"{s['catch_up_s'] * 1e3:.0f} ms" if s["catch_up_s"] is not None else "no")
            + ("" if not s["dropped"] else f" ({s['dropped']} dropped)")
            for s in r.get("kv", [])
        )
        per_block = r.get("bytes_per_indexed_block")
        cells = [
            r.get("epp", sys.executable),
            str(r["pods"]),
            str(r["workers"]),
            f"{r.get('scrapes_per_s', float('nan')):.0f}",
            f"{100 * r['idle_core']:.1f}",
            f"{100 * r['idle_core_per_pod']:.3f}",
            f"{r.get('cpu_ms_per_request', float('nan')):.2f}",
            f"{r['pss_idle'] / 1e6:.0f}",
            kv,
            "-" if per_block is None else f"{per_block:.0f}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def args_pythons(results: Sequence[dict[str, Any]]) -> set[str]:
    return {r.get("epp", "") for r in results}


def plot(results: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    several = len(args_pythons(results)) > 1  # then each line says which build it is
    for key, label, scale, name in (
        ("idle_core", "idle CPU (% of a core)", 100.0, "fleet-cpu.png"),
        ("pss_idle", "memory, PSS (MB)", 1e-6, "fleet-memory.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for python, workers in sorted({(r.get("epp", ""), r["workers"]) for r in results}):
            rows = sorted(
                (r for r in results if r["workers"] == workers and r.get("epp", "") == python),
                key=lambda r: r["pods"],
            )
            ax.plot(
                [r["pods"] for r in rows],
                [r[key] * scale for r in rows],
                marker="o",
                label=f"{python}, --workers {workers}" if several else f"--workers {workers}",
            )
        ax.set_xscale("log")
        ax.set_xlabel("model pods")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    runs = itertools.product(args.epp_python or [sys.executable], args.workers, args.pods)
    for python, workers, n_pods in runs:
        print(f"fleet: {python}: {n_pods} pods, --workers {workers} ...", flush=True)
        result = measure(n_pods, workers, args, python)
        print(json.dumps(result), flush=True)
        results.append(result)
        (args.out / "fleet.json").write_text(json.dumps(results, indent=2))
    text = table(results)
    (args.out / "fleet.md").write_text(text)
    print(text)
    for path in plot(results, args.out):
        print(f"wrote {path}")
    return 0
