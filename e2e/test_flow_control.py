"""Flow control through a real Envoy 1.40: a critical request overtakes a sheddable one queued
before it, both held in epp past Envoy's 5 s message timeout (the mode-override gateway, request
body BUFFERED: epp extends the timeout while it holds them).

The pool is one slow simulated pod that the concurrency detector counts full at one request in
flight (`maxConcurrency: 1`), so what holds requests is epp's own booking, not a scrape: the test
needs no timing luck on a loaded machine. A long request takes the one place; a sheddable request
and then a critical one queue behind it (a third one, whose client leaves, gives its slot back);
the long one's client leaves, which frees the place; the critical request goes first, and the
sheddable one only once the critical one has finished.

With `enableEviction` the critical request does not wait for the place: the sheddable request in
flight is cut (429 `evicted`), in GIE's full-duplex gateway and in epp's mode-override one. On
SIGTERM, a request still held when the drain ends is answered 503 `rejected-shutting-down`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from e2e.harness import E2E_SIM, Stack, StackOptions, eventually, request, wait_routable

StackFactory = Callable[..., Stack]
SLOW_SIM = E2E_SIM.__class__(time_scale=1.0)  # 20 ms per generated token
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  saturationDetector: {pluginRef: concurrency-detector}
"""
HELD_PAST = 6.0  # seconds: past Envoy's message_timeout (5 s) in the BUFFERED mode


async def routable_and_idle(session: aiohttp.ClientSession, stack: Stack) -> None:
    """The gateway routes, and the probe's own booking is released: a test that waits for "one
    request booked" must not count the probe's (GET /v1/models is routed and booked too, and its
    stream may end after the client has its answer)."""
    await wait_routable(session, stack.url)
    await eventually(lambda: sum(stack.epp.inflight().values()) == 0, within=30, what="the probe released")


def body(max_tokens: int) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": "hello there", "max_tokens": max_tokens}


def flow_state(stack: Stack) -> dict[str, Any]:
    import urllib.request

    url = f"http://127.0.0.1:{stack.epp.metrics_port}/debug/flow-control"
    with urllib.request.urlopen(url, timeout=5) as resp:
        state: dict[str, Any] = json.loads(resp.read())
    return state


def queued(stack: Stack) -> dict[int, int]:
    return {band["priority"]: band["requests"] for band in flow_state(stack)["bands"] if band["requests"]}


