"""An SGLang fleet end to end: simulated pods exposing SGLang's metric names (`epp sim
--metrics-engine sglang`), epp reading them through llm-d's core-metrics-extractor mapping
(`defaultEngine: sglang`), and a real Envoy in front.

One pod reports a long SGLang queue (`sglang:num_queue_reqs`); a queue-scorer configuration must
then send every request to the other, which it can only do if epp reads SGLang's names. GIE's
legacy flags naming SGLang's metrics (as GIE's chart passes them for SGLang) do the same.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import aiohttp
import pytest

from e2e.harness import E2E_SIM, Stack, eventually, parse_prometheus, request, wait_routable

pytestmark = pytest.mark.e2e

SGLANG_SIM = dataclasses.replace(E2E_SIM, metrics_engine="sglang")
BUSY = dataclasses.replace(SGLANG_SIM, extra_waiting=50)
CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: core-metrics-extractor
  parameters: {defaultEngine: sglang}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
"""
GIE_SGLANG_FLAGS = [
    "--total-queued-requests-metric=sglang:num_queue_reqs",
    "--total-running-requests-metric=sglang:num_running_reqs",
    "--kv-cache-usage-percentage-metric=sglang:token_usage",
    "--cache-info-metric=sglang:cache_config_info",
    "--config-text",
    CONFIG.replace("- type: core-metrics-extractor\n  parameters: {defaultEngine: sglang}\n", ""),
]


async def _routes_around_the_busy_pod(stack: Stack, session: aiohttp.ClientSession) -> None:
    busy, idle = stack.sims.addresses
    body = {"model": "sim-model", "prompt": "Once upon a time", "max_tokens": 2}

    def scraped() -> bool:  # epp has read the busy pod's SGLang queue
        queues = parse_prometheus(stack.epp.metrics_text(), "inference_pool_per_pod_queue_size")
        return any(busy in labels and value == 50.0 for labels, value in queues.items())

    await eventually(scraped, what="the busy pod's SGLang queue read by epp")
    await wait_routable(session, stack.url)
    served: Counter[str] = Counter()
    for _ in range(8):
        reply = await request(session, "POST", f"{stack.url}/v1/completions", body=body)
        assert reply.status == 200, reply.text[:300]
        served[reply.served_by] += 1
    assert served == {idle: 8}, served


async def test_an_sglang_fleet_is_routed_on_sglangs_metric_names(
    stacks: Callable[..., Stack], session: aiohttp.ClientSession
) -> None:
    stack = stacks(sim_configs=[BUSY, SGLANG_SIM], epp_args=["--config-text", CONFIG])
    await _routes_around_the_busy_pod(stack, session)


async def test_gies_legacy_metric_flags_name_sglangs_metrics(
    stacks: Callable[..., Stack], session: aiohttp.ClientSession
) -> None:
    stack = stacks(sim_configs=[BUSY, SGLANG_SIM], epp_args=GIE_SGLANG_FLAGS)
    await _routes_around_the_busy_pod(stack, session)
