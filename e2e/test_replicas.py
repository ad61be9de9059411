"""Active-active replicas: two `epp serve` processes behind one real Envoy, KV events from sims.

Envoy's ext-proc cluster lists both epps and round-robins the ext-proc streams over them, as a
gateway does with the endpoints of an epp Service. Each epp subscribes to every sim's KV-event
publisher itself (connect mode), so both hold the same block index: whichever replica gets a
request routes it to the pod that holds its prefix, though only one of them routed the request
that put it there. `epp bench --replicas N` measures the same arrangement at scale in virtual time.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from e2e.harness import EppProcess, Stack, StackOptions, parse_prometheus, request, wait_routable

pytestmark = pytest.mark.e2e

MODEL = "sim-model"
SHARED = (
    "You are the booking assistant of a small chain of climbing gyms. Quote opening hours, explain "
    "the day-pass and membership prices, and send safety questions to the staff at the desk. "
) * 12  # ~2k characters: about 35 blocks of 16 tokens
FOLLOW_UPS = 8


async def explain(session: aiohttp.ClientSession, epp: EppProcess, prompt: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{epp.metrics_port}/debug/score?path=/v1/completions"
    reply = await request(session, "POST", url, body={"model": MODEL, "prompt": prompt})
    assert reply.status == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def routed(epp: EppProcess) -> float:
    return sum(parse_prometheus(epp.metrics_text(), "inference_objective_request_total").values())


async def complete(session: aiohttp.ClientSession, stack: Stack, prompt: str) -> tuple[str, int]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    reply = await request(session, "POST", stack.url + "/v1/completions", body=body)
    assert reply.status == 200, reply.text
    return reply.received_destination, int(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_two_replicas_share_the_streams_and_route_on_the_same_blocks(
    stacks: Any, session: aiohttp.ClientSession
) -> None:
    stack: Stack = stacks(StackOptions(n_backends=3, kv_events="connect", epp_replicas=2))
    assert len(stack.epps) == 2
    await wait_routable(session, stack.url)
    before = [routed(e) for e in stack.epps]

    home, cached = await complete(session, stack, SHARED + "Question zero: when do you open on Sunday?")
    assert cached == 0

    # The pod's BlockStored events reach both replicas, the one that did not route the request too.
    probe = SHARED + "Question: is there a student discount?"
    for epp in stack.epps:
        found: dict[str, Any] = {}
        for _ in range(50):
            found = await explain(session, epp, probe)
            mine = next(r for r in found["endpoints"] if r["endpoint"] == home)
            if mine["tier"] == "gpu":
                break
            await asyncio.sleep(0.1)
        assert mine["tier"] == "gpu", (epp.process.name, json.dumps(found)[:2000])
        assert found["pick"] == home, (epp.process.name, json.dumps(found)[:2000])

    # Requests sharing the prefix, spread over both replicas by Envoy, all go to its holder.
    for i in range(FOLLOW_UPS):
        served, cached = await complete(session, stack, SHARED + f"Question {i + 1}: may I bring a friend?")
        assert served == home, i
        assert cached > 0, i

    counts = [routed(e) - b for e, b in zip(stack.epps, before, strict=True)]
    assert sum(counts) == FOLLOW_UPS + 1, counts
    assert min(counts) >= FOLLOW_UPS // 2 - 1, counts  # round robin: both served streams
    for epp in stack.epps:  # every booking released by the replica that made it
        assert sum(epp.inflight().values()) == 0, (epp.process.name, epp.inflight())
