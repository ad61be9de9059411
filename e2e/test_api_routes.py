"""The routes llm-d Router v0.10 parses by default, end to end through a real Envoy to simulated
vLLM pods: Anthropic's Messages (served, streamed, refused before routing in the shape vLLM uses),
vLLM's /inference/v1/generate, a /render route, an unknown path passed through unparsed; a
configured `requestHandler.parsers` list; and a token-producer that renders at the pods."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import pytest

from e2e.harness import Stack, eventually, parse_prometheus, request, wait_routable
from epp.gateway.processes import HOST

pytestmark = pytest.mark.e2e

StackFactory = Callable[..., Stack]
MODEL = "sim-model"
MSG = {
    "model": MODEL,
    "max_tokens": 3,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "Hi there"}],
}


async def test_default_parsers_route_every_api(stacks: StackFactory, session: aiohttp.ClientSession) -> None:
    stack = stacks()
    await wait_routable(session, stack.url)
    reply = await request(session, "POST", stack.url + "/v1/messages", body=MSG)
    assert reply.status == 200, reply.text
    answer = reply.json()
    assert answer["type"] == "message" and answer["usage"]["output_tokens"] == 3
    assert reply.headers["x-sim-received-destination"] == reply.headers["x-sim-server"]
    streamed = await request(session, "POST", stack.url + "/v1/messages", body={**MSG, "stream": True})
    assert streamed.status == 200 and b"event: message_stop" in streamed.body
    generate = {
        "model": MODEL,
        "token_ids": [5, 6, 7],
        "sampling_params": {"max_tokens": 2},
        "return_token_ids": True,
    }
    reply = await request(session, "POST", stack.url + "/inference/v1/generate", body=generate)
    assert reply.status == 200 and reply.json()["prompt_token_ids"] == [5, 6, 7]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi there"}]}
    reply = await request(session, "POST", stack.url + "/v1/chat/completions/render", body=chat)
    assert reply.status == 200 and reply.json()["token_ids"]
    # a path no parser claims goes through unparsed (here to a pod that has no such route)
    reply = await request(session, "POST", stack.url + "/v2/experimental", data=b"\x00not json")
    assert reply.status == 404 and "x-sim-server" in reply.headers


async def test_refusals_come_before_routing_in_vllms_shape(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stacks()
    await wait_routable(session, stack.url)
    # the request model's refusal: OpenAI's shape (FastAPI's handler in vLLM)
    reply = await request(session, "POST", stack.url + "/v1/messages", body={**MSG, "max_tokens": 0})
    assert reply.status == 400 and "x-sim-server" not in reply.headers and "error" in reply.json()
    # a later one (the template has nothing to render): Anthropic's
    reply = await request(
        session, "POST", stack.url + "/v1/messages", body={"model": MODEL, "max_tokens": 1, "messages": []}
    )
    assert reply.status == 400 and "x-sim-server" not in reply.headers
    assert reply.json()["type"] == "error"


async def test_a_configured_parser_list_is_used_as_given(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    config = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: queue-scorer}
- {name: oa, type: openai-parser}
requestHandler:
  parsers:
  - pluginRef: oa
"""
    stack = stacks(epp_args=["--config-text", config])
    await wait_routable(session, stack.url)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    assert (await request(session, "POST", stack.url + "/v1/chat/completions", body=chat)).status == 200
    reply = await request(session, "POST", stack.url + "/v1/messages", body=MSG)
    assert reply.status == 400 and "no parser registered" in reply.text


async def test_a_token_producer_without_a_path_renders_at_the_pods(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    config = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: {modelName: sim-model}
- {type: prefix-cache-scorer}
- {type: queue-scorer}
"""
    stack = stacks(epp_args=["--config-text", config])
    await wait_routable(session, stack.url)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there, pods"}], "max_tokens": 1}
    debug = f"http://{HOST}:{stack.epp.metrics_port}/debug/tokenize?path=/v1/chat/completions"
    async with session.post(debug, json=chat) as resp:
        mine = await resp.json()
    pod = stack.endpoints[0]
    async with session.post(f"http://{pod}/tokenize", json=chat) as resp:
        theirs = await resp.json()
    assert mine["token_ids"] == theirs["tokens"] and mine["scored"]
    assert (await request(session, "POST", stack.url + "/v1/chat/completions", body=chat)).status == 200

    def rendered() -> bool:
        found = parse_prometheus(stack.epp.metrics_text(), "epp_tokenizer_render_total")
        return any("rendered" in key and value > 0 for key, value in found.items())

    await eventually(rendered, what="epp_tokenizer_render_total{outcome=rendered} > 0")
