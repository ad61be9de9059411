"""The per-token path: streamed response chunks answered with pre-serialized bytes, over real gRPC."""

from __future__ import annotations

import asyncio

import grpc
import msgspec
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.extproc import messages as m
from epp.extproc import server as srv
from epp.extproc.stream import Stream
from tests.extproc import helpers as h
from tests.extproc.test_server import free_port

CHAT = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})


def _event(i: int) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":" t%d"}}]}\n\n' % i


USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":40,"total_tokens":47}}\n\n'


@pytest.mark.parametrize(
    "size", [0, 1, 127, 128, 300, 16383, 16384, m.MAX_BODY_CHUNK, m.MAX_BODY_CHUNK + 1, 150_000]
)
@pytest.mark.parametrize("eos", [False, True])
def test_wire_answer_is_byte_equal_to_upb(size: int, eos: bool) -> None:
    body = bytes(i % 251 for i in range(size))
    expected = [r.SerializeToString() for r in _upb_answers(body, eos)]
    assert m.streamed_response_body_wire(body, eos) == expected
    # and the shared template keeps nothing of the previous answer
    assert m.streamed_response_body_wire(b"x", False) == [_upb_answers(b"x", False)[0].SerializeToString()]


@pytest.mark.parametrize(
    "size",
    [0, 1, m.MAX_BODY_CHUNK, m.MAX_BODY_CHUNK + 1, 3 * m.MAX_BODY_CHUNK + 7, 300 * m.MAX_BODY_CHUNK + 1],
)
@pytest.mark.parametrize("eos", [False, True])
def test_request_body_sent_back_serialized_is_the_messages_bytes(size: int, eos: bool) -> None:
    body = bytes(i % 251 for i in range(size))
    messages = m.streamed_request_body(body)
    messages[-1].request_body.response.body_mutation.streamed_response.end_of_stream = eos
    assert list(m.streamed_request_body_wire(body, eos)) == [r.SerializeToString() for r in messages]
    assert list(m.streamed_request_body_wire(memoryview(body), eos)) == [
        r.SerializeToString() for r in messages
    ]
    # the request template is not the response one
    assert m.streamed_response_body_wire(b"x", True) == [_upb_answers(b"x", True)[0].SerializeToString()]


def _rss_anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_wire_answers_do_not_accumulate_chunks() -> None:
    """upb keeps every bytes value set on a message until the message dies: one kept message for
    the process held every chunk it answered (the soak's RSS growth). 64 MB of chunks, answered
    one by one, must leave the process about as large as it was."""
    chunk = bytes(range(256)) * 16  # 4 KiB, a large SSE event
    m.streamed_response_body_wire(chunk, False)
    before = _rss_anon_mb()
    for _ in range(16_384):
        m.streamed_response_body_wire(chunk, False)
    grown = _rss_anon_mb() - before
    assert grown < 16, f"RssAnon grew {grown:.1f} MB over 64 MB of answered chunks"


def _upb_answers(body: bytes, eos: bool) -> list[pb.ProcessingResponse]:
    """The oracle: the same answers built as nested upb messages, chunked at MAX_BODY_CHUNK."""
    starts = range(0, len(body), m.MAX_BODY_CHUNK) if body else [0]
    return [
        pb.ProcessingResponse(
            response_body=pb.BodyResponse(
                response=pb.CommonResponse(
                    body_mutation=pb.BodyMutation(
                        streamed_response=pb.StreamedBodyResponse(
                            body=body[i : i + m.MAX_BODY_CHUNK],
                            end_of_stream=eos and i + m.MAX_BODY_CHUNK >= len(body),
                        )
                    )
                )
            )
        )
        for i in starts
    ]


async def _routed_stream(mode: int = h.DUPLEX) -> Stream:
    director, _ = h.make_director()
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers(), mode=mode, response_mode=mode))
    await s.handle(h.body_msg(CHAT))
    await s.handle(h.response_headers_msg(200, **{"content-type": "text/event-stream"}))
    return s


async def test_stream_answers_chunks_as_bytes_and_still_accounts_usage() -> None:
    s = await _routed_stream()
    for i in range(3):
        (wire,) = s.response_body(h.response_body_msg(_event(i), eos=False))
        assert isinstance(wire, bytes)
        sr = m.ProcessingResponse.FromString(wire).response_body.response.body_mutation.streamed_response
        assert sr.body == _event(i) and not sr.end_of_stream
    (wire,) = s.response_body(h.response_body_msg(USAGE, eos=True))
    assert m.ProcessingResponse.FromString(
        wire
    ).response_body.response.body_mutation.streamed_response.end_of_stream
    assert s.response_complete
    assert s.ctx is not None and s.ctx.tracker.usage is not None
    assert s.ctx.tracker.usage.completion_tokens == 40
    s.close()


async def test_non_duplex_response_modes_still_get_continue_or_replace() -> None:
    s = await _routed_stream(h.BUFFERED)
    (wire,) = s.response_body(h.response_body_msg(b'{"x":1}', eos=True))
    assert m.ProcessingResponse.FromString(wire) == m.CONTINUE_RESPONSE_BODY
    s.close()


async def test_two_hundred_streamed_chunks_over_grpc_in_order_then_released() -> None:
    director, ds = h.make_director()
    health = srv.Health()
    port = free_port()
    server = srv.build_server(director, health, bind="127.0.0.1", port=port, credentials=None)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(h.headers_msg(h.post_headers()))
            await call.write(h.body_msg(CHAT))
            routed = await call.read()
            assert h.set_headers(routed)[m.DESTINATION_HEADER]
            await call.read()  # the request body, echoed
            await call.write(h.response_headers_msg(200, **{"content-type": "text/event-stream"}))
            assert (await call.read()).WhichOneof("response") == "response_headers"

            async def send() -> None:  # as Envoy does: chunks go out without waiting for answers
                for i in range(200):
                    await call.write(h.response_body_msg(_event(i), eos=False))
                await call.write(h.response_body_msg(USAGE, eos=True))

            sender = asyncio.create_task(send())
            got = []
            for _ in range(201):
                resp = await call.read()
                got.append(resp.response_body.response.body_mutation.streamed_response)
            await sender
            assert [g.body for g in got] == [_event(i) for i in range(200)] + [USAGE]
            assert [g.end_of_stream for g in got] == [False] * 200 + [True]
            await call.done_writing()
            assert await call.read() == grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
        for _ in range(100):
            if sum(ep.inflight_requests for ep in ds.endpoints()) == 0:
                break
            await asyncio.sleep(0.01)
        assert sum(ep.inflight_requests for ep in ds.endpoints()) == 0
    finally:
        await server.stop(0)


def test_a_long_body_sent_back_is_serialized_chunk_by_chunk() -> None:
    """Lazily: the server writes each chunk before the next is built, so the loop never holds a
    16 MiB body's 270 serializations in one step."""
    body = bytes(16 << 20)
    chunks = m.streamed_request_body_wire(body)
    assert not isinstance(chunks, list)
    first = next(iter(chunks))
    assert first == m.streamed_request_body(body[: 2 * m.MAX_BODY_CHUNK])[0].SerializeToString()
