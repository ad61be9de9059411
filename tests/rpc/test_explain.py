"""epp's own API: Explain and ListEndpoints over real gRPC, and the HTTP JSON twin."""

from __future__ import annotations

from typing import Any

import grpc
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from google.protobuf import json_format

from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.requestcontrol.director import Director
from epp.rpc import explain as rpc_explain
from epp.rpc import http as rpc_http
from epp.rpc import service
from epp.rpc.v1 import endpoint_picker_pb2 as pb
from epp.rpc.v1 import endpoint_picker_pb2_grpc as pb_grpc
from epp.scheduling import config as sched_config
from epp.scheduling import framework, interfaces, producers, registry
from epp.scheduling.interfaces import Handle
from tests.extproc import helpers as h
from tests.extproc.test_server import free_port
from tests.scheduling import builders
from tests.scheduling.test_predicted_ttft_scorer import feed
from tests.scheduling.test_registry import REQUIRED

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
            # Each scorer's own terms arrive over gRPC too (Struct numbers are doubles).
            assert dict(best.terms["queue-scorer"]) == {"waiting": 0.0}
            assert dict(res.endpoints[-1].terms["queue-scorer"]) == {"waiting": 5.0}
            assert res.request_terms["prefix-cache-scorer"]["request_blocks"] > 0
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


# --- each scorer's own terms -----------------------------------------------------------------

PROMPT = list(range(320))  # 20 blocks of 16
TTFT_TERMS = {
    "predicted_ttft_s",
    "objective_s",
    "overhead_s",
    "queue_s",
    "queue_tokens",
    "uncached_tokens",
    "prefill_tokens_per_second",
    "prefill_s",
    "decodes",
    "decode_slowdown",
    "kv_wait_s",
    "kv_price_s",
    "incoming_kv_tokens",
    "miss_penalty_s",
}


def precise_director(pods: int = 3) -> tuple[Director, Datastore, BlockIndex]:
    """A Director on epp's default with KV events (precise prefix scorer + request-latency-scorer)
    over `pods` endpoints pod-0, pod-1, ..."""
    ds = Datastore()
    ds.sync(
        "test", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(pods)]
    )
    index = BlockIndex()
    cfg = sched_config.load_config(None, Handle(datastore=ds, kv_index=index))
    director = Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        pre_request=cfg.pre_request,
        response_complete=cfg.response_complete,
    )
    return director, ds, index


def completion(tokens: list[int]) -> bytes:
    return msgspec.json.encode({"model": "m", "prompt": tokens, "max_tokens": 1})


DEFAULT_SCORER = "request-latency-scorer"
LATENCY_TERMS = {
    "ttft_objective_s",
    "admission_wait_s",
    "e2e_s",
    "decode_s",
    "step_s",
    "pod_step_factor",
    "output_tokens",
    "batch",
    "context_tokens",
    "slowdown_others_s",
    "prefill_stall_others_s",
}


def check_ttft_terms(row: dict[str, Any]) -> dict[str, Any]:
    """The default scorer's terms of one explained endpoint, checked to add up: the TTFT terms
    (predicted-ttft-scorer's), weighted 4 to 1, plus the decode and others' terms."""
    t: dict[str, Any] = row["terms"][DEFAULT_SCORER]
    assert set(t) == TTFT_TERMS | LATENCY_TERMS
    assert t["predicted_ttft_s"] == pytest.approx(
        t["overhead_s"] + t["queue_s"] + t["prefill_s"] + t["kv_wait_s"]
    )
    assert t["ttft_objective_s"] == pytest.approx(
        t["overhead_s"] + t["queue_s"] + t["prefill_s"] + t["kv_price_s"] + t["miss_penalty_s"]
    )
    assert t["objective_s"] == pytest.approx(
        4 * (t["ttft_objective_s"] + t["admission_wait_s"])
        + t["decode_s"]
        + t["slowdown_others_s"]
        + t["prefill_stall_others_s"]
    )
    assert t["e2e_s"] == pytest.approx(t["predicted_ttft_s"] + t["admission_wait_s"] + t["decode_s"])
    assert t["prefill_s"] == pytest.approx(
        t["uncached_tokens"] / t["prefill_tokens_per_second"] * t["decode_slowdown"]
    )
    return t


