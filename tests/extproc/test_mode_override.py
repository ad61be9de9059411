"""Skipping the response body of off-sample requests (Envoy `allow_mode_override`), message by
message against a real director: what epp answers, what it still records, and that the booking
is released once, when the stream ends."""

from __future__ import annotations

import argparse

import msgspec
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from epp import flags
from epp.extproc import messages as m
from epp.extproc.stream import Stream
from epp.observability import metrics
from epp.requestcontrol.context import RequestContext
from epp.requestcontrol.director import Director, DirectorSettings
from tests.extproc import helpers as h

PM = processing_mode_pb2.ProcessingMode
STREAMED = PM.STREAMED
CHAT = msgspec.json.encode({"model": "llama", "messages": [{"role": "user", "content": "hi " * 40}]})
SSE = (
    b'data: {"model":"llama","choices":[{"text":"a"}],"usage":null}\n\n'
    b'data: {"model":"llama","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1,'
    b'"prompt_tokens_details":{"cached_tokens":4}}}\n\ndata: [DONE]\n\n'
)


def director(ratio: float) -> tuple[Director, h.Outcomes]:
    settings = DirectorSettings(response_sample_ratio=ratio, trust_model_rewrite_header=True)
    d, _ = h.make_director(settings=settings)
    hook = h.Outcomes()
    d._response_complete.append(hook)  # type: ignore[arg-type]
    return d, hook


async def routed(
    d: Director, *, mode: int = h.BUFFERED, response_mode: int = STREAMED, extra: dict[str, str] | None = None
) -> Stream:
    s = Stream(d)
    await s.handle(h.headers_msg(h.post_headers(**(extra or {})), mode=mode, response_mode=response_mode))
    await s.handle(h.body_msg(CHAT))
    assert s.ctx is not None
    return s


def inflight(d: Director) -> int:
    return sum(ep.inflight_requests for ep in d.datastore.endpoints())


def skips(result: str) -> float:
    return metrics.response_bodies_skipped.labels(result)._value.get()  # type: ignore[no-any-return]


def running() -> float:
    return sum(
        s.value
        for family in metrics.running_requests.collect()
        for s in family.samples
        if s.labels.get("model_name") == "llama"
    )


async def test_off_sample_response_headers_answer_stops_the_body() -> None:
    d, hook = director(0.0)
    s = await routed(d)
    before, skipped = running(), skips("skipped")
    out = await s.handle(h.response_headers_msg(200, served="10.0.0.1:8000"))
    assert len(out) == 1 and out[0].WhichOneof("response") == "response_headers"
    mode = out[0].mode_override
    assert out[0].HasField("mode_override")
    assert (mode.response_header_mode, mode.response_body_mode, mode.response_trailer_mode) == (
        PM.SEND,
        PM.NONE,
        PM.SKIP,
    )
    assert mode.request_body_mode == h.BUFFERED  # the request side as configured
    ctx = s.ctx
    assert ctx is not None and ctx.response_skipped and not ctx.sampled
    # The served endpoint is still read from the response headers' metadata.
    assert ctx.served is not None and ctx.served.hostport == "10.0.0.1:8000"
    # Booked until the stream ends, not released at the response headers.
    assert inflight(d) == 1
    assert not s.abandoned  # its end cannot be told from a reset: never counted as one
    s.close()
    s.close()
    assert inflight(d) == 0 and running() == before - 1
    assert skips("skipped") == skipped + 1
    (outcome,) = hook.seen
    assert outcome.ok and outcome.status == 200  # a success status is taken as complete
    assert outcome.ttft_s is None and outcome.prompt_tokens is None and outcome.cached_tokens is None
    assert outcome.endpoint is ctx.served


