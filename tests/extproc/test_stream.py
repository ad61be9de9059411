"""The ext-proc state machine, message by message, against a real director and scheduler."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable

import msgspec
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.extproc import _join
from epp.extproc import messages as m
from epp.extproc import stream as stream_module
from epp.extproc.stream import Stream
from epp.requestcontrol.director import DirectorSettings
from tests.extproc import helpers as h

CHAT = msgspec.json.encode(
    {"model": "llama", "messages": [{"role": "user", "content": "hello " * 50}], "stream": False}
)
HOSTPORTS = {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}


async def test_duplex_defers_headers_until_body_then_routes_with_header_and_metadata() -> None:
    director, ds = h.make_director()
    s = Stream(director)
    assert await s.handle(h.headers_msg(h.post_headers())) == []
    assert await s.handle(h.body_msg(CHAT[:10], eos=False)) == []
    out = list(await s.handle(h.body_msg(CHAT[10:], eos=True)))
    assert [h.message(r).WhichOneof("response") for r in out] == ["request_headers", "request_body"]
    headers = h.set_headers(out[0])
    dest = headers[m.DESTINATION_HEADER]
    assert dest in HOSTPORTS
    assert out[0].request_headers.response.clear_route_cache
    md = out[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields[m.DESTINATION_HEADER].string_value
    assert md == dest
    assert headers["content-length"] == str(len(CHAT))
    streamed = h.message(out[1]).request_body.response.body_mutation.streamed_response
    assert streamed.body == CHAT and streamed.end_of_stream
    # booked on the primary until the stream ends
    ep = ds.by_hostport(dest)
    assert ep is not None and ep.inflight_requests == 1
    s.close()
    assert ep.inflight_requests == 0


async def test_large_body_is_resent_in_chunks_of_at_most_62000_bytes() -> None:
    director, _ = h.make_director(settings=DirectorSettings(max_body_bytes=1 << 20))
    big = msgspec.json.encode({"model": "m", "prompt": "x" * 150_000})
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers("/v1/completions")))
    out = list(await s.handle(h.body_msg(big)))
    chunks = [h.message(r).request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert len(chunks) == 3
    assert all(len(c.body) <= m.MAX_BODY_CHUNK for c in chunks)
    assert [c.end_of_stream for c in chunks] == [False, False, True]
    assert b"".join(c.body for c in chunks) == big
    s.close()


async def test_large_body_in_chunks_is_joined_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of 1 MiB or more arriving in chunks is joined in a worker thread (a 16 MiB join held
    the loop 3-11 ms); it routes and is sent back as it came."""
    joined_on: list[int] = []
    real = _join.join

    def join(parts: list[bytes | memoryview]) -> bytes:
        joined_on.append(threading.get_ident())
        return real(parts)

    monkeypatch.setattr(stream_module._join, "join", join)
    director, _ = h.make_director(settings=DirectorSettings(max_body_bytes=4 << 20))
    big = msgspec.json.encode({"model": "m", "prompt": "x " * (600 << 10)})
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers("/v1/completions")))
    half = len(big) // 2
    assert await s.handle(h.body_msg(big[:half], eos=False)) == []
    out = list(await s.handle(h.body_msg(big[half:])))
    assert joined_on and joined_on[0] != threading.get_ident()
    chunks = [h.message(r).request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert b"".join(c.body for c in chunks) == big and chunks[-1].end_of_stream
    s.close()


async def test_buffered_mode_continues_headers_and_routes_on_the_body_answer() -> None:
    director, _ = h.make_director()
    s = Stream(director)
    out = list(await s.handle(h.headers_msg(h.post_headers(), mode=h.BUFFERED, response_mode=h.BUFFERED)))
    assert out == [m.CONTINUE_REQUEST_HEADERS]
    out = list(await s.handle(h.body_msg(CHAT)))
    assert len(out) == 1 and out[0].WhichOneof("response") == "request_body"
    dest = h.set_headers(out[0], "request_body")[m.DESTINATION_HEADER]
    assert dest in HOSTPORTS
    assert not out[0].request_body.response.body_mutation.HasField("body")  # body untouched
    s.close()


async def test_buffered_body_followed_by_trailers_is_routed_on_the_body() -> None:
    """A request with trailers: in BUFFERED mode Envoy sends the whole body with end_of_stream
    false (the trailers end the stream) and, with the trailer mode SKIP (the generated config),
    no trailers message. Waiting for the end cost such requests a 504 at message_timeout."""
    director, _ = h.make_director()
    s = Stream(director)
    out = list(await s.handle(h.headers_msg(h.post_headers(), mode=h.BUFFERED, response_mode=h.BUFFERED)))
    assert out == [m.CONTINUE_REQUEST_HEADERS]
    out = list(await s.handle(h.body_msg(CHAT, eos=False)))
    assert len(out) == 1 and out[0].WhichOneof("response") == "request_body"
    assert h.set_headers(out[0], "request_body")[m.DESTINATION_HEADER] in HOSTPORTS
    # Were the trailers sent too (trailer mode SEND), they are passed on.
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    assert list(await s.handle(trailers)) == [m.CONTINUE_REQUEST_TRAILERS]
    s.close()


async def test_header_only_request_is_routed_immediately() -> None:
    director, _ = h.make_director()
    s = Stream(director)
    out = list(await s.handle(h.headers_msg({":method": "GET", ":path": "/v1/models"}, eos=True)))
    assert len(out) == 1
    assert h.set_headers(out[0])[m.DESTINATION_HEADER] in HOSTPORTS
    s.close()


async def test_forged_destination_header_is_overwritten() -> None:
    director, _ = h.make_director()
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers(**{m.DESTINATION_HEADER: "6.6.6.6:1"})))
    out = list(await s.handle(h.body_msg(CHAT)))
    opt = out[0].request_headers.response.header_mutation.set_headers[0]
    assert opt.header.key == m.DESTINATION_HEADER and opt.header.raw_value.decode() in HOSTPORTS
    assert opt.append_action == opt.OVERWRITE_IF_EXISTS_OR_ADD
    s.close()


