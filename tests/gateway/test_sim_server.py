"""The simulated vLLM replica (epp.sim.server, epp.sim.engine), driven over HTTP with an aiohttp client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from epp.sim.engine import SimConfig, output_tokens
from epp.sim.server import (
    DESTINATION_HEADER,
    RECEIVED_DESTINATION_HEADER,
    SERVER_HEADER,
    bound_address,
    sim_state,
    start_sim_server,
)
from epp.tokenize.chat import encode_chat
from epp.tokenize.tokenizer import load_shipped

TOKENIZER = load_shipped()

FAST = SimConfig(time_scale=0.01)

Start = Callable[[SimConfig], Awaitable[str]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    runners = []

    async def _start(config: SimConfig) -> str:
        runner = await start_sim_server("127.0.0.1", 0, config=config)
        runners.append(runner)
        return f"http://{bound_address(runner)}"

    yield _start
    for r in runners:
        await r.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m-1", "messages": [{"role": "user", "content": text}], "max_tokens": 3, **extra}


def sse(text: str) -> list[str]:
    return [block[len("data: ") :] for block in text.split("\n\n") if block.startswith("data: ")]


async def metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def test_chat_completion_shape_and_headers(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(FAST)
    async with http.post(
        url + "/v1/chat/completions", json=chat("hello"), headers={DESTINATION_HEADER: "x:1"}
    ) as r:
        assert r.status == 200
        assert r.headers[SERVER_HEADER] == url.removeprefix("http://")
        assert r.headers[RECEIVED_DESTINATION_HEADER] == "x:1"
        body = await r.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "m-1"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "".join(output_tokens(3))}
    assert body["usage"]["completion_tokens"] == 3
    # The chat template's rendering, as vLLM's chat endpoint tokenizes it.
    expected = encode_chat(TOKENIZER, chat("hello"))
    assert body["usage"]["prompt_tokens"] == len(expected) > len(TOKENIZER.encode("hello"))
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    async with http.get(url + "/health") as r:
        assert r.status == 200
        assert r.headers[RECEIVED_DESTINATION_HEADER] == ""


async def test_prefix_cache_hits_on_shared_prefix(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(FAST)
    system = "You are a careful assistant. " * 40
    first = chat(system + "Question one?")
    async with http.post(url + "/v1/chat/completions", json=first) as r:
        assert (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    async with http.post(url + "/v1/chat/completions", json=chat(system + "Question two?")) as r:
        cached = (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
    a, b = encode_chat(TOKENIZER, first), encode_chat(TOKENIZER, chat(system + "Question two?"))
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert common >= 16 * 14
    assert cached == common // 16 * 16  # the shared full blocks
    async with http.post(url + "/v1/chat/completions", json=chat("Different start. " + system)) as r:
        assert (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    async with http.get(url + "/sim/stats") as r:
        stats = await r.json()
    assert stats["cache_hit_blocks"] == common // 16
    assert stats["completed"] == 3
    m = await metrics(http, url)
    assert m['vllm:prefix_cache_hits_total{model_name="sim-model"}'] == cached


async def test_token_id_prompts_and_the_last_token_rule(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(FAST)
    ids = list(range(100, 164))  # exactly 4 blocks

    async def cached(prompt: list[int] | list[list[int]]) -> tuple[int, int]:
        async with http.post(
            url + "/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 1}
        ) as r:
            usage = (await r.json())["usage"]
        return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]

    assert await cached(ids) == (64, 0)
    # vLLM computes the last prompt token, so the 4th block is never a hit for the same prompt.
    assert await cached(ids) == (64, 48)
    assert await cached([*ids, 7]) == (65, 64)
    assert await cached([[*ids[:20]], [1, 2]]) == (20, 16)  # a batch is served as its first prompt


async def test_tokenize_renders_like_the_inference_routes(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(FAST)
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }
    async with http.post(url + "/tokenize", json=body) as r:
        tok = await r.json()
    assert tok["tokens"] == encode_chat(TOKENIZER, body) and tok["count"] == len(tok["tokens"])
    assert tok["max_model_len"] == 32768
    async with http.post(url + "/v1/chat/completions", json=body | {"max_tokens": 1}) as r:
        assert (await r.json())["usage"]["prompt_tokens"] == tok["count"]
    async with http.post(
        url + "/tokenize", json={"model": "m", "prompt": "Hi", "add_special_tokens": False}
    ) as r:
        assert (await r.json())["tokens"] == TOKENIZER.encode("Hi", add_special_tokens=False)
    async with http.post(url + "/tokenize", json={"model": "m"}) as r:
        assert r.status == 400


async def test_reset_prefix_cache_route(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(SimConfig(time_scale=0.05, decode_per_token=0.05))
    prompt = {"model": "m", "prompt": list(range(1, 40)), "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=prompt) as r:
        await r.read()
    task = asyncio.create_task(http.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 100}))
    deadline = time.monotonic() + 5
    while (await (await http.get(url + "/sim/stats")).json())["running"] == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    async with http.post(url + "/reset_prefix_cache") as r:
        assert r.status == 409  # a running request holds blocks
    async with http.post(url + "/reset_prefix_cache?reset_running_requests=true") as r:
        assert r.status == 200
    # vLLM preempts the running request for it; it recomputes and still answers in full.
    resp = await task
    assert (await resp.json())["usage"]["completion_tokens"] == 100
    resp.release()
    assert (await metrics(http, url))['vllm:num_preemptions_total{model_name="sim-model"}'] == 1
    async with http.post(url + "/reset_prefix_cache") as r:
        assert r.status == 200


async def test_cached_prefill_is_faster(start: Start, http: aiohttp.ClientSession) -> None:
    # Cold 8k tokens at scale 0.2: (0.01 + 8001 * 8e-5) * 0.2 = 130 ms; warm: ~2 ms + decode.
    url = await start(SimConfig(time_scale=0.2, decode_per_token=0.0))
    prompt = "abcdefgh" * 2000

    async def timed() -> float:
        t0 = time.monotonic()
        async with http.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as r:
            await r.read()
        return time.monotonic() - t0

    cold, warm = await timed(), await timed()
    assert cold > 0.05
    assert warm < cold / 2


async def test_stream_with_usage(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(FAST)
    body = chat("hi", max_tokens=5, stream=True, stream_options={"include_usage": True})
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers[SERVER_HEADER]
        events = sse(await r.text())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "".join(
        output_tokens(5)
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m-1" for c in chunks)


async def test_completions_stream_without_usage(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(FAST)
    body = {"model": "m", "prompt": "Once", "max_tokens": 4, "stream": True}
    async with http.post(url + "/v1/completions", json=body) as r:
        events = sse(await r.text())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 5 and all("usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "".join(output_tokens(4))


async def test_responses_and_embeddings(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(FAST)
    async with http.post(
        url + "/v1/responses", json={"model": "m", "input": "hi", "max_output_tokens": 2}
    ) as r:
        body = await r.json()
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["usage"]["output_tokens"] == 2
    assert body["output"][0]["content"][0]["text"] == "".join(output_tokens(2))
    stream = {
        "model": "m",
        "input": [{"role": "user", "content": "hi"}],
        "max_output_tokens": 2,
        "stream": True,
    }
    async with http.post(url + "/v1/responses", json=stream) as r:
        text = await r.text()
    types = [json.loads(line[6:])["type"] for line in text.splitlines() if line.startswith("data: ")]
    assert types == ["response.created", "response.output_text.delta", "response.output_text.delta",
                     "response.completed"]  # fmt: skip
    async with http.post(url + "/v1/embeddings", json={"model": "m", "input": ["a", "b"]}) as r:
        emb = await r.json()
    assert emb["object"] == "list" and len(emb["data"][0]["embedding"]) == FAST.embedding_dims
    assert emb["usage"]["prompt_tokens"] == 2  # the first input, with BOS


@pytest.mark.parametrize(
    ("path", "payload", "status"),
    [
        ("/v1/chat/completions", b"{not json", 400),
        ("/v1/chat/completions", b'["a"]', 400),
        ("/v1/chat/completions", b'{"model": "m"}', 400),
        ("/v1/completions", b'{"model": "m"}', 400),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', 400),
        ("/v1/embeddings", b'{"model": "m"}', 400),
    ],
)
async def test_bad_requests(
    start: Start, http: aiohttp.ClientSession, path: str, payload: bytes, status: int
) -> None:
    url = await start(FAST)
    async with http.post(url + path, data=payload, headers={"content-type": "application/json"}) as r:
        assert r.status == status
        body = await r.json()
    # vLLM's ErrorResponse: the error nested under "error", its code the HTTP status.
    assert set(body) == {"error"}
    assert body["error"]["code"] == status and body["error"]["message"] and body["error"]["param"] is None


async def test_strict_models(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(SimConfig(time_scale=0.01, strict_models=True, lora_adapters=("sql-lora",)))
    async with http.post(url + "/v1/chat/completions", json=chat("x")) as r:
        assert r.status == 404
    async with http.post(url + "/v1/chat/completions", json=chat("x") | {"model": "sql-lora"}) as r:
        assert r.status == 200
    async with http.get(url + "/v1/models") as r:
        ids = [m["id"] for m in (await r.json())["data"]]
    assert ids == ["sim-model", "sql-lora"]


async def test_queueing_running_waiting_and_kv_usage(start: Start, http: aiohttp.ClientSession) -> None:
    # Each request decodes for ~1 s: the five are two running and three waiting for that long,
    # however late a loaded machine delivers them (read once at 50 ms, CI once saw none waiting).
    cfg = SimConfig(max_num_seqs=2, time_scale=0.5, decode_per_token=0.02, lora_adapters=("ad",))
    url = await start(cfg)

    async def one(i: int) -> None:
        body = {"model": "ad" if i == 0 else "m", "prompt": f"{i} " + "p" * 300, "max_tokens": 100}
        async with http.post(url + "/v1/completions", json=body) as r:
            await r.read()

    tasks = [asyncio.create_task(one(i)) for i in range(5)]
    running, waiting = (
        'vllm:num_requests_running{model_name="sim-model"}',
        'vllm:num_requests_waiting{model_name="sim-model"}',
    )
    deadline = asyncio.get_running_loop().time() + 5.0
    while True:
        m = await metrics(http, url)
        if (m[running], m[waiting]) == (2, 3) or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.01)
    assert (m[running], m[waiting]) == (2, 3)
    assert m['vllm:kv_cache_usage_perc{model_name="sim-model"}'] > 0
    lora = [k for k in m if k.startswith("vllm:lora_requests_info")]
    assert len(lora) == 1 and 'max_lora="4"' in lora[0]
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=20)
    m = await metrics(http, url)
    assert m['vllm:num_requests_running{model_name="sim-model"}'] == 0
    assert m['vllm:num_requests_waiting{model_name="sim-model"}'] == 0
    assert m['vllm:kv_cache_usage_perc{model_name="sim-model"}'] == 0
    assert m['vllm:request_success_total{finished_reason="length",model_name="sim-model"}'] == 5
    assert m['vllm:time_to_first_token_seconds_count{model_name="sim-model"}'] == 5
    (info,) = [k for k in m if k.startswith("vllm:cache_config_info{")]
    assert 'block_size="16"' in info and 'num_gpu_blocks="4096"' in info


async def test_lora_adapter_shows_as_running(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(SimConfig(time_scale=0.05, decode_per_token=0.04, lora_adapters=("ad",)))
    task = asyncio.create_task(
        http.post(url + "/v1/completions", json={"model": "ad", "prompt": "x", "max_tokens": 50})
    )
    await asyncio.sleep(0.03)
    m = await metrics(http, url)
    (lora,) = [k for k in m if k.startswith("vllm:lora_requests_info")]
    assert 'running_lora_adapters="ad"' in lora
    resp = await task
    await resp.read()
    resp.release()


async def test_extra_waiting_is_reported(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(SimConfig(extra_waiting=7))
    assert (await metrics(http, url))['vllm:num_requests_waiting{model_name="sim-model"}'] == 7


async def test_fault_status(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(SimConfig(fault_status=503))
    async with http.post(url + "/v1/chat/completions", json=chat("x")) as r:
        assert r.status == 503
        assert r.headers[SERVER_HEADER]
    async with http.get(url + "/metrics") as r:
        assert r.status == 200  # scraping still works
    async with http.get(url + "/sim/stats") as r:
        assert (await r.json())["faults"] == 1


async def test_fault_reset_drops_the_connection(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(SimConfig(fault_reset=True))
    with pytest.raises(aiohttp.ClientError):
        async with http.post(url + "/v1/chat/completions", json=chat("x")) as r:
            await r.read()
    async with http.get(url + "/v1/models") as r:
        assert r.status == 200


async def test_client_abort_frees_the_slot(start: Start, http: aiohttp.ClientSession) -> None:
    cfg = SimConfig(max_num_seqs=1, time_scale=0.05, decode_per_token=0.05)
    runner_url = await start(cfg)
    body = chat("x", max_tokens=1000, stream=True)
    async with http.post(runner_url + "/v1/chat/completions", json=body) as r:
        await r.content.readuntil(b"\n\n")
        r.close()
    deadline = time.monotonic() + 5
    while True:
        async with http.get(runner_url + "/sim/stats") as r:
            stats = await r.json()
        if stats["running"] == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    assert stats["running"] == 0 and stats["aborted"] == 1
    # The single slot is free again.
    async with http.post(runner_url + "/v1/chat/completions", json=chat("y")) as r:
        assert r.status == 200


async def test_fixed_latency_mode(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(SimConfig.fixed(0.05))
    t0 = time.monotonic()
    async with http.post(url + "/v1/completions", json={"prompt": "z" * 20000, "max_tokens": 50}) as r:
        await r.read()
    assert 0.05 <= time.monotonic() - t0 < 0.5


async def test_reset_and_stats_destinations(start: Start, http: aiohttp.ClientSession) -> None:
    url = await start(FAST)
    for dest in ("a:1", "a:1", ""):
        headers = {DESTINATION_HEADER: dest} if dest else {}
        async with http.get(url + "/v1/models", headers=headers) as r:
            await r.read()
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=body) as r:  # unrouted traffic: counted
        await r.read()
    async with http.get(url + "/sim/stats") as r:
        # The header-less model-card read is a router's discovery (epp's scraper), not traffic.
        assert (await r.json())["destinations"] == {"a:1": 2, "": 1}
    async with http.post(url + "/sim/reset") as r:
        assert r.status == 200
    async with http.get(url + "/sim/stats") as r:
        assert (await r.json())["requests"] == 0


async def test_named_replica() -> None:
    runner = await start_sim_server("127.0.0.1", 0, config=SimConfig(name="replica-a"))
    try:
        assert sim_state(runner).name == "replica-a"
    finally:
        await runner.cleanup()


async def test_context_length_as_vllm(start: Start, http: aiohttp.ClientSession) -> None:
    """vLLM 0.32's rules (`epp.api.context_length`, checked against a real vLLM in e2e/vllm): the
    budget is clamped to what the context leaves, a prompt of max_model_len tokens or more is
    refused, a budget above max_model_len too; truncate_prompt_tokens keeps the last tokens."""
    url = await start(SimConfig(time_scale=0.01, max_model_len=256))

    async def ask(prompt: list[int], **extra: Any) -> tuple[int, Any]:
        body = {"model": "m", "prompt": prompt, **extra}
        async with http.post(url + "/v1/completions", json=body) as r:
            answer = await r.json()
        if r.status != 200:
            return r.status, answer["error"]["message"]
        return r.status, (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"])

    ids = [100 + i % 50 for i in range(300)]
    assert await ask(ids[:250], max_tokens=100) == (200, (250, 6))  # clamped: 250 + 6 = 256
    assert await ask(ids[:255]) == (200, (255, 1))
    status, message = await ask(ids[:256], max_tokens=1)
    assert (status, message) == (400, "max_tokens must be at least 1, got 0.")
    status, message = await ask(ids[:257])
    assert status == 400 and "maximum context length is 256 tokens" in message and "at least 257" in message
    status, message = await ask(ids[:10], max_tokens=257)
    assert (status, message) == (
        400,
        "max_tokens=257 cannot be greater than max_model_len=256. Please request fewer output tokens.",
    )
    assert await ask(ids, truncate_prompt_tokens=-1, max_tokens=1) == (200, (255, 1))
    assert await ask(ids, truncate_prompt_tokens=20, max_tokens=1) == (200, (20, 1))
