"""epp sidecar in front of `epp sim` pods that speak the same kv_transfer_params protocol: the
decode pod pulls the prefilled prompt (its transfer time, then no prefill of its own), and a gone
prefill pod makes the decode fail so that the sidecar prefills locally."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from epp.sidecar import protocol, proxy
from epp.sim.engine import SimConfig
from epp.sim.server import bound_address, sim_state, start_sim_server

CONFIG = SimConfig.fixed(0.0, block_size=16, kv_bytes_per_token=1000, kv_link_bytes_per_s=1e9)


@pytest.fixture
async def pods() -> AsyncIterator[tuple[web.AppRunner, web.AppRunner, str]]:
    prefill = await start_sim_server("127.0.0.1", 0, config=CONFIG)
    decode = await start_sim_server("127.0.0.1", 0, config=CONFIG)
    sidecar = web.AppRunner(
        proxy.Sidecar(
            proxy.Settings(decoder_url=f"http://{bound_address(decode)}", prefill_max_retries=0)
        ).app(),
        handler_cancellation=True,
    )
    await sidecar.setup()
    await web.TCPSite(sidecar, "127.0.0.1", 0).start()
    yield prefill, decode, f"http://127.0.0.1:{sidecar.addresses[0][1]}"
    await sidecar.cleanup()
    await decode.cleanup()
    await prefill.cleanup()


async def test_split_on_sim_pods(
    pods: tuple[web.AppRunner, web.AppRunner, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prefill, decode, url = pods
    body = {"model": "sim-model", "prompt": list(range(1, 201)), "max_tokens": 4}
    headers = {protocol.PREFILL_HEADER: bound_address(prefill)}
    async with aiohttp.ClientSession() as client:
        async with client.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers[protocol.PREFILL_RESULT_HEADER] == bound_address(prefill)
            answer = await resp.json()
        assert answer["usage"]["completion_tokens"] == 4
        # The prefill pod computed the prompt; the decode pod only its last token.
        assert sim_state(prefill).engine.prompt_tokens_total == 200
        assert sim_state(decode).engine.prompt_tokens_total == 1
        # The decode pod's cache now holds the prompt: the same request there is a local hit.
        async with client.post(f"{url}/v1/completions", json=body) as resp:
            assert (await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 192
        assert sim_state(decode).engine.prompt_tokens_total == 1 + 8
        # The prefill pod loses the KV after answering (as if it died): the decode's pull fails
        # with a 500 before any output, and the sidecar prefills on the decode pod.
        monkeypatch.setattr(sim_state(prefill), "keep_for_decode", lambda rid, ids: None)
        body["prompt"] = list(range(500, 700))
        async with client.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
            assert resp.status == 200 and resp.headers[protocol.PREFILL_RESULT_HEADER] == "local"
        assert sim_state(decode).engine.prompt_tokens_total == 1 + 8 + 200
