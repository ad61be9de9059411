"""Record a real vLLM 0.32's /metrics page after some traffic, for `epp bench fleet`'s simulated
pods (epp/bench/data/vllm-0.32-metrics.txt). Starts one CPU vLLM (e2e/vllm/fleet.py's way),
sends `--requests` completions of a few hundred tokens (so the histograms have counts), then
saves the page as served and reports whether the server honours prometheus_client's `name[]`
filter (a scraper could then ask for the few series it reads).

    bash scripts/vllm-env                               # the vLLM venv and the e2e model, once
    PYTHONPATH=. .venv/bin/python scripts/capture_vllm_metrics.py    # ~1-2 min

Stops the server on the way out, errors included.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from e2e.vllm.fleet import VllmServer
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
            filtered = get(f"{server.url}/metrics?name[]=vllm:num_requests_waiting")
        finally:
            server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(page)
    lines = page.count(b"\n")
    print(f"{args.out}: {len(page)} bytes, {lines} lines, {page.count(b'vllm:')} vllm: mentions")
    print(f"name[] filter honoured: {len(filtered) < len(page) // 2} ({len(filtered)} bytes filtered)")


if __name__ == "__main__":
    main()
