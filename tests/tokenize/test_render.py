"""Token ids from the model servers' /render (epp/tokenize/render.py), against simulated vLLM pods
(their render routes are the ones e2e/vllm checks against a real vLLM): the ids, the pod rotation,
the cache, shared and batched calls, and the fallbacks (a timeout, a pod without /render)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from epp.sim.engine import SimConfig
from epp.sim.server import bound_address, sim_state, start_sim_server
from epp.tokenize import render
from epp.tokenize.render import Renderer, RenderSpec

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hello there, render me"}]}


@pytest.fixture
async def fleet() -> AsyncIterator[list[web.AppRunner]]:
    runners = [await start_sim_server("127.0.0.1", 0, config=SimConfig(time_scale=0.001)) for _ in range(2)]
    yield runners
    for r in runners:
        await r.cleanup()


@pytest.fixture
def pods(fleet: list[web.AppRunner]) -> list[str]:
    return [bound_address(r) for r in fleet]


async def _tokenize(pod: str, body: Mapping[str, Any]) -> list[int]:
    async with aiohttp.ClientSession() as http, http.post(f"http://{pod}/tokenize", json=body) as resp:
        ids: list[int] = (await resp.json())["tokens"]
        return ids


async def test_ids_come_from_the_pods_in_turn(pods: list[str], fleet: list[web.AppRunner]) -> None:
    renderer = Renderer({"": RenderSpec()}, lambda: pods)
    try:
        first = await renderer.render("m", render.CHAT, CHAT)
        assert first == await _tokenize(pods[0], CHAT)
        other = {**CHAT, "messages": [{"role": "user", "content": "another"}]}
        assert await renderer.render("m", render.CHAT, other) == await _tokenize(pods[0], other)
        assert [sim_state(r).stats.render_requests for r in fleet] == [1, 1]  # one each, in turn
        assert renderer.outcomes["rendered"] == 2
        # the same body again: from the cache, no call
        assert await renderer.render("m", render.CHAT, CHAT) == first and renderer.outcomes["cached"] == 1
        msg = {"model": "m", "max_tokens": 5, "messages": CHAT["messages"]}
        assert await renderer.render("m", render.MESSAGES, msg) == first  # Anthropic's: the same chat
    finally:
        await renderer.close()


async def test_a_url_gets_the_model_name_stamped(pods: list[str]) -> None:
    renderer = Renderer({"m": RenderSpec(url=f"http://{pods[1]}/", model_name="base")}, lambda: [])
    try:
        assert renderer.serves("m") and not renderer.serves("other")
        ids = await renderer.render("m", render.COMPLETIONS, {"model": "m", "prompt": "Hello"})
        assert ids == await _tokenize(pods[1], {"model": "base", "prompt": "Hello"})
    finally:
        await renderer.close()


async def test_concurrent_completions_are_batched_and_identical_requests_shared(pods: list[str]) -> None:
    renderer = Renderer({"": RenderSpec()}, lambda: pods[:1])
    try:
        prompts = [f"prompt number {i}" for i in range(12)]
        bodies = [{"model": "m", "prompt": p, "max_tokens": 1} for p in prompts]
        got = await asyncio.gather(*(renderer.render("m", render.COMPLETIONS, b) for b in bodies))
        for prompt, ids in zip(prompts, got, strict=True):
            assert ids == await _tokenize(pods[0], {"model": "m", "prompt": prompt})
        assert renderer.batched > 0  # some rode in another request's call
        same = await asyncio.gather(*(renderer.render("m", render.CHAT, {**CHAT, "x": 1}) for _ in range(5)))
        assert all(ids == same[0] for ids in same) and renderer.outcomes["rendered"] < 12 + 5
    finally:
        await renderer.close()


async def test_cache_is_bounded_in_ids(pods: list[str]) -> None:
    renderer = Renderer({"": RenderSpec()}, lambda: pods, cache_tokens=30)
    try:
        for i in range(10):
            await renderer.render("m", render.COMPLETIONS, {"model": "m", "prompt": f"text {i} " * 3})
        assert 0 < renderer._cached_tokens <= 30
    finally:
        await renderer.close()


async def test_refusals_timeouts_and_pods_without_render_fall_back_to_none(pods: list[str]) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"token_ids": [1]})

    async def forbidden(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "Scale-out endpoints are disabled"}}, status=403)

    app = web.Application()
    app.router.add_post(render.CHAT, slow)
    app.router.add_post(render.COMPLETIONS, forbidden)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = bound_address(runner)
    renderer = Renderer({"": RenderSpec(timeout=0.2)}, lambda: [server])
    try:
        assert await renderer.render("m", render.CHAT, CHAT) is None
        assert renderer.outcomes["timeout"] == 1
        assert await renderer.render("m", render.COMPLETIONS, {"model": "m", "prompt": "x"}) is None
        assert renderer.outcomes["refused"] == 1
        # the pod without /render is not asked again for a while: nothing else to ask
        assert await renderer.render("m", render.COMPLETIONS, {"model": "m", "prompt": "y"}) is None
        assert renderer.outcomes["unavailable"] == 1
        # vLLM's own refusal of the request (400) is the pod's to answer: no ids, no backoff
        real = Renderer({"": RenderSpec()}, lambda: pods[:1])
        assert await real.render("m", render.CHAT, {"model": "m", "messages": []}) is None
        assert real.outcomes["refused"] == 1 and await real.render("m", render.CHAT, CHAT) is not None
        await real.close()
    finally:
        await renderer.close()
        await runner.cleanup()
