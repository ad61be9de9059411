"""epp.prewarm.sender against the simulated vLLM replica over HTTP: a pre-warm leaves the prompt's
first blocks cached for the requests that follow (with the same model and cache salt only), its
bounds hold, and a pod that fails it costs nothing but a count."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Endpoint, EndpointSpec
from epp.observability import metrics
from epp.prewarm.sender import Sender
from epp.sim.engine import SimConfig
from epp.sim.server import bound_address, start_sim_server

PROMPT = list(range(1000, 1000 + 200))  # token ids: 12 full blocks of 16, and 8 more


async def serve(**config: Any) -> AsyncIterator[Endpoint]:
    runner = await start_sim_server(
        "127.0.0.1", 0, config=SimConfig(time_scale=0.01, served_model="m-1", strict_models=True, **config)
    )
    hostport = bound_address(runner)
    host, port = hostport.rsplit(":", 1)
    yield Endpoint(spec=EndpointSpec(name="pod-a", address=host, port=int(port)), hostport=hostport)
    await runner.cleanup()


@pytest.fixture
async def pod() -> AsyncIterator[Endpoint]:
    async for ep in serve():
        yield ep


@pytest.fixture
async def keyed_pod() -> AsyncIterator[Endpoint]:
    """A pod started with an API key (vLLM's --api-key)."""
    async for ep in serve(api_keys=("secret",)):
        yield ep


def request(*, salt: str | None = None, model: str = "m-1", auth: str | None = None) -> InferenceRequest:
    headers = {"authorization": auth} if auth else {}
    req = InferenceRequest("r-1", Api.CHAT, "/v1/chat/completions", headers, model=model, target_model=model)
    req.token_ids = PROMPT
    req.cache_salt = salt
    return req


async def cached(ep: Endpoint, **extra: Any) -> int:
    """The cached prompt tokens vLLM reports for a completion of PROMPT and one token more."""
    body = {"model": "m-1", "prompt": [*PROMPT, 7], "max_tokens": 1, **extra}
    auth = {"Authorization": "Bearer secret"}  # ignored by a pod without a key
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{ep.hostport}/v1/completions", json=body, headers=auth) as resp,
    ):
        assert resp.status == 200
        usage = (await resp.json())["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"])


async def settle(sender: Sender) -> None:
    await asyncio.wait_for(sender.idle(), 10.0)
    assert not sender.running


def count(outcome: str) -> float:
    return metrics.prewarm_requests.labels(outcome)._value.get()


async def test_a_prewarm_caches_the_prompts_first_blocks(pod: Endpoint) -> None:
    assert await cached(pod) == 0
    sender = Sender()
    ok = count("ok")
    try:
        assert sender.verdict(pod) == "send"
        sender.send(pod, request(), 192)
        await settle(sender)
    finally:
        await sender.close()
    assert count("ok") == ok + 1
    assert await cached(pod) == 192


async def test_the_cache_salt_goes_with_it(pod: Endpoint) -> None:
    sender = Sender()
    try:
        sender.send(pod, request(salt="tenant-a"), 192)
        await settle(sender)
    finally:
        await sender.close()
    assert await cached(pod) == 0  # another salt (none): other blocks
    assert await cached(pod, cache_salt="tenant-a") == 192


async def test_one_at_a_time_per_pod_and_none_past_the_bound(pod: Endpoint) -> None:
    """Past its bounds a pre-warm waits (its request stays on the holder): they free up soon."""
    sender = Sender(max_inflight=1)
    other = Endpoint(spec=EndpointSpec(name="pod-b", address="127.0.0.1", port=1), hostport="127.0.0.1:1")
    skipped = count("skipped")
    try:
        sender.send(pod, request(), 192)
        assert sender.verdict(pod) == "wait"  # one already running there
        assert sender.verdict(other) == "wait"  # the bound (1) is reached
        assert count("skipped") == skipped + 2  # each one held back counted
        await settle(sender)
        assert sender.verdict(pod) == "send" and sender.verdict(other) == "send"
    finally:
        await sender.close()


def test_no_prewarms_allowed_refuses_them() -> None:
    """`max_inflight` 0 never sends one: a refusal (the request moves, as without pre-warms)."""
    pod = Endpoint(spec=EndpointSpec(name="pod-a", address="127.0.0.1", port=1), hostport="127.0.0.1:1")
    assert Sender(max_inflight=0).verdict(pod) == "refuse"


async def test_a_failed_prewarm_is_counted_and_nothing_more(unused_tcp_port: int) -> None:
    dead = Endpoint(
        spec=EndpointSpec(name="pod-dead", address="127.0.0.1", port=unused_tcp_port),
        hostport=f"127.0.0.1:{unused_tcp_port}",
    )
    failed = count("failed")
    sender = Sender(timeout=2.0)
    try:
        sender.send(dead, request(), 192)
        await settle(sender)
    finally:
        await sender.close()
    assert count("failed") == failed + 1


async def test_a_pod_that_failed_one_gets_none_for_the_backoff(pod: Endpoint, unused_tcp_port: int) -> None:
    dead = Endpoint(
        spec=EndpointSpec(name="pod-refusing", address="127.0.0.1", port=unused_tcp_port),
        hostport=f"127.0.0.1:{unused_tcp_port}",
    )
    sender = Sender(timeout=2.0, backoff=0.3)
    try:
        sender.send(dead, request(), 192)
        await settle(sender)
        assert sender.verdict(dead) == "refuse"  # none for 0.3 s: its requests move
        assert sender.verdict(pod) == "send"  # the others are not held against it
        await asyncio.sleep(0.35)
        assert sender.verdict(dead) == "send"
    finally:
        await sender.close()


async def test_a_model_the_pod_does_not_serve_fails_the_prewarm(pod: Endpoint) -> None:
    failed = count("failed")
    sender = Sender()
    try:
        sender.send(pod, request(model="no-such-model"), 192)
        await settle(sender)
    finally:
        await sender.close()
    assert count("failed") == failed + 1
    assert await cached(pod) == 0


async def test_the_clients_credentials_go_with_it(keyed_pod: Endpoint) -> None:
    """A pod that requires an API key takes the pre-warm with the key the client sent for the
    request that planned it; without one it refuses (counted, nothing cached)."""
    sender = Sender(backoff=0.0)
    ok, failed = count("ok"), count("failed")
    try:
        sender.send(keyed_pod, request(), 192)
        await settle(sender)
        assert count("failed") == failed + 1 and await cached(keyed_pod) == 0
        sender.send(keyed_pod, request(auth="Bearer secret"), 192)
        await settle(sender)
    finally:
        await sender.close()
    assert count("ok") == ok + 1
    assert await cached(keyed_pod) == 192


def test_only_http_and_https() -> None:
    with pytest.raises(ValueError, match="scheme"):
        Sender(scheme="ftp")
