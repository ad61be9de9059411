"""Record a real vLLM 0.32's /metrics page after some traffic, for `epp bench fleet`'s simulated
pods (epp/bench/data/vllm-0.32-metrics.txt). Starts one CPU vLLM (e2e/vllm/fleet.py's way),
sends `--requests` completions of a few hundred tokens (so the histograms have counts), then
saves the page as served, then reports, for `/metrics` and for `/metrics/` (where vLLM mounts
prometheus_client's own app), whether prometheus_client's `name[]` filter is honoured with the
series epp's scraper asks for: each form's size and the median wall time of 50 GETs. Then what a
scrape costs on either side, the whole page against the filtered one (epp.datastore.scraper),
`--rounds` alternated rounds of `--scrapes` each: the CPU of the vLLM API server's process
(/proc/PID/stat) and of this process making the scraper's GET (`httpget`) and parse (`promtext`),
the page parsed every time (as a busy pod's; an idle pod's unchanged page is not parsed again).

    bash scripts/vllm-env                               # the vLLM venv and the e2e model, once
    PYTHONPATH=. .venv/bin/python scripts/capture_vllm_metrics.py    # ~1-2 min

Stops the server on the way out, errors included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from e2e.vllm.fleet import VllmServer
from epp.datastore import httpget, promtext, scraper
from epp.datastore.engines import VLLM
from epp.datastore.scraper import filtered_path
from epp.gateway.processes import free_ports

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "epp" / "bench" / "data" / "vllm-0.32-metrics.txt"


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return bytes(resp.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=400, help="scrapes per form and round")
    args = parser.parse_args()
    venv = ROOT / ".venv-vllm"
    model = next(venv.glob("e2e-model-*"))
    with tempfile.TemporaryDirectory() as tmp:
        server = VllmServer(
            name="capture",
            python=venv / "bin" / "python",
            model_dir=model / "model" if (model / "model").is_dir() else model,
            served_names=["tiny"],
            port=free_ports(1)[0],
            kv_events={"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:0"},
            workdir=Path(tmp),
            num_blocks=256,
        )
        server.start()
        try:
            server.wait_healthy(time.monotonic() + 600)
            for i in range(args.requests):
                body = json.dumps(
                    {"model": "tiny", "prompt": f"request {i} " * (20 + 13 * i), "max_tokens": 16 + i}
                ).encode()
                req = urllib.request.Request(
                    f"{server.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
                )
                get_resp = urllib.request.urlopen(req, timeout=120)
                get_resp.read()
                get_resp.close()
            page = get(f"{server.url}/metrics")
            query = (filtered_path("/metrics", VLLM) or "?").split("?", 1)[1]
            forms = {}
            for path in ("/metrics", f"/metrics?{query}", f"/metrics/?{query}"):
                times = []
                for _ in range(50):
                    started = time.perf_counter()
                    body = get(f"{server.url}{path}")
                    times.append(time.perf_counter() - started)
                forms[path.split("?")[0] + ("?name[]=..." if "?" in path else "")] = (
                    len(body),
                    statistics.median(times),
                )
            costs = asyncio.run(
                scrape_costs(server, ["/metrics", f"/metrics/?{query}"], args.rounds, args.scrapes)
            )
        finally:
            server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(page)
    lines = page.count(b"\n")
    print(f"{args.out}: {len(page)} bytes, {lines} lines, {page.count(b'vllm:')} vllm: mentions")
    for form, (size, wall) in forms.items():
        print(f"GET {form}: {size} bytes, median {wall * 1e3:.1f} ms")
    for path, rounds in costs.items():
        server_ms = ", ".join(f"{s * 1e3:.2f}" for s, _ in rounds)
        epp_us = ", ".join(f"{e * 1e6:.0f}" for _, e in rounds)
        print(f"scrape of {path[:20]}: vLLM API server {server_ms} ms CPU; epp {epp_us} us CPU (per round)")


def process_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def scrape_costs(
    server: VllmServer, paths: list[str], rounds: int, scrapes: int
) -> dict[str, list[tuple[float, float]]]:
    """Per path and round: (server CPU, this process's CPU) per scrape."""
    assert server.proc is not None
    http = httpget.HttpGetter(timeout=10.0, headers=scraper._HEADERS)
    host, port = server.address.rsplit(":", 1)
    out: dict[str, list[tuple[float, float]]] = {p: [] for p in paths}
    try:
        for _ in range(rounds):
            for path in paths:
                for _ in range(20):  # the connection open and warm
                    await http.get(host, int(port), path, scraper.MAX_BODY_BYTES)
                server_before, before = process_cpu(server.proc.pid), time.process_time()
                for _ in range(scrapes):
                    status, body = await http.get(host, int(port), path, scraper.MAX_BODY_BYTES)
                    assert status == 200
                    promtext.parse(body)
                ours, theirs = time.process_time() - before, process_cpu(server.proc.pid) - server_before
                out[path].append((theirs / scrapes, ours / scrapes))
    finally:
        http.close()
    return out


if __name__ == "__main__":
    main()