async def test_sampled_request_reads_its_body_as_before() -> None:
    d, hook = director(1.0)
    s = await routed(d)
    sse = {"content-type": "text/event-stream"}
    assert await s.handle(h.response_headers_msg(200, **sse)) == [m.CONTINUE_RESPONSE_HEADERS]
    out = await h.answer(s, h.response_body_msg(SSE, eos=True))
    assert out == [m.CONTINUE_RESPONSE_BODY]  # STREAMED: continue, body unchanged
    s.close()
    (outcome,) = hook.seen
    assert outcome.ok and outcome.cached_tokens == 4 and outcome.ttft_s is not None


async def test_gie_full_duplex_config_never_gets_an_override() -> None:
    # Envoy 1.40 ignores mode_override whenever a body mode is FULL_DUPLEX_STREAMED.
    for mode, response_mode in ((h.DUPLEX, h.DUPLEX), (h.BUFFERED, h.DUPLEX), (h.DUPLEX, STREAMED)):
        d, _ = director(0.0)
        s = await routed(d, mode=mode, response_mode=response_mode)
        out = await s.handle(h.response_headers_msg(200))
        assert out == [m.CONTINUE_RESPONSE_HEADERS]
        assert s.ctx is not None and not s.ctx.response_skipped
        s.close()


async def test_no_protocol_config_means_no_override() -> None:
    d, _ = director(0.0)
    s = Stream(d)
    await s.handle(h.headers_msg(h.post_headers(), mode=None))
    await s.handle(h.body_msg(CHAT))
    assert await s.handle(h.response_headers_msg(200)) == [m.CONTINUE_RESPONSE_HEADERS]
    s.close()


async def test_a_rewritten_model_name_always_passes_through() -> None:
    d, _ = director(0.0)
    s = await routed(d, extra={"x-gateway-model-name-rewrite": "llama-v2"})
    assert s.ctx is not None and s.ctx.sampled
    out = await s.handle(h.response_headers_msg(200, **{"content-length": "40"}))
    assert not out[0].HasField("mode_override")
    assert list(out[0].response_headers.response.header_mutation.remove_headers) == ["content-length"]
    out = await h.answer(s, h.response_body_msg(b'{"model":"llama-v2"}', eos=True))
    assert out[0].response_body.response.body_mutation.body == b'{"model":"llama"}'
    s.close()


async def test_a_body_after_an_ignored_override_is_accounted() -> None:
    # allow_mode_override off in the gateway: Envoy keeps sending the body; epp reads it.
    d, hook = director(0.0)
    s = await routed(d)
    ignored, skipped = skips("ignored"), skips("skipped")
    out = await s.handle(h.response_headers_msg(200, **{"content-type": "text/event-stream"}))
    assert out[0].HasField("mode_override")
    await h.answer(s, h.response_body_msg(SSE, eos=True))
    assert s.ctx is not None and not s.ctx.response_skipped
    s.close()
    assert skips("ignored") == ignored + 1 and skips("skipped") == skipped
    (outcome,) = hook.seen
    assert outcome.prompt_tokens == 7 and outcome.cached_tokens == 4


async def test_a_response_without_body_gets_no_override() -> None:
    d, _ = director(0.0)
    s = await routed(d)
    msg = h.response_headers_msg(204)
    msg.response_headers.end_of_stream = True
    assert await s.handle(msg) == [m.CONTINUE_RESPONSE_HEADERS]
    s.close()


@pytest.mark.parametrize(("ratio", "sampled"), [(0.0, 0), (0.25, 25), (0.05, 5), (1.0, 100)])
async def test_the_sample_is_the_ratio_exactly_and_starts_with_the_first(ratio: float, sampled: int) -> None:
    d, _ = director(ratio)
    picks: list[bool] = []
    for _ in range(100):
        s = await routed(d)
        ctx: RequestContext | None = s.ctx
        assert ctx is not None
        picks.append(ctx.sampled)
        s.close()
    assert sum(picks) == sampled
    assert picks[0] == (ratio > 0)


def test_ratio_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        DirectorSettings(response_sample_ratio=1.5)
    for bad in ("-0.1", "2", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            flags.ratio(bad)
    assert flags.ratio("0.05") == 0.05