async def test_a_critical_request_overtakes_a_queued_sheddable_one(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stacks(
        StackOptions(
            n_backends=1,
            sim_configs=[SLOW_SIM],
            mode_override=True,
            endpoints_source="file",
            objectives={"critical": 10, "batch": -1},
            epp_args=["--config-text", CONFIG],
        )
    )
    await routable_and_idle(session, stack)
    assert flow_state(stack)["enabled"]
    url = stack.url + "/v1/completions"

    # The long request takes the pod's one place (2,000 tokens: 40 s, far longer than the test).
    long_request = asyncio.create_task(request(session, "POST", url, body=body(2000), total=120))
    await eventually(
        lambda: sum(stack.epp.inflight().values()) == 1, within=30, what="the long request booked"
    )

    finished: dict[str, float] = {}

    async def send(objective: str) -> int:
        headers = {"x-gateway-inference-objective": objective}
        reply = await request(session, "POST", url, body=body(5), headers=headers, total=120)
        finished[objective] = time.monotonic()
        return reply.status

    batch = asyncio.create_task(send("batch"))
    await eventually(lambda: queued(stack) == {-1: 1}, within=30, what="the sheddable request queued")
    critical = asyncio.create_task(send("critical"))
    await eventually(lambda: queued(stack) == {10: 1, -1: 1}, within=30, what="the critical request queued")
    # Held past Envoy's message timeout: the override epp sent keeps Envoy waiting.
    await eventually(
        lambda: all(f["oldest_wait_s"] >= HELD_PAST for b in flow_state(stack)["bands"] for f in b["flows"]),
        within=60,
        what=f"both held for {HELD_PAST} s",
    )
    assert not batch.done() and not critical.done()
    assert flow_state(stack)["dispatch_halted"] == "saturated"
    # A held request whose client leaves gives its place in the queue back at once.
    leaving = asyncio.create_task(send("batch"))
    await eventually(lambda: queued(stack) == {10: 1, -1: 2}, within=30, what="a third request queued")
    leaving.cancel()
    await eventually(lambda: queued(stack) == {10: 1, -1: 1}, within=30, what="the leaver's slot freed")

    long_request.cancel()  # its client leaves: the stream ends and the place is free
    assert await asyncio.wait_for(critical, 60) == 200
    assert await asyncio.wait_for(batch, 60) == 200
    # The critical request went first and the sheddable one only after it had finished: with one
    # place, the sheddable request's dispatch needed the critical one's release.
    assert finished["critical"] < finished["batch"]
    state = flow_state(stack)
    assert state["queued_requests"] == 0
    assert state["outcomes"]["Dispatched"] >= 3
    await eventually(
        lambda: sum(stack.epp.inflight().values()) == 0, within=30, what="every booking released"
    )


EVICTING = CONFIG.replace(
    "  saturationDetector: {pluginRef: concurrency-detector}\n",
    "  saturationDetector: {pluginRef: concurrency-detector}\n  enableEviction: true\n",
)


@pytest.mark.parametrize("mode_override", [False, True], ids=["full-duplex", "mode-override"])
async def test_eviction_cuts_an_in_flight_sheddable_request_for_a_critical_one(
    stacks: StackFactory, session: aiohttp.ClientSession, mode_override: bool
) -> None:
    stack = stacks(
        StackOptions(
            n_backends=1,
            sim_configs=[SLOW_SIM],
            mode_override=mode_override,
            endpoints_source="file",
            objectives={"critical": 10, "batch": -1},
            epp_args=["--config-text", EVICTING],
        )
    )
    await routable_and_idle(session, stack)
    url = stack.url + "/v1/completions"
    batch_headers = {"x-gateway-inference-objective": "batch"}
    # A long sheddable request (40 s of generation, not streamed) takes the pod's one place.
    batch = asyncio.create_task(
        request(session, "POST", url, body=body(2000), headers=batch_headers, total=120)
    )
    await eventually(
        lambda: sum(stack.epp.inflight().values()) == 1, within=30, what="the sheddable request booked"
    )
    critical = await request(
        session, "POST", url, body=body(5), headers={"x-gateway-inference-objective": "critical"}, total=120
    )
    assert critical.status == 200
    cut = await asyncio.wait_for(batch, 60)
    assert cut.status == 429
    assert cut.headers.get("x-llm-d-request-dropped-reason") == "evicted"
    metrics = stack.epp.metrics_text()
    assert (
        'llm_d_epp_flow_control_revocations_issued_total{inference_pool="standalone",priority="10"} 1.0'
        in metrics
    )
    await eventually(
        lambda: sum(stack.epp.inflight().values()) == 0, within=30, what="every booking released"
    )


async def test_sigterm_answers_the_requests_still_held_at_the_end_of_the_drain(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stacks(
        StackOptions(
            n_backends=1,
            sim_configs=[SLOW_SIM],
            endpoints_source="file",
            objectives={"batch": -1},
            epp_args=["--config-text", CONFIG, "--drain-delay", "0s", "--drain-timeout", "3s"],
        )
    )
    await routable_and_idle(session, stack)
    url = stack.url + "/v1/completions"
    long_request = asyncio.create_task(request(session, "POST", url, body=body(2000), total=120))
    await eventually(
        lambda: sum(stack.epp.inflight().values()) == 1, within=30, what="the long request booked"
    )
    held = asyncio.create_task(
        request(
            session, "POST", url, body=body(5), headers={"x-gateway-inference-objective": "batch"}, total=120
        )
    )
    await eventually(lambda: queued(stack) == {-1: 1}, within=30, what="the request held")
    os.kill(stack.epp.process.pid, signal.SIGTERM)
    # Held through the drain (no place freed), then answered before the streams are cut.
    reply = await asyncio.wait_for(held, 60)
    assert reply.status == 503
    assert reply.headers.get("x-llm-d-request-dropped-reason") == "rejected-shutting-down"
    long_request.cancel()
    await asyncio.gather(long_request, return_exceptions=True)


PREFILL_LIMITED = CONFIG.replace(
    "parameters: {maxConcurrency: 1}", "parameters: {maxConcurrency: 100, maxPrefillTokens: 50}"
)
# 10 ms per prompt token: a 400-token prompt's prefill takes ~4 s, then tokens come at 20 ms.
SLOW_PREFILL = E2E_SIM.__class__(time_scale=1.0, prefill_per_token=0.01)


@pytest.mark.parametrize("mode_override", [False, True], ids=["full-duplex", "mode-override"])
async def test_a_request_waits_for_the_pods_prefill_then_goes_on_its_first_byte(
    stacks: StackFactory, session: aiohttp.ClientSession, mode_override: bool
) -> None:
    """`maxPrefillTokens`: far under `maxConcurrency`, a pod still prefilling a long prompt holds
    the next request in epp; the first byte of that answer, seen through Envoy (also where epp
    could have skipped the response body), lets it go."""
    stack = stacks(
        StackOptions(
            n_backends=1,
            sim_configs=[SLOW_PREFILL],
            mode_override=mode_override,
            endpoints_source="file",
            objectives={"critical": 10},
            epp_args=["--config-text", PREFILL_LIMITED],
        )
    )
    await routable_and_idle(session, stack)
    url = stack.url + "/v1/completions"
    long_prompt = {**body(200), "prompt": "word " * 400, "stream": True}  # ~4 s prefill, 4 s of tokens
    first = asyncio.create_task(request(session, "POST", url, body=long_prompt, total=120))
    await eventually(
        lambda: sum(stack.epp.inflight().values()) == 1, within=30, what="the long prompt booked"
    )
    sent = time.monotonic()
    critical = asyncio.create_task(
        request(
            session,
            "POST",
            url,
            body=body(2),
            headers={"x-gateway-inference-objective": "critical"},
            total=120,
        )
    )
    await eventually(
        lambda: queued(stack) == {10: 1}, within=3, what="the next request held during the prefill"
    )
    assert (await asyncio.wait_for(critical, 60)).status == 200
    assert time.monotonic() - sent > 1.0  # it waited for the prefill...
    assert not first.done()  # ...not for the whole answer
    assert (await asyncio.wait_for(first, 60)).status == 200
    await eventually(
        lambda: sum(stack.epp.inflight().values()) == 0, within=30, what="every booking released"
    )
