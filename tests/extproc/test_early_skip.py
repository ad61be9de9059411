"""`--response-sample-headers=sampled`: an off-sample request skips epp from its request headers
on. The request-headers answer carries the mode override (response headers SKIP, body NONE), the
booking is held until the stream ends and released once, the ratio stays exact, and the request
is never skipped where routing could need its response. Message by message against a real
director (the real Envoy: e2e/test_mode_override.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from epp import clock
from epp.datastore.endpoints import Datastore, EndpointSpec, LatencyTotals
from epp.extproc import messages as m
from epp.extproc.stream import Stream
from epp.kvcache.index import BlockIndex
from epp.observability import metrics
from epp.requestcontrol.director import Director, DirectorSettings, plugin_hooks
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from tests.extproc import helpers as h

PM = processing_mode_pb2.ProcessingMode
DATA = Path(__file__).resolve().parents[1] / "scheduling" / "data"
CHAT = msgspec.json.encode({"model": "llama", "messages": [{"role": "user", "content": "hi " * 40}]})


def director(ratio: float = 0.0, headers: str = "sampled", **settings: object) -> tuple[Director, h.Outcomes]:
    d, _ = h.make_director(
        settings=DirectorSettings(response_sample_ratio=ratio, response_sample_headers=headers, **settings)  # type: ignore[arg-type]
    )
    hook = h.Outcomes()
    d._response_complete.append(hook)  # type: ignore[arg-type]
    return d, hook


async def opened(
    d: Director, extra: dict[str, str] | None = None
) -> tuple[Stream, list[m.ProcessingResponse]]:
    """A stream past its request headers and body; the answers to the headers."""
    s = Stream(d)
    first = list(
        await s.handle(
            h.headers_msg(h.post_headers(**(extra or {})), mode=h.BUFFERED, response_mode=PM.STREAMED)
        )
    )
    await s.handle(h.body_msg(CHAT))
    assert s.ctx is not None
    return s, first


def inflight(d: Director) -> int:
    return sum(ep.inflight_requests for ep in d.datastore.endpoints())


def skips(result: str) -> float:
    return metrics.response_bodies_skipped.labels(result)._value.get()  # type: ignore[no-any-return]


async def test_the_request_headers_answer_skips_the_whole_response() -> None:
    d, hook = director(0.0)
    skipped = skips("skipped")
    s, (answer,) = await opened(d)
    assert answer.WhichOneof("response") == "request_headers" and answer.HasField("mode_override")
    mode = answer.mode_override
    assert (mode.response_header_mode, mode.response_body_mode, mode.response_trailer_mode) == (
        PM.SKIP,
        PM.NONE,
        PM.SKIP,
    )
    assert mode.request_body_mode == h.BUFFERED  # the request side as configured
    ctx = s.ctx
    assert ctx is not None and not ctx.sampled and ctx.response_skipped and ctx.headers_skipped
    assert inflight(d) == 1  # booked until Envoy ends the stream, at the end of the HTTP stream
    assert not s.abandoned
    s.close()
    s.close()
    assert inflight(d) == 0
    assert skips("skipped") == skipped + 1
    (outcome,) = hook.seen
    # No status was seen: the stream's end counts as a success, and no error is counted.
    assert outcome.status == 0 and outcome.ok and outcome.ttft_s is None
    assert outcome.endpoint is ctx.booked


async def test_headers_that_come_anyway_are_read_as_before() -> None:
    # allow_mode_override off: Envoy ignores the override and sends the response headers.
    d, hook = director(0.0)
    errors = metrics.request_errors_total.labels("llama", "llama", metrics.MODEL_SERVER_ERROR)._value.get()
    s, _ = await opened(d)
    out = await s.handle(h.response_headers_msg(503, served="10.0.0.1:8000"))
    assert out[0].HasField("mode_override")  # the body's skip, asked again at the headers
    assert s.ctx is not None and not s.ctx.headers_skipped
    s.close()
    (outcome,) = hook.seen
    assert outcome.status == 503 and not outcome.ok
    assert (
        metrics.request_errors_total.labels("llama", "llama", metrics.MODEL_SERVER_ERROR)._value.get()
        == errors + 1
    )


@pytest.mark.parametrize(("ratio", "sampled"), [(0.0, 0), (0.25, 25), (0.05, 5)])
async def test_the_ratio_stays_exact(ratio: float, sampled: int) -> None:
    d, _ = director(ratio)
    picks, early = [], 0
    for _ in range(100):
        s, first = await opened(d)
        assert s.ctx is not None
        picks.append(s.ctx.sampled)
        early += first[0].HasField("mode_override")
        s.close()
    assert sum(picks) == sampled and early == 100 - sampled
    assert picks[0] == (ratio > 0)


async def test_default_all_reads_every_responses_headers() -> None:
    d, _ = director(0.0, headers="all")
    s, first = await opened(d)
    assert first == [m.CONTINUE_REQUEST_HEADERS]
    assert s.ctx is not None and not s.ctx.headers_skipped and not s.ctx.sampled
    s.close()


async def test_never_where_routing_may_need_the_response() -> None:
    # A rewrite header honoured: the model name is written back in the body.
    d, _ = director(0.0, trust_model_rewrite_header=True)
    s, first = await opened(d, {"x-gateway-model-name-rewrite": "llama-v2"})
    assert first == [m.CONTINUE_REQUEST_HEADERS] and s.ctx is not None and s.ctx.sampled
    s.close()
    # A plugin that adds response headers.
    d, _ = director(0.0)
    d.response_header_plugins.append(object())  # type: ignore[arg-type]
    assert not d.skips_response({})
    # The GIE full-duplex config: Envoy would ignore the override.
    d, _ = director(0.0)
    s = Stream(d)
    assert await s.handle(h.headers_msg(h.post_headers(), mode=h.DUPLEX, response_mode=h.DUPLEX)) == []
    s.close()


def test_a_bad_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="response_sample_headers"):
        DirectorSettings(response_sample_headers="some")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_an_endpoint_due_for_its_floor_is_never_skipped_early() -> None:
    now = Clock()
    with clock.use(now):
        d, _ = director(0.01, response_sample_min_interval=2.0)
        # No endpoint has had a sample: each is due, so no request is skipped early.
        assert not d.skips_response({})
        for ep in d.datastore.endpoints():  # one request to each (the proxy's subset hint)
            ctx = await d.route(path="/v1/chat/completions", headers={}, body=CHAT, subset=[ep.hostport])
            assert ctx.sampled and ctx.booked is ep
            ctx.finish(complete=True)
        # Every endpoint sampled once (the floor): within the interval, requests skip early.
        assert d.skips_response({})
        now.t += 2.5  # the floors fall due again
        assert not d.skips_response({})
        # An endpoint whose page has vLLM's latency histograms needs no floor.
        histograms = LatencyTotals(1.0, 100.0, 1.0, 10.0, ttft_seconds=1.0, ttfts=10.0)
        for ep in d.datastore.endpoints():
            ep.metrics = dataclasses.replace(ep.metrics, latency=histograms)
        assert d.skips_response({})
        # One that joins has no floor yet: due at once.
        d.datastore.sync("new", [EndpointSpec(name="pod-new", address="10.0.0.99", port=8000)])
        assert not d.skips_response({})


async def test_the_precise_default_skips_early_and_a_pd_config_does_not() -> None:
    # The precise default's request-latency-scorer reads response headers only for requests
    # prefilled elsewhere (P/D): with a scheduler that never splits, they may be skipped.
    ds = Datastore()
    ds.sync("test", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(3)])
    settings = DirectorSettings(response_sample_ratio=0.0, response_sample_headers="sampled")
    precise = sched_config.load_config(None, Handle(datastore=ds, kv_index=BlockIndex()))
    assert precise.response_headers and not precise.scheduler.splits
    d = Director(datastore=ds, scheduler=precise.scheduler, settings=settings, **plugin_hooks(precise))
    assert d.skips_response({})
    pd = sched_config.load_config((DATA / "llmd-pd" / "pd-epp-config.yaml").read_text(), Handle(datastore=ds))
    assert pd.scheduler.splits
    d = Director(datastore=ds, scheduler=pd.scheduler, settings=settings, **plugin_hooks(pd))
    d.response_header_plugins.append(precise.response_headers[0])
    assert not d.skips_response({})
