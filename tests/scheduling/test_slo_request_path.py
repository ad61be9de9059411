"""Latency targets through the real request path: the x-slo-* headers of an ext-proc stream reach
request-latency-scorer and change the pick, a bad value is a 400 before anything is booked, and
/debug/score names the target that drove the choice."""

from __future__ import annotations

import json
from collections.abc import Iterator

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from epp import clock as epp_clock
from epp.extproc import messages as m
from epp.extproc.stream import Stream
from epp.requestcontrol.director import Director
from epp.rpc import http as rpc_http
from tests.extproc import helpers as h
from tests.rpc.test_explain import precise_director

from .fleet import Clock, feed, toks

SCORER = "request-latency-scorer"
PROMPT = toks(2000, start=1)
COLD, HOLDER = "10.0.0.1:8000", "10.0.0.2:8000"


@pytest.fixture
def clock() -> Iterator[Clock]:
    c = Clock()
    with epp_clock.use(c):
        yield c


def completion(tokens: list[int]) -> bytes:
    return msgspec.json.encode({"model": "m", "prompt": tokens, "max_tokens": 1})


async def director_with_a_queued_holder() -> Director:
    """epp's default with KV events over two pods: pod-1 holds PROMPT but has 0.25 s of prefill
    queued (a 2,500-token request routed there), pod-0 is idle and cold. The objective prefers
    the hit (TTFT ~0.26 s) to the cold prefill (TTFT 0.21 s) and its miss penalty."""
    director, _, index = precise_director(pods=2)
    await director.route(
        path="/v1/completions", headers={}, body=completion(toks(2500, start=900_000)), subset=[HOLDER]
    )
    feed(index, "pod-1", PROMPT)
    return director


async def routed(director: Director, **headers: str) -> str:
    s = Stream(director)
    assert await s.handle(h.headers_msg(h.post_headers("/v1/completions", **headers))) == []
    out = list(await s.handle(h.body_msg(completion(PROMPT))))
    dest = h.set_headers(out[0])[m.DESTINATION_HEADER]
    s.close()
    return dest


@pytest.mark.parametrize(
    ("headers", "pick"),
    [
        ({}, HOLDER),
        ({"x-slo-ttft-ms": "230"}, COLD),
        ({"x-slo-ttft-ms": "0"}, HOLDER),  # 0: no target
        ({"x-slo-ttft-ms": "2000", "x-slo-tpot-ms": "500"}, HOLDER),  # met by both: the objective's
    ],
)
async def test_the_ttft_target_header_reaches_the_scorer_and_moves_the_pick(
    clock: Clock, headers: dict[str, str], pick: str
) -> None:
    director = await director_with_a_queued_holder()  # each pick books (and caches) the prompt
    assert await routed(director, **headers) == pick


async def test_a_bad_target_is_a_400_and_books_nothing(clock: Clock) -> None:
    director = await director_with_a_queued_holder()
    before = {ep.name: ep.inflight_requests for ep in director.datastore.endpoints()}
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers("/v1/completions", **{"x-slo-tpot-ms": "-20"})))
    out = list(await s.handle(h.body_msg(completion(PROMPT))))
    assert len(out) == 1 and out[0].WhichOneof("response") == "immediate_response"
    ir = out[0].immediate_response
    assert ir.status.code == 400
    reason = json.loads(ir.body)["error"]["message"]
    assert "x-slo-tpot-ms" in reason and "negative" in reason
    s.close()
    assert {ep.name: ep.inflight_requests for ep in director.datastore.endpoints()} == before


async def test_debug_score_says_which_target_drove_the_pick(clock: Clock) -> None:
    director = await director_with_a_queued_holder()
    app = web.Application()
    rpc_http.add_routes(app, director)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(
            "/debug/score?path=/v1/completions", data=completion(PROMPT), headers={"X-SLO-TTFT-MS": "230"}
        )
        assert resp.status == 200
        payload = await resp.json()
        bad = await client.post(
            "/debug/score?path=/v1/completions", data=completion(PROMPT), headers={"x-slo-ttft-ms": "soon"}
        )
        assert bad.status == 400
        assert "x-slo-ttft-ms" in (await bad.json())["error"]["message"]
    assert payload["pick"] == COLD
    slo = payload["request_terms"][SCORER]["slo"]
    assert slo["ttft_target_s"] == 0.23
    assert slo["driven_by"] == "ttft" and slo["preferred"] == "pod-0" and slo["objective_best"] == "pod-1"
    rows = {row["name"]: row["terms"][SCORER]["slo"] for row in payload["endpoints"]}
    assert rows["pod-0"]["ttft_met"] is True and rows["pod-1"]["ttft_met"] is False
    assert rows["pod-1"]["ttft_predicted_s"] > 0.23 > rows["pod-0"]["ttft_predicted_s"]
