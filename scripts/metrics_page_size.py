"""The size of epp's /metrics page with every client-chosen label at its cap.

Routes requests through a Director (8 endpoints, GIE's default profile) with distinct model names,
rewritten target names and fairness IDs, each answered with a streamed response carrying usage,
so every per-request family (GIE's and llm-d's) has a sample per label set; then writes the page
as Prometheus scrapes it and prints its size, per series prefix. Deterministic (no timing).

    .venv/bin/python scripts/metrics_page_size.py                 # at the caps
    .venv/bin/python scripts/metrics_page_size.py --requests 20   # a few names
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time

import msgspec
from prometheus_client import generate_latest

from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.observability import metrics
from epp.requestcontrol.director import Director, DirectorSettings
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
  - type: prefix-cache-scorer
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
      - pluginRef: kv-cache-utilization-scorer
      - pluginRef: prefix-cache-scorer
"""
USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 8}}


def sse() -> list[bytes]:
    chunk = {"id": "c1", "model": "m", "choices": [{"index": 0, "text": "x", "finish_reason": None}]}
    done = {"id": "c1", "model": "m", "choices": [], "usage": USAGE}
    return [
        f"data: {json.dumps(chunk)}\n\n".encode(),
        f"data: {json.dumps(done)}\n\n".encode(),
        b"data: [DONE]\n\n",
    ]


async def drive(requests: int, fairness_ids: int) -> None:
    ds = Datastore()
    ds.sync("page", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(8)])
    for ep in ds.endpoints():
        ep.metrics.updated_at = time.monotonic()
    cfg = sched_config.load_config(CONFIG, Handle(datastore=ds))
    director = Director(
        datastore=ds, scheduler=cfg.scheduler, settings=DirectorSettings(trust_model_rewrite_header=True)
    )
    for i in range(requests):
        headers = {
            "x-gateway-model-name-rewrite": f"target-{i}",
            "x-llm-d-inference-fairness-id": f"tenant-{i % fairness_ids}",
        }
        body = msgspec.json.encode({"model": f"model-{i}", "prompt": "hello", "stream": True})
        ctx = await director.route(path="/v1/completions", headers=headers, body=body, subset=None)
        ctx.on_response_headers({":status": "200", "content-type": "text/event-stream"}, None)
        chunks = sse()
        for part in chunks:
            ctx.on_response_body(part, False)
        ctx.on_response_body(b"", True)
        ctx.finish(complete=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="distinct model names (default 3000)")
    parser.add_argument("--fairness-ids", type=int, default=1500, help="distinct fairness IDs (default 1500)")
    args = parser.parse_args()
    asyncio.run(drive(args.requests, args.fairness_ids))
    page = generate_latest(metrics.REGISTRY)
    by_prefix: collections.Counter[str] = collections.Counter()
    for line in page.splitlines():
        name = line.split(b"{")[0].split(b" ")[0].decode()
        if line.startswith(b"#"):
            name = line.split(b" ")[2].decode()
        prefix = next(
            (p for p in ("llm_d_epp_", "inference_", "epp_", "process_") if name.startswith(p)), "other"
        )
        by_prefix[prefix] += len(line) + 1
    lines = page.count(b"\n")
    print(f"/metrics: {len(page):,} bytes, {lines:,} lines")
    for prefix, size in by_prefix.most_common():
        print(f"  {prefix:<12} {size:>12,} bytes")


if __name__ == "__main__":
    main()