def _immediate(answers: Iterable[m.ProcessingResponse]) -> tuple[int, dict[str, object]]:
    out = list(answers)
    assert len(out) == 1 and out[0].WhichOneof("response") == "immediate_response"
    ir = out[0].immediate_response
    body = json.loads(ir.body)
    assert "\n" not in body["error"]["message"]
    return ir.status.code, body


async def test_bad_input_matrix_answers_with_status_and_one_line_reason() -> None:
    cases = [
        (b"{not json", 400),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400),  # no model
        (b'{"model": "m"}', 400),  # no messages
        (b"", 400),
    ]
    for body, status in cases:
        director, ds = h.make_director()
        s = Stream(director)
        await s.handle(h.headers_msg(h.post_headers()))
        code, _ = _immediate(await s.handle(h.body_msg(body)))
        assert code == status, body
        assert s.closed
        s.close()
        assert all(ep.inflight_requests == 0 for ep in ds.endpoints())


async def test_body_over_limit_is_413_before_the_body_ends() -> None:
    director, _ = h.make_director(settings=DirectorSettings(max_body_bytes=1000))
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers()))
    assert await s.handle(h.body_msg(b"x" * 600, eos=False)) == []
    code, body = _immediate(await s.handle(h.body_msg(b"x" * 600, eos=False)))
    assert code == 413 and "1000" in str(body)


