"""epp's own API: Explain and ListEndpoints over real gRPC, and the HTTP JSON twin."""

from __future__ import annotations

import grpc
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from epp.rpc import http as rpc_http
from epp.rpc import service
from epp.rpc.v1 import endpoint_picker_pb2 as pb
from epp.rpc.v1 import endpoint_picker_pb2_grpc as pb_grpc
from tests.extproc import helpers as h
from tests.extproc.test_server import free_port

CHAT = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hello " * 40}]})


async def test_grpc_explain_shows_every_candidate_and_books_nothing() -> None:
    director, ds = h.make_director()
    ds.get("pod-0").metrics.waiting = 5  # type: ignore[union-attr]
    ds.get("pod-2").metrics.waiting = 5  # type: ignore[union-attr]
    server = grpc.aio.server()
    service.add_to_server(server, director)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.EndpointPickerStub(channel)
            res = await stub.Explain(pb.ExplainRequest(path="/v1/chat/completions", body=CHAT))
            assert res.model == "m" and res.profile == "default"
            assert list(res.targets) == ["10.0.0.2:8000"]  # the only one with an empty queue
            assert res.endpoints[0].name == "pod-1"
            best = res.endpoints[0]
            assert best.scores["queue-scorer"] == 1.0 and res.weights["queue-scorer"] == 2.0
            assert best.total == pytest.approx(sum(s * res.weights[n] for n, s in best.scores.items()))
            assert res.pick == "10.0.0.2:8000" == best.endpoint
            assert res.prompt_tokens_estimate > 0
            assert all(ep.inflight_requests == 0 for ep in ds.endpoints())

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Explain(pb.ExplainRequest(path="/v1/chat/completions", body=b"{"))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

            listing = await stub.ListEndpoints(pb.ListEndpointsRequest())
            assert [e.name for e in listing.endpoints] == ["pod-0", "pod-1", "pod-2"]
            assert listing.endpoints[0].waiting == 5 and listing.endpoints[0].routable
            assert listing.endpoints[0].metrics_age_seconds == -1.0  # never scraped
    finally:
        await server.stop(0)


async def test_http_twin_answers_the_same_fields_as_json() -> None:
    director, ds = h.make_director()
    app = web.Application()
    rpc_http.add_routes(app, director)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/debug/score", data=CHAT)
        assert resp.status == 200
        payload = await resp.json()
        assert set(payload) == {f.name for f in pb.ExplainResponse.DESCRIPTOR.fields}
        assert payload["targets"][0] in {ep.hostport for ep in ds.endpoints()}
        assert len(payload["endpoints"]) == 3
        resp = await client.post("/debug/score", data=b'{"messages": []}')
        assert resp.status == 400
        assert "model" in (await resp.json())["error"]["message"]
        resp = await client.get("/debug/endpoints")
        assert len((await resp.json())["endpoints"]) == 3