async def test_director_explain_shows_the_predicted_ttft_terms_of_the_shipped_default() -> None:
    director, ds, index = precise_director()
    feed(index, "pod-1", PROMPT)
    busy = ds.get("pod-2")
    assert busy is not None
    m = busy.metrics
    m.waiting, m.running, m.kv_usage, m.num_gpu_blocks = 3, 4, 0.95, 100
    payload = await rpc_explain.explain(director, path="/v1/completions", headers={}, body=completion(PROMPT))
    assert payload["pick"] == "10.0.0.2:8000"  # pod-1 holds the prompt
    rows = {row["name"]: row for row in payload["endpoints"]}
    held, cold, busy_row = (check_ttft_terms(rows[n]) for n in ("pod-1", "pod-0", "pod-2"))
    assert held["uncached_tokens"] == 16 and cold["uncached_tokens"] == 320  # vLLM recomputes a block
    assert held["predicted_ttft_s"] < cold["predicted_ttft_s"] < busy_row["predicted_ttft_s"]
    assert busy_row["decodes"] == 4 and busy_row["kv_price_s"] > 0.0 and busy_row["kv_wait_s"] > 0.0
    # The miss penalty: the factor applied (missPenalty 1, scaled by (1 holder / (share 1 x 3
    # endpoints))^2 for a prefix all the traffic so far carries) x (1 + waiting) x the prefill.
    penalty = payload["request_terms"][DEFAULT_SCORER]["miss_penalty"]
    assert penalty == pytest.approx(1 / 9)
    assert busy_row["miss_penalty_s"] == pytest.approx(penalty * 4 * busy_row["prefill_s"])
    assert cold["miss_penalty_s"] == pytest.approx(penalty * cold["prefill_s"])
    assert rows["pod-1"]["terms"]["precise-prefix-cache-scorer"] == {
        "matched_blocks": 20,
        "tier": "gpu",
        "cached_tokens": 304,
    }
    assert rows["pod-1"]["matched_blocks"] == 20 and rows["pod-0"]["matched_blocks"] == 0
    assert rows["pod-0"]["terms"]["precise-prefix-cache-scorer"] == {
        "matched_blocks": 0,
        "tier": "",
        "cached_tokens": 0,
    }
    assert payload["request_terms"]["precise-prefix-cache-scorer"] == {
        "request_blocks": 20,
        "request_tokens": 320,
        "block_size": 16,
    }
    # The gRPC answer is the same payload parsed into ExplainResponse: the terms survive it.
    message = json_format.ParseDict(payload, pb.ExplainResponse())
    best = message.endpoints[0]
    assert best.name == "pod-1"
    assert json_format.MessageToDict(best.terms[DEFAULT_SCORER]) == pytest.approx(
        rows["pod-1"]["terms"][DEFAULT_SCORER]
    )
    assert all(ep.inflight_requests == 0 for ep in ds.endpoints())  # explain booked nothing


