"""Running one arm of the demo: a fresh epp (for the epp arms) and Envoy over the fleet.

The replicas' configuration comes from the command line (`sim_config`); between arms the fleet's
caches and counters are reset, so every arm starts cold. The gateway and simulator modules are
imported inside the functions: `epp.cli` imports the demo package on every start of `epp serve`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from epp.demo.report import ArmResult
from epp.demo.workload import (
    BLOCK_TOKENS,
    CHARS_PER_TOKEN,
    MODEL,
    REQUEST_TIMEOUT_S,
    Workload,
    run_workload,
    wait_routable,
)

if TYPE_CHECKING:
    from epp.sim.engine import SimConfig
    from epp.sim.fleet import SimFleet

HOST = "127.0.0.1"

ARMS = ("round-robin", "epp", "epp-approx", "epp-load-only")
DEFAULT_ARMS = ("round-robin", "epp")

# epp's default profile without KV events minus the prefix-cache scorer: the same load signals,
# no cache affinity.
LOAD_ONLY_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
  - type: inflight-load-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
        weight: 2
      - pluginRef: kv-cache-utilization-scorer
        weight: 2
      - pluginRef: inflight-load-scorer
        weight: 1
      - pluginRef: max-score-picker
"""


def sim_config(args: argparse.Namespace, name: str) -> SimConfig:
    from epp.sim.engine import SimConfig

    block_chars = BLOCK_TOKENS * CHARS_PER_TOKEN
    blocks = max(1, round(args.cache_prompts * args.prompt_chars / block_chars))
    return SimConfig(
        name=name,
        served_model=MODEL,
        max_num_seqs=args.max_num_seqs,
        block_size=BLOCK_TOKENS,
        num_gpu_blocks=blocks + 1,  # vLLM's flag: one block of it is the null block, never usable
        chars_per_token=CHARS_PER_TOKEN,
        base_latency=args.base_latency_ms / 1e3,
        prefill_per_char=args.prefill_us_per_char / 1e6,
        decode_per_token=args.decode_ms_per_token / 1e3,
        time_scale=args.time_scale,
        default_max_tokens=args.output_tokens,
        # Every replica publishes vLLM KV events (the epp arm subscribes; in the other arms
        # nobody listens and the PUB socket drops them, as vLLM's does).
        kv_events=f"tcp://{HOST}:0",
    )


def endpoints_yaml(fleet: SimFleet) -> str:
    """An endpoints file naming each replica's served model and KV-event publisher (if it has one)."""
    import yaml

    entries = [
        {"address": address, "model": cfg.served_model} | ({"kvEvents": events} if events else {})
        for address, cfg, events in zip(fleet.addresses, fleet.configs, fleet.kv_endpoints, strict=True)
    ]
    return str(yaml.safe_dump({"endpoints": entries}))


def wait_subscribed(fleet: SimFleet, before: list[int], within: float = 15.0, who: str = "epp") -> None:
    """Until every replica's publisher has seen one more subscription to its topic than `before`
    (`who`'s): a PUB socket drops what it sends while nobody subscribes, and a subscriber on
    another topic gets nothing at all."""
    deadline = time.monotonic() + within
    while any(now <= was for now, was in zip(fleet.kv_subscriptions(), before, strict=True)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{who} did not subscribe to every replica's KV events in time")
        time.sleep(0.05)


def _wait_idle(fleet: SimFleet, within: float = 10.0) -> None:
    """Until no pod runs or queues a request (a cancelled stream may take a moment to unwind)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(s["running"] == 0 and s["waiting"] == 0 for s in fleet.stats()):
            return
        time.sleep(0.05)


def run_arm(
    arm: str,
    args: argparse.Namespace,
    fleet: SimFleet,
    workload: Workload,
    workdir: Path,
    logs: list[tuple[str, Path]],
) -> ArmResult:
    """Fresh epp (if the arm has one) and Envoy over `fleet`, the workload, then stop both."""
    import asyncio

    from epp.gateway.envoy import BodyMode, GatewayParams, PodsMode
    from epp.gateway.processes import EnvoyServer, EppServer, free_ports

    epp: EppServer | None = None
    envoy: EnvoyServer | None = None
    try:
        if arm != "round-robin":
            extra = ["--log-level", "warning"]
            if arm == "epp-load-only":
                extra += ["--config-text", LOAD_ONLY_CONFIG]
            if arm == "epp":  # epp's recommended setup: the replicas' KV events, its default for them
                extra += ["--kv-events", "connect"]
                endpoints_file = workdir / "endpoints-precise.yaml"
                endpoints_file.write_text(endpoints_yaml(fleet))
                subscribed = fleet.kv_subscriptions()
                epp = EppServer(workdir / f"epp-{arm}.log", endpoints_file=endpoints_file, extra_args=extra)
            else:
                epp = EppServer(workdir / f"epp-{arm}.log", endpoints=fleet.addresses, extra_args=extra)
            logs.append((f"epp ({arm})", epp.process.log_path))
            epp.start(timeout=60.0)
            if arm == "epp":
                wait_subscribed(fleet, subscribed)
        listen, admin = free_ports(2)
        if epp is None:
            params = GatewayParams(
                listen_port=listen,
                admin_port=admin,
                pods_mode=PodsMode.ROUND_ROBIN,
                pod_endpoints=tuple(fleet.addresses),
                route_timeout=REQUEST_TIMEOUT_S,
            )
        else:
            params = GatewayParams(
                listen_port=listen,
                admin_port=admin,
                epp_addresses=(epp.grpc_address,),
                body_mode=BodyMode.FULL_DUPLEX_STREAMED,
                route_timeout=REQUEST_TIMEOUT_S,
            )
        envoy = EnvoyServer(workdir, params, name=f"envoy-{arm}")
        logs.append((f"envoy ({arm})", envoy.log_path))
        envoy.start()
        base_url = f"http://{HOST}:{listen}"
        asyncio.run(wait_routable(base_url))
        # The readiness probe reached a pod: start the measured run from empty caches and counters.
        _wait_idle(fleet)
        fleet.reset()
        results, wall = asyncio.run(
            run_workload(base_url, workload, concurrency=args.concurrency, output_tokens=args.output_tokens)
        )
        _wait_idle(fleet)
        return ArmResult(arm, results, wall, pods=fleet.names, sim_stats=fleet.stats())
    finally:
        if envoy is not None:
            envoy.stop()
        if epp is not None:
            epp.stop()
