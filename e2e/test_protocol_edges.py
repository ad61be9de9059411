"""End-to-end protocol edges through a real Envoy: chunked uploads, large bodies, model-name
rewrite both ways, usage accounting, and a garbage gRPC stream sent straight to epp."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable

import aiohttp
import grpc
import pytest

from e2e.harness import Stack, eventually, parse_prometheus, request, wait_routable
from epp.sim.engine import SimConfig
from epp.tokenize.tokenizer import load_shipped

pytestmark = pytest.mark.e2e

StackFactory = Callable[..., Stack]
MODEL = "sim-model"


async def test_chunked_upload_without_content_length_is_routed(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stacks()
    await wait_routable(session, stack.url)
    prompt = "chunk " * 30_000
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 2}).encode()

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 7_000):
            yield body[i : i + 7_000]
            await asyncio.sleep(0)

    headers = {"content-type": "application/json"}
    async with session.post(stack.url + "/v1/completions", data=pieces(), headers=headers) as resp:
        assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
        text = await resp.text()
        assert resp.status == 200, text
        # the sim saw the whole prompt (it tokenizes with epp's shipped tokenizer), re-sent by
        # epp in 62,000-byte chunks
        assert json.loads(text)["usage"]["prompt_tokens"] == len(load_shipped().encode(prompt))
        assert resp.headers["x-sim-received-destination"] == resp.headers["x-sim-server"]


async def test_model_rewrite_reaches_the_server_and_is_rewritten_back(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    strict = SimConfig(time_scale=0.01, strict_models=True)
    sims = [dataclasses.replace(strict, name=f"s{i}") for i in range(2)]
    body = {"model": "my-alias", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    # By default a client's rewrite header is removed by Envoy and ignored by epp.
    closed = stacks(sim_configs=sims)
    await wait_routable(session, closed.url)
    headers = {"x-gateway-model-name-rewrite": MODEL}
    reply = await request(session, "POST", closed.url + "/v1/chat/completions", body=body, headers=headers)
    assert reply.status == 404
    # Trusted: a proxy in front may set it (Envoy lets it through, epp honours it).
    stack = stacks(
        sim_configs=sims,
        client_control_headers=["x-gateway-model-name-rewrite"],
        epp_args=["--trust-model-name-rewrite-header"],
    )
    await wait_routable(session, stack.url)
    # Without the rewrite the strict server rejects the alias: proof the rewrite is what passes.
    reply = await request(session, "POST", stack.url + "/v1/chat/completions", body=body)
    assert reply.status == 404
    reply = await request(
        session,
        "POST",
        stack.url + "/v1/chat/completions",
        body=body,
        headers={"x-gateway-model-name-rewrite": MODEL},
    )
    assert reply.status == 200, reply.text
    assert reply.json()["model"] == "my-alias"
    # and in a stream, every chunk
    stream_body = {**body, "stream": True}
    reply = await request(
        session,
        "POST",
        stack.url + "/v1/chat/completions",
        body=stream_body,
        headers={"x-gateway-model-name-rewrite": MODEL},
    )
    assert reply.status == 200
    assert MODEL not in reply.text and reply.text.count('"model":"my-alias"') >= 2


async def test_usage_and_outcomes_reach_epps_metrics(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stacks()
    await wait_routable(session, stack.url)
    body = {"model": MODEL, "prompt": "count me " * 50, "max_tokens": 5}
    for _ in range(3):
        reply = await request(session, "POST", stack.url + "/v1/completions", body=body)
        assert reply.status == 200
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    reply = await request(session, "POST", stack.url + "/v1/completions", body=stream)
    assert reply.status == 200

    # epp records a request when its ext-proc stream closes, which can trail the client's last
    # byte by a moment: poll rather than read once.
    def output_tokens() -> float:
        return sum(
            parse_prometheus(stack.epp.metrics_text(), "inference_objective_output_tokens_sum").values()
        )

    await eventually(
        lambda: output_tokens() == 4 * 5, within=5.0, what="usage of 4 requests in epp's metrics"
    )
    text = stack.epp.metrics_text()
    assert sum(parse_prometheus(text, "inference_objective_request_total").values()) >= 4
    errors = parse_prometheus(text, "inference_objective_request_error_total")
    assert not any("ModelServerError" in k for k in errors)  # every request was answered 200
    picks = parse_prometheus(text, "epp_endpoint_picks_total")
    assert sum(picks.values()) >= 4
    # Envoy resets each ext-proc stream after its complete response: not an abnormal end.
    assert not any(parse_prometheus(text, "epp_extproc_stream_errors_total").values())
    assert parse_prometheus(text, "process_cpu_seconds_total")  # the standard process series


async def test_garbage_grpc_messages_do_not_hurt_epp(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stacks()
    await wait_routable(session, stack.url)
    async with grpc.aio.insecure_channel(stack.epp.grpc_address) as channel:
        call = channel.stream_stream(
            "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        for garbage in (b"\xff\xfe\x00garbage", b"\x0a\xff\xff\xff\xff\x0f"):
            stream = call()
            await stream.write(garbage)
            with pytest.raises(grpc.aio.AioRpcError):
                await stream.read()
    # still serving, nothing booked
    reply = await request(
        session, "POST", stack.url + "/v1/completions", body={"model": MODEL, "prompt": "ok"}
    )
    assert reply.status == 200
    await eventually(lambda: sum(stack.epp.inflight().values()) == 0, within=5.0, what="in-flight back to 0")