async def test_debug_score_over_http_shows_each_scorers_terms() -> None:
    director, ds, index = precise_director()
    feed(index, "pod-0", PROMPT)
    app = web.Application()
    rpc_http.add_routes(app, director)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/debug/score", data=completion(PROMPT))
        assert resp.status == 200
        payload = await resp.json()
    assert set(payload) == {f.name for f in pb.ExplainResponse.DESCRIPTOR.fields}
    assert payload["weights"] == {"precise-prefix-cache-scorer": 0.0, DEFAULT_SCORER: 1.0}
    for row in payload["endpoints"]:
        assert set(row) == {f.name for f in pb.EndpointExplanation.DESCRIPTOR.fields}
        check_ttft_terms(row)
    assert payload["endpoints"][0]["name"] == "pod-0"
    assert payload["endpoints"][0]["terms"]["precise-prefix-cache-scorer"]["matched_blocks"] == 20

    # The approximate default (no KV events): the load scorers show the inputs they read.
    director, ds = h.make_director()
    pod2 = ds.get("pod-2")
    assert pod2 is not None
    pod2.metrics.waiting, pod2.metrics.kv_usage = 4, 0.5
    app = web.Application()
    rpc_http.add_routes(app, director)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/debug/score", data=CHAT)
        payload = await resp.json()
    rows = {row["name"]: row for row in payload["endpoints"]}
    assert rows["pod-2"]["terms"] == {
        "queue-scorer": {"waiting": 4},
        "kv-cache-utilization-scorer": {"kv_usage": 0.5},
        "prefix-cache-scorer": {"matched_blocks": 0},
        "inflight-load-scorer": {"inflight_requests": 0},
    }
    assert rows["pod-2"]["scores"]["queue-scorer"] == 0.0 and rows["pod-0"]["scores"]["queue-scorer"] == 1.0
    assert payload["request_terms"]["prefix-cache-scorer"]["request_blocks"] > 0


def test_every_scorer_explains_what_each_candidate_was_scored_on() -> None:
    """A scorer added without an explain hook (or one that forgets a candidate) fails here."""
    handle = Handle(datastore=Datastore(), kv_index=BlockIndex())
    picker: Any = registry.default.build("max-score-picker", "max-score-picker", {}, handle)
    scorers = []
    for type_name in registry.default.types():
        plugin = registry.default.build(type_name, type_name, REQUIRED.get(type_name, {}), handle)
        if not isinstance(plugin, interfaces.Scorer) or producers.is_producer(plugin):
            continue  # a producer scores nothing of its own: its consumer explains it
        scorers.append(type_name)
        assert isinstance(plugin, interfaces.Explainer), type_name
        req = builders.request(target_model="m")
        req.token_ids = list(range(64))
        req.prompt_tokens_estimate = 64
        profile = framework.Profile("default", [], [(plugin, 1.0)], picker)
        result = profile.run({}, req, builders.pool(3), explain=True)
        own = result.facts["plugins"][type_name]
        assert set(own["endpoints"]) == {"pod-0", "pod-1", "pod-2"}, type_name
        assert all(own["endpoints"].values()), type_name
    assert len(scorers) >= 12 and "predicted-ttft-scorer" in scorers


def test_the_approximate_prefix_scorer_explains_the_blocks_its_record_matches() -> None:
    handle = Handle(datastore=Datastore(), kv_index=None)
    eps = builders.pool(2)
    handle.datastore.sync("test", [ep.spec for ep in eps])
    eps = [handle.datastore.get(ep.name) for ep in eps]  # type: ignore[misc]
    scorer: Any = registry.default.build("prefix-cache-scorer", "prefix-cache-scorer", {}, handle)
    picker: Any = registry.default.build("max-score-picker", "max-score-picker", {}, handle)
    profile = framework.Profile("default", [], [(scorer, 1.0)], picker)
    req = builders.request(target_model="m")
    req.token_ids = list(range(96))  # 6 blocks of 16
    first = profile.run({}, req, eps, explain=True)
    scorer.pre_request(req, interfaces.SchedulingResult("default", {"default": first}))  # records it
    routed = first.targets[0].name
    again = profile.run({}, req, eps, explain=True)
    own = again.facts["plugins"]["prefix-cache-scorer"]
    assert own["request"] == {"request_blocks": 6, "block_size_tokens": 16}
    assert {n: f["matched_blocks"] for n, f in own["endpoints"].items()} == {
        ep.name: 6 if ep.name == routed else 0 for ep in eps
    }
