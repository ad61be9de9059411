"""What flow control costs a request that does not queue: CPU per routed request with the
`flowControl` feature gate on (llm-d's defaults) and off (GIE's legacy admission), same run.

    .venv/bin/python scripts/bench_flow_control_cost.py            # CPU time, interleaved rounds
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \\
        .venv/bin/python scripts/bench_flow_control_cost.py --once on   # instructions, one arm

Each arm builds the Director `epp serve` builds from a configuration (GIE's default profile,
8 endpoints with fresh, unsaturated metrics) and routes a /v1/completions request through it,
then ends its stream (`RequestContext.finish`), `--requests` times per round. The arms alternate
round by round (`--rounds`), so a machine whose load changes affects both alike; the figure is
the median over rounds of the difference of process CPU time per request. Target: <= 20 µs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import msgspec

from epp import clock
from epp.datastore.endpoints import Datastore, EndpointSpec, ModelServerMetrics
from epp.flowcontrol import controller as flowcontrol
from epp.requestcontrol import admission
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle

PROFILE = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
{gates}
plugins:
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
  - type: prefix-cache-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - {{pluginRef: queue-scorer, weight: 2}}
      - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
      - {{pluginRef: prefix-cache-scorer, weight: 3}}
      - {{pluginRef: max-score-picker}}
"""
BODY = msgspec.json.encode({"model": "m", "prompt": "hello " * 200, "max_tokens": 16})


def director(flow: bool, pods: int) -> Director:
    datastore = Datastore()
    datastore.sync(
        "bench", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i}", port=8000) for i in range(pods)]
    )
    config = sched_config.load_config(
        PROFILE.format(gates="featureGates: [flowControl]" if flow else ""), Handle(datastore=datastore)
    )
    detector, controller, _ = flowcontrol.from_scheduler_config(config, datastore.candidates)
    assert (controller is not None) == flow
    return Director(
        datastore=datastore,
        scheduler=config.scheduler,
        pre_request=config.pre_request,
        response_complete=config.response_complete,
        admission_controller=admission.LegacyAdmissionController(detector),
        flow_control=controller,
    )


async def routes(d: Director, n: int) -> float:
    """CPU seconds per request for `n` routes, each stream ended at once."""
    now = clock.now()
    for ep in d.datastore.endpoints():  # fresh and idle: nothing queues
        ep.metrics = ModelServerMetrics(waiting=0, running=2, kv_usage=0.1, updated_at=now)
    headers = {"x-request-id": "r", "x-gateway-inference-objective": "none"}
    t0 = time.process_time()
    for _ in range(n):
        ctx = await d.route(path="/v1/completions", headers=headers, body=BODY, subset=None)
        ctx.finish(complete=True)
    return (time.process_time() - t0) / n


async def main_async(args: argparse.Namespace) -> None:
    arms = {"off": director(False, args.pods), "on": director(True, args.pods)}
    if args.once:
        per = await routes(arms[args.once], args.requests)
        print(f"{args.once}: {per * 1e6:.1f} µs CPU per request")
        return
    for d in arms.values():  # warm up: imports, caches, children of the metrics
        await routes(d, 200)
    samples: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.rounds):
        for name, d in arms.items():
            samples[name].append(await routes(d, args.requests))
    diffs = [on - off for on, off in zip(samples["on"], samples["off"], strict=True)]
    for name, values in samples.items():
        median = statistics.median(values) * 1e6
        print(f"{name:>3}: median {median:7.1f} µs CPU per request over {args.rounds} rounds")
    print(
        f"flow control, not queued: +{statistics.median(diffs) * 1e6:.1f} µs per request "
        f"(median of per-round differences; min {min(diffs) * 1e6:.1f}, max {max(diffs) * 1e6:.1f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--requests", type=int, default=2000, help="per arm and round")
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--once", choices=("on", "off"), help="one arm once (for callgrind)")
    asyncio.run(main_async(parser.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
