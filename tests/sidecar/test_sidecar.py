"""epp sidecar against fake vLLMs that speak NixlConnector's kv_transfer_params protocol."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from epp.sidecar import protocol, proxy
from tests.sidecar.fake_vllm import FakeVllm


class Rig:
    def __init__(self, decode: FakeVllm, prefill: FakeVllm, url: str, client: aiohttp.ClientSession) -> None:
        self.decode, self.prefill, self.url, self.client = decode, prefill, url, client

    async def post(
        self, body: dict[str, Any], prefill: str | None = "", path: str = "/v1/completions"
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {}
        if prefill is not None:
            headers[protocol.PREFILL_HEADER] = prefill or self.prefill.hostport
        async with self.client.post(self.url + path, json=body, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()


async def _rig(**settings: Any) -> AsyncIterator[Rig]:
    decode, prefill = FakeVllm("decode"), FakeVllm("prefill")
    await decode.start()
    await prefill.start()
    sidecar = proxy.Sidecar(proxy.Settings(decoder_url=f"http://{decode.hostport}", **settings))
    runner = web.AppRunner(sidecar.app(), handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    async with aiohttp.ClientSession() as client:
        yield Rig(decode, prefill, f"http://127.0.0.1:{port}", client)
    await runner.cleanup()
    await decode.stop()
    await prefill.stop()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async for r in _rig(prefill_retry_backoff_s=0.01, prefill_timeout_s=2.0):
        yield r


BODY = {"model": "tiny", "prompt": [1, 5, 9, 13, 77], "max_tokens": 5, "temperature": 0}


async def test_split_request_matches_aggregated(rig: Rig) -> None:
    status, _, local = await rig.post(BODY, prefill=None)
    assert status == 200 and rig.decode.local_prefills == 1
    status, headers, split = await rig.post(BODY)
    assert status == 200
    assert json.loads(split)["choices"][0]["token_ids"] == json.loads(local)["choices"][0]["token_ids"]
    assert headers[protocol.PREFILL_RESULT_HEADER] == rig.prefill.hostport
    assert float(headers[protocol.PREFILL_SECONDS_HEADER]) >= 0.0
    # The prefill leg: one token, not streamed, remote decode asked for; the decode leg: the
    # client's body with the prefill pod's handles; no router header reaches either pod.
    (pre,) = rig.prefill.seen
    assert pre.body["max_tokens"] == 1 and pre.body["stream"] is False
    assert pre.body["kv_transfer_params"]["do_remote_decode"] is True
    dec = rig.decode.seen[-1]
    assert dec.body["max_tokens"] == 5 and dec.body["kv_transfer_params"]["do_remote_prefill"] is True
    assert protocol.PREFILL_HEADER not in {k.lower() for k in dec.headers}
    assert rig.decode.pulled == 1 and rig.decode.local_prefills == 1


async def test_streamed_answer_and_chat(rig: Rig) -> None:
    status, _, raw = await rig.post({**BODY, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n") and raw.count(b"data: ") == 6
    assert "stream_options" not in rig.prefill.seen[0].body
    assert rig.decode.seen[-1].body["stream_options"] == {"include_usage": True}
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 3,
        "min_tokens": 2,
    }
    status, _, _ = await rig.post(chat, path="/v1/chat/completions")
    assert status == 200
    pre = rig.prefill.seen[-1].body
    assert pre["max_completion_tokens"] == 1 and pre["min_tokens"] == 1 and pre["max_tokens"] == 1
    assert rig.decode.seen[-1].body["max_completion_tokens"] == 3


async def test_transient_prefill_failures_are_retried(rig: Rig) -> None:
    rig.prefill.fail_with = 503
    task = asyncio.create_task(rig.post(BODY))
    await rig.prefill.wait_seen(2)
    rig.prefill.fail_with = 0
    status, headers, _ = await task
    assert status == 200 and headers[protocol.PREFILL_RESULT_HEADER] == rig.prefill.hostport
    assert len(rig.prefill.seen) == 3 and rig.decode.pulled == 1


async def test_dead_prefill_pod_falls_back_to_a_local_prefill(rig: Rig) -> None:
    await rig.prefill.stop()
    status, headers, raw = await rig.post(BODY)
    assert status == 200 and headers[protocol.PREFILL_RESULT_HEADER] == "local"
    assert rig.decode.local_prefills == 1 and json.loads(raw)["choices"][0]["token_ids"]


async def test_prefill_pod_dies_between_prefill_and_kv_pull(rig: Rig) -> None:
    # The prefill answered, then its pod died: the decode leg's pull fails with a 500 before any
    # output (NixlConnector), and the local vLLM prefills instead.
    rig.prefill.die_after_prefill = True
    status, headers, _ = await rig.post({**BODY, "stream": True})
    assert status == 200 and headers[protocol.PREFILL_RESULT_HEADER] == "local"
    assert rig.decode.pulled == 0 and rig.decode.local_prefills == 1
    assert len(rig.decode.seen) == 2  # the failed pull, then the local prefill


async def test_prefill_client_error_goes_back_as_it_is(rig: Rig) -> None:
    rig.prefill.fail_with = 400
    status, _, raw = await rig.post(BODY)
    assert status == 400 and b"injected" in raw
    assert rig.decode.seen == []


async def test_fallback_error_mode_answers_502_naming_the_pod() -> None:
    async for rig in _rig(prefill_fallback="error", prefill_max_retries=1, prefill_retry_backoff_s=0.0):
        await rig.prefill.stop()
        status, _, raw = await rig.post(BODY)
        assert status == 502 and rig.prefill.hostport.encode() in raw
        assert rig.decode.seen == []


async def test_a_stalled_prefill_times_out_into_a_local_prefill() -> None:
    async for rig in _rig(prefill_timeout_s=0.3, prefill_max_retries=3):
        rig.prefill.stall = True
        status, headers, _ = await rig.post(BODY)
        assert status == 200 and headers[protocol.PREFILL_RESULT_HEADER] == "local"
        assert len(rig.prefill.seen) == 1  # a timeout is not retried: the deadline is the leg's


async def test_client_cancel_closes_the_open_leg(rig: Rig) -> None:
    rig.prefill.stall = True
    task = asyncio.create_task(rig.post(BODY))
    await rig.prefill.wait_seen(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if rig.prefill.cancelled:
            break
        await asyncio.sleep(0.01)
    assert rig.prefill.cancelled == 1 and rig.decode.seen == []


async def test_decode_stream_cut_mid_answer_reaches_the_client_cut(rig: Rig) -> None:
    rig.decode.drop_after = 2
    with pytest.raises(aiohttp.ClientPayloadError):
        await rig.post({**BODY, "stream": True})


async def test_other_paths_and_unsplit_requests_go_to_the_local_vllm(rig: Rig) -> None:
    async with rig.client.get(rig.url + "/metrics") as resp:
        assert resp.status == 200 and "fake decode" in await resp.text()
    status, headers, _ = await rig.post(BODY, prefill=None)
    assert status == 200 and protocol.PREFILL_RESULT_HEADER not in headers
    assert rig.prefill.seen == []


async def test_body_that_is_not_json_is_refused(rig: Rig) -> None:
    async with rig.client.post(
        rig.url + "/v1/completions", data=b"[1,2", headers={protocol.PREFILL_HEADER: rig.prefill.hostport}
    ) as resp:
        assert resp.status == 400


def test_protocol_helpers() -> None:
    assert protocol.prefiller(["10.0.0.1:8000,10.0.0.2:8000"]) == "10.0.0.1:8000"
    assert protocol.prefiller([" http://10.0.0.3:80 "]) == "10.0.0.3:80"
    assert protocol.prefiller([]) is None and protocol.prefiller([" , "]) is None
    with pytest.raises(protocol.ProtocolError, match="kv-transfer-config"):
        protocol.transfer_params({"choices": []})
    with pytest.raises(protocol.ProtocolError):
        protocol.transfer_params({"kv_transfer_params": {"do_remote_prefill": False}})
    body = {"prompt": [1], "max_tokens": 9}
    assert protocol.prefill_body(body)["max_tokens"] == 1 and body["max_tokens"] == 9
