"""Precise prefix-cache routing end to end: simulated vLLMs publish KV events over ZMQ, epp
subscribes (--kv-events connect, endpoints file with kvEvents/kvReplay), routes through a real Envoy.

The simulator tokenizes with the tokenizer epp ships and keys its cache with its own engine hashes,
so epp matching its blocks proves the whole chain: wire format, two-key index, token blocks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from e2e.harness import Stack, StackOptions, eventually, parse_prometheus, request, wait_routable

pytestmark = pytest.mark.e2e

MODEL = "sim-model"
SHARED = (
    "You are the support assistant of a company that sells garden tools. Answer politely, cite the "
    "warranty terms when relevant, never promise refunds, and keep answers under 120 words. "
) * 12  # ~2k characters: about 35 blocks of 16 tokens


async def explain(session: aiohttp.ClientSession, stack: Stack, prompt: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{stack.epp.metrics_port}/debug/score?path=/v1/completions"
    reply = await request(session, "POST", url, body={"model": MODEL, "prompt": prompt})
    assert reply.status == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def row(result: dict[str, Any], hostport: str) -> dict[str, Any]:
    return next(r for r in result["endpoints"] if r["endpoint"] == hostport)


async def complete(session: aiohttp.ClientSession, stack: Stack, prompt: str) -> tuple[str, dict[str, Any]]:
    reply = await request(
        session,
        "POST",
        stack.url + "/v1/completions",
        body={"model": MODEL, "prompt": prompt, "max_tokens": 2},
    )
    assert reply.status == 200, reply.text
    return reply.received_destination, reply.json()["usage"]


@pytest.mark.parametrize("mode", ["connect", "bind", "connect-workers"])
async def test_routes_on_blocks_the_pods_report_and_predicts_their_cached_tokens(
    stacks: Any, session: aiohttp.ClientSession, mode: str
) -> None:
    """connect: epp subscribes to each pod's publisher (endpoints file); bind: the pods connect to
    epp's socket and are told apart by their topics, kv@<ip:port>@<model>; connect-workers: with
    `--workers 2` the supervisor subscribes and the workers route on its shared index."""
    workers = ["--workers", "2"] if mode == "connect-workers" else []
    stack: Stack = stacks(StackOptions(n_backends=3, kv_events=mode.split("-")[0], epp_args=workers))
    await wait_routable(session, stack.url)
    first, usage = await complete(session, stack, SHARED + "Question one: can I return a rake?")
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0

    follow_up = SHARED + "Question two: how long is the warranty on shears?"
    found: dict[str, Any] = {}

    def events_arrived() -> bool:
        return bool(found) and row(found, first)["tier"] == "gpu"

    async def poll() -> None:
        found.clear()
        found.update(await explain(session, stack, follow_up))

    for _ in range(50):  # the pod's BlockStored reaches epp within a few ms; allow 5 s
        await poll()
        if events_arrived():
            break
        await asyncio.sleep(0.1)
    assert events_arrived(), json.dumps(found)[:2000]
    assert found["pick"] == first
    mine = row(found, first)
    assert 30 <= mine["matched_blocks"] <= found["request_blocks"]
    others = [r for r in found["endpoints"] if r["endpoint"] != first]
    assert all(r["matched_blocks"] == 0 for r in others)

    served, usage = await complete(session, stack, follow_up)
    assert served == first
    # epp's prediction is what the model server itself reports.
    assert usage["prompt_tokens_details"]["cached_tokens"] == mine["cached_tokens"] > 0
    assert usage["prompt_tokens"] == found["request_tokens"]

    metrics = stack.epp.metrics_text()
    batches = parse_prometheus(metrics, "epp_kv_events_batches_total")
    assert sum(batches.values()) >= 1, batches
    assert parse_prometheus(metrics, "epp_kv_index_entries")[""] > 0


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_reset_prefix_cache_clears_the_pods_entries(
    stacks: Any, session: aiohttp.ClientSession, workers: str
) -> None:
    stack: Stack = stacks(StackOptions(n_backends=2, kv_events="connect", epp_args=["--workers", workers]))
    await wait_routable(session, stack.url)
    prompt = SHARED + "Question: which gloves fit?"
    served, _ = await complete(session, stack, prompt)

    async def matched() -> int:
        return int(row(await explain(session, stack, prompt), served)["matched_blocks"])

    async def until(predicate: Any, what: str) -> None:
        for _ in range(60):
            if predicate(await matched()):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(what)

    await until(lambda n: n > 0, "the pod's blocks never reached the index")
    reply = await request(session, "POST", f"http://{served}/reset_prefix_cache")
    assert reply.status == 200, reply.text
    # As vLLM, the pod publishes AllBlocksCleared with its next engine step's events: run one step
    # (straight to the pod, a prompt shorter than a block: it stores nothing).
    step = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    reply = await request(session, "POST", f"http://{served}/v1/completions", body=step)
    assert reply.status == 200, reply.text
    # AllBlocksCleared drops the pod's entries; the 2 s speculative entry of the routed request
    # has expired by then at the latest.
    await until(lambda n: n == 0, "AllBlocksCleared did not clear the pod's entries")
    await eventually(
        lambda: sum(parse_prometheus(stack.epp.metrics_text(), "epp_kv_index_entries").values()) == 0,
        what="index empty",
    )
