"""Bounds across ext-proc streams (epp.extproc.limits), over a real grpc.aio server: buffered
body bytes, concurrent streams, and the request-body deadline that ends a slowloris body."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.extproc import server as srv
from epp.extproc import stream as stream_mod
from epp.extproc.limits import StreamGuard, StreamLimits
from tests.extproc import helpers as h

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _server(guard: StreamGuard) -> tuple[grpc.aio.Server, int]:
    director, _ = h.make_director()
    port = _free_port()
    health = srv.Health()
    server = srv.build_server(director, health, bind="127.0.0.1", port=port, credentials=None, guard=guard)
    await server.start()
    return server, port


def _status(resp: object) -> int:
    return int(resp.immediate_response.status.code)  # type: ignore[attr-defined]


async def _settled(guard: StreamGuard) -> None:
    for _ in range(200):
        if guard.streams == 0 and guard.buffered == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"streams {guard.streams}, buffered {guard.buffered}")


async def test_an_unfinished_body_is_answered_408_at_its_deadline_and_freed() -> None:
    guard = StreamGuard(StreamLimits(request_body_timeout=0.3))
    server, port = await _server(guard)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(h.headers_msg(h.post_headers()))
            await call.write(h.body_msg(b'{"model":"m","messages":[', eos=False))  # and nothing more
            resp = await asyncio.wait_for(call.read(), 5)
            assert _status(resp) == 408
            assert b"--request-body-timeout" in resp.immediate_response.body
            await _settled(guard)
            # a body that arrives in time is routed as before
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(h.headers_msg(h.post_headers()))
            await call.write(h.body_msg(CHAT))
            assert not (await call.read()).HasField("immediate_response")
            call.cancel()
            await _settled(guard)
    finally:
        await server.stop(None)


async def test_buffered_bytes_across_streams_are_capped_and_given_back() -> None:
    guard = StreamGuard(StreamLimits(max_buffered_body_bytes=100_000))
    server, port = await _server(guard)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            first = stub.Process()
            await first.write(h.headers_msg(h.post_headers()))
            await first.write(h.body_msg(b"x" * 60_000, eos=False))
            for _ in range(100):
                if guard.buffered:
                    break
                await asyncio.sleep(0.01)
            assert guard.buffered == 60_000
            second = stub.Process()
            await second.write(h.headers_msg(h.post_headers()))
            await second.write(h.body_msg(b"y" * 60_000, eos=False))
            resp = await asyncio.wait_for(second.read(), 5)
            assert _status(resp) == 503
            assert b"--max-buffered-body-bytes" in resp.immediate_response.body
            first.cancel()  # the client went away: its bytes are given back
            await _settled(guard)
    finally:
        await server.stop(None)


def _big_chat(size: int) -> bytes:
    filler = "x" * (size - len(CHAT))
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": filler}]}).encode()


async def test_a_routed_body_gives_its_bytes_back_before_the_response_ends() -> None:
    # The cap is on bodies being buffered, not on prompts of generations in flight: once the
    # routing answer is written, the body is the gateway's to forward and epp holds no copy.
    guard = StreamGuard(StreamLimits(max_buffered_body_bytes=100_000))
    server, port = await _server(guard)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            held = []
            for mode in (h.BUFFERED, h.DUPLEX, h.BUFFERED):  # 3 x 60 kB: 180 kB routed, each in turn
                call = stub.Process()
                await call.write(h.headers_msg(h.post_headers(), mode=mode))
                if mode == h.BUFFERED:
                    assert (await asyncio.wait_for(call.read(), 5)).HasField("request_headers")
                await call.write(h.body_msg(_big_chat(60_000)))
                resp = await asyncio.wait_for(call.read(), 5)
                assert not resp.HasField("immediate_response"), resp
                held.append(call)  # routed; its response has not even started
                for _ in range(200):
                    if guard.buffered == 0:
                        break
                    await asyncio.sleep(0.01)
                assert guard.buffered == 0
            assert guard.streams == 3
            # A body that fails routing (400) gives its bytes back too, once.
            bad = stub.Process()
            await bad.write(h.headers_msg(h.post_headers(), mode=h.BUFFERED))
            assert (await asyncio.wait_for(bad.read(), 5)).HasField("request_headers")
            await bad.write(h.body_msg(b'{"model": "m", "messages": 7}' + b" " * 50_000))
            assert _status(await asyncio.wait_for(bad.read(), 5)) == 400
            for call in held:
                call.cancel()
            await _settled(guard)
    finally:
        await server.stop(None)


async def test_streams_beyond_the_limit_are_503() -> None:
    guard = StreamGuard(StreamLimits(max_concurrent_streams=2))
    server, port = await _server(guard)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            held = []
            for _ in range(2):
                call = stub.Process()
                await call.write(h.headers_msg(h.post_headers()))
                held.append(call)
            for _ in range(100):
                if guard.streams == 2:
                    break
                await asyncio.sleep(0.01)
            extra = stub.Process()
            await extra.write(h.headers_msg(h.post_headers()))
            resp = await asyncio.wait_for(extra.read(), 5)
            assert _status(resp) == 503
            assert b"--max-concurrent-streams" in resp.immediate_response.body
            for call in held:
                call.cancel()
            await _settled(guard)
    finally:
        await server.stop(None)


async def test_a_flood_of_503s_logs_one_warning_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    throttle = stream_mod.OVER_LIMIT_LOGS["streams"]
    monkeypatch.setattr(throttle, "at", -math.inf)
    monkeypatch.setattr(throttle, "suppressed", 0)
    guard = StreamGuard(StreamLimits(max_concurrent_streams=1))
    server, port = await _server(guard)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "--max-concurrent-streams" in r.getMessage()]

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            held = stub.Process()
            await held.write(h.headers_msg(h.post_headers()))
            for _ in range(100):
                if guard.streams == 1:
                    break
                await asyncio.sleep(0.01)
            with caplog.at_level(logging.WARNING, logger="epp.extproc"):
                for _ in range(6):
                    extra = stub.Process()
                    await extra.write(h.headers_msg(h.post_headers()))
                    assert _status(await asyncio.wait_for(extra.read(), 5)) == 503
                assert len(lines()) == 1
                throttle.at -= throttle.interval  # the interval has passed
                extra = stub.Process()
                await extra.write(h.headers_msg(h.post_headers()))
                assert _status(await asyncio.wait_for(extra.read(), 5)) == 503
            assert len(lines()) == 2
            assert lines()[1].endswith("(5 more since the last report)")
            held.cancel()
            await _settled(guard)
    finally:
        await server.stop(None)


def test_limits_must_be_sane() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        StreamLimits(max_concurrent_streams=0)
    with pytest.raises(ValueError, match=">= 0"):
        StreamLimits(request_body_timeout=-1)
    with pytest.raises(ValueError, match=">= 0"):
        StreamLimits(large_body_rate=-1)


def _sized(body: bytes, **extra: str) -> dict[str, str]:
    return h.post_headers(**{"content-length": str(len(body)), **extra})


async def test_large_bodies_wait_unread_for_a_lane_while_small_ones_pass() -> None:
    guard = StreamGuard(StreamLimits(large_body_bytes=10_000, large_body_lanes=1, large_body_rate=0))
    server, port = await _server(guard)
    big = _big_chat(30_000)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            first = stub.Process()  # takes the one lane once over the size (20,000 bytes)
            await first.write(h.headers_msg(_sized(big)))
            await first.write(h.body_msg(big[:20_000], eos=False))
            second = stub.Process()
            await second.write(h.headers_msg(_sized(big)))
            await second.write(h.body_msg(big))
            waiting = asyncio.ensure_future(second.read())
            small = stub.Process()  # under the size: never waits for a lane
            await small.write(h.headers_msg(h.post_headers()))
            await small.write(h.body_msg(CHAT))
            assert not (await asyncio.wait_for(small.read(), 5)).HasField("immediate_response")
            await asyncio.sleep(0.3)
            assert not waiting.done()  # nor was its body read: the buffered bytes are the first's
            assert guard.buffered == 20_000
            await first.write(h.body_msg(big[20_000:]))
            assert not (await asyncio.wait_for(first.read(), 5)).HasField("immediate_response")
            assert not (await asyncio.wait_for(waiting, 5)).HasField("immediate_response")
            # Without Content-Length alike.
            third = stub.Process()
            await third.write(h.headers_msg(h.post_headers()))
            await third.write(h.body_msg(big))
            assert not (await asyncio.wait_for(third.read(), 5)).HasField("immediate_response")
            for call in (first, second, third, small):
                call.cancel()
            await _settled(guard)
    finally:
        await server.stop(None)


async def test_a_large_body_waiting_for_a_lane_past_the_body_timeout_is_408() -> None:
    limits = StreamLimits(
        large_body_bytes=10_000, large_body_lanes=1, large_body_rate=0, request_body_timeout=0.3
    )
    guard = StreamGuard(limits)
    server, port = await _server(guard)
    big = _big_chat(30_000)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            first = stub.Process()  # takes the lane with its first 20,000 bytes, then stalls
            await first.write(h.headers_msg(_sized(big)))
            await first.write(h.body_msg(big[:20_000], eos=False))
            second = stub.Process()
            await second.write(h.headers_msg(_sized(big), mode=h.BUFFERED))
            assert (await asyncio.wait_for(second.read(), 5)).HasField("request_headers")
            await second.write(h.body_msg(big))
            wait = await asyncio.wait_for(second.read(), 5)  # Envoy is told to wait for the lane
            assert wait.HasField("override_message_timeout")
            resp = await asyncio.wait_for(second.read(), 5)
            assert _status(resp) == 408
            assert b"--max-concurrent-large-bodies" in resp.immediate_response.body
            assert _status(await asyncio.wait_for(first.read(), 5)) == 408  # its body never ended
            await _settled(guard)
            again = stub.Process()  # the lane given back
            await again.write(h.headers_msg(_sized(big)))
            await again.write(h.body_msg(big))
            assert not (await asyncio.wait_for(again.read(), 5)).HasField("immediate_response")
            again.cancel()
            await _settled(guard)
    finally:
        await server.stop(None)


async def test_large_bodies_are_read_at_the_rate() -> None:
    # 100 kB/s, one second's worth deep: three 60 kB bodies take ~0.8 s (the bucket's 100 kB
    # cover the first and 40 kB of the second), small ones are never held.
    guard = StreamGuard(StreamLimits(large_body_bytes=10_000, large_body_lanes=0, large_body_rate=100_000))
    server, port = await _server(guard)
    big = _big_chat(60_000)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            done = []
            for _ in range(3):
                call = stub.Process()
                await call.write(h.headers_msg(_sized(big), mode=h.BUFFERED))
                assert (await asyncio.wait_for(call.read(), 5)).HasField("request_headers")
                await call.write(h.body_msg(big))
                answer = await asyncio.wait_for(call.read(), 5)
                if answer.HasField("override_message_timeout"):  # it waits: Envoy is told to
                    answer = await asyncio.wait_for(call.read(), 5)
                assert answer.HasField("request_body")
                done.append(loop.time() - t0)
                call.cancel()
            assert done[0] < 0.15
            assert 0.7 < done[2] < 1.5, done
            small = stub.Process()
            t1 = loop.time()
            await small.write(h.headers_msg(h.post_headers()))
            await small.write(h.body_msg(CHAT))
            assert not (await asyncio.wait_for(small.read(), 5)).HasField("immediate_response")
            assert loop.time() - t1 < 0.15
            small.cancel()
            await _settled(guard)
    finally:
        await server.stop(None)


def test_content_length_is_read_only_when_a_plain_number() -> None:
    for value, size in [("123", 123), ("", 0), ("-5", 0), ("1e9", 0), ("²", 0), ("9" * 30, 0)]:
        assert stream_mod._content_length({"content-length": value}) == size


@pytest.mark.parametrize(("mode", "sent"), [(h.DUPLEX, 64), (h.DUPLEX, 20_000), (h.BUFFERED, 0)])
async def test_stalled_uploads_that_declare_large_bodies_do_not_hold_the_lanes(mode: int, sent: int) -> None:
    """Two 64-byte uploads declaring 2 MiB held both large-body lanes until the body timeout
    (60 s), so every honest large body waited, and in BUFFERED mode (the generated Envoy's) got
    504 at Envoy's message timeout. A declaration takes nothing: lanes go to bodies as their
    bytes arrive (`sent` 20,000: over the size, so they take the lanes), and one whose bytes
    stop arriving gives its lane back (`LANE_IDLE_S`)."""
    guard = StreamGuard(StreamLimits(large_body_bytes=10_000, large_body_lanes=2, large_body_rate=0))
    server, port = await _server(guard)
    big = _big_chat(30_000)
    declared = h.post_headers(**{"content-length": str(2 << 20)})
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            stalled = [stub.Process() for _ in range(2)]
            for call in stalled:
                await call.write(h.headers_msg(declared, mode=mode))
                if sent:
                    await call.write(h.body_msg(b'{"model":"m","messages":[' + b" " * (sent - 26), eos=False))
            honest = stub.Process()
            await honest.write(h.headers_msg(_sized(big), mode=mode))
            if mode == h.BUFFERED:  # the headers are answered at once: Envoy's timer is not burnt
                first = await asyncio.wait_for(honest.read(), 2)
                assert first.HasField("request_headers")
            await honest.write(h.body_msg(big))
            routed = await asyncio.wait_for(honest.read(), 3)
            assert not routed.HasField("immediate_response")
            for call in (*stalled, honest):
                call.cancel()
            await _settled(guard)
    finally:
        await server.stop(None)


async def test_a_declared_body_over_the_limit_is_413_before_any_byte() -> None:
    director, _ = h.make_director()
    s = stream_mod.Stream(director, StreamGuard(StreamLimits()))
    headers = h.post_headers(**{"content-length": str(director.settings.max_body_bytes + 1)})
    (answer,) = list(await s.handle(h.headers_msg(headers)))
    assert _status(answer) == 413
    s.close()


async def test_streams_waiting_for_a_lane_are_not_received_into_grpcs_buffers() -> None:
    """A large body waiting for its lane is not read; with gRPC's BDP probe on, its sender still
    pushed megabytes into gRPC core's receive buffers (100 unfinished 15 MiB bodies: 1.6 GB of
    RSS). Here the waiting senders' writes must stall after a little, as HTTP/2 flow control is
    meant to hold them."""
    limits = StreamLimits(large_body_bytes=1 << 20, large_body_lanes=1, large_body_rate=0)
    guard = StreamGuard(limits)
    server, port = await _server(guard)
    chunk = b" " * (1 << 20)
    written = [0] * 8
    try:
        options = [("grpc.max_send_message_length", 8 << 20)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)

            async def send(i: int) -> None:
                call = stub.Process()
                await call.write(h.headers_msg(h.post_headers()))
                await call.write(h.body_msg(b'{"model":"m","messages":[', eos=False))
                for _ in range(6):
                    await call.write(h.body_msg(chunk, eos=False))
                    written[i] += 1

            sends = [asyncio.ensure_future(send(i)) for i in range(len(written))]
            await asyncio.sleep(2.0)
            for task in sends:
                task.cancel()
            await asyncio.gather(*sends, return_exceptions=True)
    finally:
        await server.stop(None)
    # A lane holder sends its six (one that then idles gives its lane to the next, LANE_IDLE_S);
    # each waiting one has one chunk read and little more in flight: 18 here. With the probe on,
    # every waiting stream's chunks went into gRPC's buffers too: 36.
    assert sum(written) <= 6 + 3 * (len(written) - 1), written


def _on_connection(connection: int) -> object:
    msg = h.headers_msg(h.post_headers())
    msg.attributes["envoy.filters.http.ext_proc"].fields["connection.id"].number_value = connection
    return msg


async def test_unfinished_bodies_are_bounded_per_client_connection() -> None:
    """With Envoy's connection.id attribute (the generated full-duplex config sends it), one
    client connection may hold only so many bodies still arriving, and so many of their bytes:
    past either 429, while other connections go on."""
    director, _ = h.make_director()
    limits = StreamLimits(
        max_unfinished_bodies_per_connection=2, max_buffered_body_bytes_per_connection=100_000
    )
    guard = StreamGuard(limits)
    part = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 30_000
    streams = [stream_mod.Stream(director, guard) for _ in range(5)]
    a, b, c, other, d = streams
    for s in (a, b):
        assert list(await s.handle(_on_connection(7))) == []
        assert list(await s.handle(h.body_msg(part, eos=False))) == []
    (refused,) = list(await c.handle(_on_connection(7)))  # a third body on connection 7
    assert _status(refused) == 429 and b"client connection" in refused.immediate_response.body
    assert list(await other.handle(_on_connection(8))) == []  # another connection goes on
    assert list(await other.handle(h.body_msg(part, eos=False))) == []
    # 60,000 bytes held on connection 7: another 30,000 fit, the next chunk does not.
    assert list(await a.handle(h.body_msg(part, eos=False))) == []
    (refused,) = list(await b.handle(h.body_msg(part, eos=False)))
    assert _status(refused) == 429 and b"per-connection" in refused.immediate_response.body
    b.close()
    assert list(await d.handle(_on_connection(7))) == []  # b's place given back
    for s in streams:
        s.close()
    assert guard.connections == {} and guard.buffered == 0