async def test_no_endpoints_is_503_and_subset_hint_restricts() -> None:
    director, _ = h.make_director(n=0)
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers()))
    assert _immediate(await s.handle(h.body_msg(CHAT)))[0] == 503

    director, _ = h.make_director()
    for subset, expect in ((["10.0.0.2:9999"], "10.0.0.2:8000"), ([], None)):
        s = Stream(director)
        msg = h.headers_msg(h.post_headers())
        await s.handle(msg)
        body = h.body_msg(CHAT)
        lv = body.metadata_context.filter_metadata[m.SUBSET_NAMESPACE].fields[m.SUBSET_KEY].list_value
        lv.values.extend([])
        for item in subset:
            lv.values.add().string_value = item
        out = list(await s.handle(body))
        if expect is None:
            assert _immediate(out)[0] == 503
        else:
            assert h.set_headers(out[0])[m.DESTINATION_HEADER] == expect
        s.close()


async def test_everything_filtered_out_is_429() -> None:
    config = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-based-testing-filter
  - pluginRef: max-score-picker
"""
    director, _ = h.make_director(config=config)
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers(**{"test-epp-endpoint-selection": "192.168.9.9"})))
    assert _immediate(await s.handle(h.body_msg(CHAT)))[0] == 429


async def test_fallback_list_is_ordered_and_comma_separated() -> None:
    config = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 3}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""
    director, ds = h.make_director(config=config)
    ds.get("pod-0").metrics.waiting = 9  # type: ignore[union-attr]
    ds.get("pod-1").metrics.waiting = 0  # type: ignore[union-attr]
    ds.get("pod-2").metrics.waiting = 3  # type: ignore[union-attr]
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers()))
    out = list(await s.handle(h.body_msg(CHAT)))
    assert h.set_headers(out[0])[m.DESTINATION_HEADER] == "10.0.0.2:8000,10.0.0.3:8000,10.0.0.1:8000"
    md = out[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields[m.DESTINATION_HEADER].string_value
    assert md == "10.0.0.2:8000,10.0.0.3:8000,10.0.0.1:8000"
    # only the primary is booked
    assert [ep.inflight_requests for ep in ds.endpoints()] == [0, 1, 0]
    s.close()


async def test_response_path_echoes_chunks_records_usage_and_releases() -> None:
    director, ds = h.make_director()
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers()))
    out = list(await s.handle(h.body_msg(CHAT)))
    dest = h.set_headers(out[0])[m.DESTINATION_HEADER]
    out = list(await s.handle(h.response_headers_msg(200, served=dest)))
    assert out == [m.CONTINUE_RESPONSE_HEADERS]
    body = b'{"model":"llama","usage":{"prompt_tokens":7,"completion_tokens":3}}'
    out = await h.answer(s, h.response_body_msg(body[:20], eos=False))
    assert out[0].response_body.response.body_mutation.streamed_response.body == body[:20]
    out = await h.answer(s, h.response_body_msg(body[20:], eos=True))
    sr = out[0].response_body.response.body_mutation.streamed_response
    assert sr.body == body[20:] and sr.end_of_stream
    assert s.response_complete
    assert s.ctx is not None and s.ctx.tracker.usage is not None
    assert s.ctx.tracker.usage.prompt_tokens == 7
    s.close()
    s.close()  # idempotent
    assert all(ep.inflight_requests == 0 for ep in ds.endpoints())


async def test_model_rewrite_header_rewrites_body_and_response_back() -> None:
    director, _ = h.make_director(settings=DirectorSettings(trust_model_rewrite_header=True))
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers(**{"x-gateway-model-name-rewrite": "llama-v2"})))
    out = list(await s.handle(h.body_msg(CHAT)))
    sent = h.message(out[1]).request_body.response.body_mutation.streamed_response.body
    assert json.loads(sent)["model"] == "llama-v2"
    assert h.set_headers(out[0])["content-length"] == str(len(sent))
    out = list(await s.handle(h.response_headers_msg(200, **{"content-length": "40"})))
    assert list(out[0].response_headers.response.header_mutation.remove_headers) == ["content-length"]
    out = await h.answer(s, h.response_body_msg(b'{"model":"llama-v2","x":1}', eos=True))
    assert json.loads(out[0].response_body.response.body_mutation.streamed_response.body)["model"] == "llama"
    s.close()
