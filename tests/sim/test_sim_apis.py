"""The simulator's routes beyond OpenAI's (epp/sim/apis.py): vLLM 0.32's render routes with the
ids /tokenize gives, /version, Anthropic's Messages and count_tokens, /inference/v1/generate, and
the KV-event topic (vLLM's empty default, llm-d's as a template)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import zmq

from epp.sim.config import LLMD_TOPIC, SimConfig
from epp.sim.server import bound_address, sim_state, start_sim_server

CHAT = {
    "model": "m",
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}],
}
MSG = {
    "model": "m",
    "max_tokens": 3,
    "system": "be brief",
    "messages": [{"role": "user", "content": "hi there"}],
}


@pytest.fixture
async def sim() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    runner = await start_sim_server("127.0.0.1", 0, config=SimConfig(time_scale=0.001))
    async with aiohttp.ClientSession() as http:
        yield f"http://{bound_address(runner)}", http
    await runner.cleanup()


async def _post(sim: tuple[str, aiohttp.ClientSession], path: str, body: Any) -> tuple[int, Any]:
    url, http = sim
    async with http.post(url + path, json=body) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


async def test_version(sim: tuple[str, aiohttp.ClientSession]) -> None:
    url, http = sim
    async with http.get(f"{url}/version") as resp:
        assert await resp.json() == {"version": "0.32.0"}


async def test_render_routes_give_the_ids_tokenize_gives(sim: tuple[str, aiohttp.ClientSession]) -> None:
    _, tokenized = await _post(sim, "/tokenize", CHAT)
    ids = tokenized["tokens"]
    status, chat = await _post(sim, "/v1/chat/completions/render", CHAT)
    assert status == 200 and chat["token_ids"] == ids and chat["model"] == "m"
    # Anthropic's system prompt becomes the same system message: the same prompt
    status, messages = await _post(sim, "/v1/messages/render", MSG)
    assert status == 200 and messages["token_ids"] == ids
    _, plain = await _post(sim, "/tokenize", {"model": "m", "prompt": "a b"})
    status, batch = await _post(sim, "/v1/completions/render", {"model": "m", "prompt": ["a b", "c"]})
    assert status == 200 and batch[0]["token_ids"] == plain["tokens"] and len(batch) == 2
    # Responses: vLLM adds the tokenizer's special tokens to the rendering (a second BOS)
    status, responses = await _post(sim, "/v1/responses/render", {"model": "m", "input": "hi there"})
    assert status == 200 and responses["token_ids"][:2] == [1, 1]


async def test_render_refuses_what_its_route_refuses(sim: tuple[str, aiohttp.ClientSession]) -> None:
    status, body = await _post(sim, "/v1/chat/completions/render", {"model": "m", "messages": []})
    assert status == 400 and "error" in body
    status, body = await _post(sim, "/v1/messages/render", {"model": "m", "messages": MSG["messages"]})
    assert status == 400 and "max_tokens" in body["error"]["message"]  # OpenAI's shape on render


async def test_messages_and_count_tokens(sim: tuple[str, aiohttp.ClientSession]) -> None:
    status, counted = await _post(
        sim, "/v1/messages/count_tokens", {"model": "m", "system": "be brief", "messages": MSG["messages"]}
    )
    _, rendered = await _post(sim, "/v1/messages/render", {**MSG})
    assert status == 200 and counted["input_tokens"] == len(rendered["token_ids"])
    status, answer = await _post(sim, "/v1/messages", MSG)
    assert status == 200 and answer["type"] == "message" and answer["stop_reason"] == "max_tokens"
    usage = answer["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == counted["input_tokens"]
    assert usage["output_tokens"] == 3
    status, again = await _post(sim, "/v1/messages", MSG)
    assert again["usage"]["cache_read_input_tokens"] > 0  # the prefix cache, as vLLM reports it
    status, streamed = await _post(sim, "/v1/messages", {**MSG, "stream": True})
    events = [line.split(": ", 1)[1] for line in streamed.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    # the request model's refusals in OpenAI's shape, the later ones in Anthropic's
    status, body = await _post(sim, "/v1/messages", {"messages": MSG["messages"], "max_tokens": 1})
    assert status == 400 and "error" in body and "type" not in body
    status, body = await _post(sim, "/v1/messages", {"model": "m", "max_tokens": 1, "messages": []})
    assert status == 400 and body["type"] == "error"


async def test_generate(sim: tuple[str, aiohttp.ClientSession]) -> None:
    body = {
        "model": "m",
        "token_ids": [5, 6, 7],
        "sampling_params": {"max_tokens": 2},
        "return_token_ids": True,
    }
    status, answer = await _post(sim, "/inference/v1/generate", body)
    assert status == 200 and answer["prompt_token_ids"] == [5, 6, 7]
    assert len(answer["choices"][0]["token_ids"]) == 2 and answer["usage"]["prompt_tokens"] == 3
    status, refused = await _post(sim, "/inference/v1/generate", {"token_ids": [], "sampling_params": {}})
    assert status == 400 and "error" in refused


@pytest.mark.parametrize(("template", "expected"), [("", b""), (LLMD_TOPIC, "kv@{address}@m")])
async def test_kv_topic(template: str, expected: Any) -> None:
    cfg = SimConfig(time_scale=0.001, served_model="m", kv_events="tcp://127.0.0.1:0", kv_topic=template)
    runner = await start_sim_server("127.0.0.1", 0, config=cfg)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        state = sim_state(runner)
        assert state.kv_endpoint is not None and state.publisher is not None
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(state.kv_endpoint)
        for _ in range(1000):  # a PUB drops what it sends before the subscription is in place
            if state.publisher.subscriptions >= 1:
                break
            await asyncio.sleep(0.005)
        async with aiohttp.ClientSession() as http:
            url = f"http://{bound_address(runner)}/v1/completions"
            async with http.post(url, json={"model": "m", "prompt": "x " * 80, "max_tokens": 1}) as resp:
                assert resp.status == 200
        assert sub.poll(5000)
        topic = sub.recv_multipart()[0]
        want = (
            expected
            if isinstance(expected, bytes)
            else expected.format(address=bound_address(runner)).encode()
        )
        assert topic == want
    finally:
        sub.close(linger=0)
        ctx.term()
        await runner.cleanup()
