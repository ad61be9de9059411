"""epp.datastore.httpget: the scraper's keep-alive GETs, against raw asyncio servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from epp.datastore.httpget import HttpError, HttpGetter

Reply = Callable[[bytes], bytes | None]  # request head -> bytes to send (None: close the connection)


class _Server(asyncio.Protocol):
    def __init__(self, reply: Reply, log: list[bytes]) -> None:
        self.reply = reply
        self.log = log
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            self.log.append(head)
            out = self.reply(head)
            if out is None:
                self.transport.close()
                return
            self.transport.write(out)


async def serve(reply: Reply) -> tuple[asyncio.Server, int, list[bytes]]:
    log: list[bytes] = []
    server = await asyncio.get_running_loop().create_server(lambda: _Server(reply, log), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], log


@pytest.fixture
async def getter() -> AsyncIterator[HttpGetter]:
    g = HttpGetter(timeout=2.0, headers={"Accept": "text/plain"})
    yield g
    g.close()


def fixed(status: int, body: bytes, **headers: str) -> bytes:
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def test_content_length_and_keep_alive(getter: HttpGetter) -> None:
    server, port, log = await serve(lambda head: fixed(200, b"page " + head.split(b" ")[1]))
    async with server:
        for path in ("/metrics", "/v1/models", "/metrics"):
            assert await getter.get("127.0.0.1", port, path, 1000) == (200, b"page " + path.encode())
    assert len(log) == 3
    assert log[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:") and b"Accept: text/plain" in log[0]


async def test_chunked_with_trailers(getter: HttpGetter) -> None:
    body = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n"
    )
    server, port, _ = await serve(lambda head: body)
    async with server:
        assert await getter.get("127.0.0.1", port, "/", 100) == (200, b"hello world")
        assert await getter.get("127.0.0.1", port, "/", 100) == (200, b"hello world")  # kept alive


async def test_no_length_reads_to_the_end(getter: HttpGetter) -> None:
    replies = [b"HTTP/1.0 200 OK\r\n\r\nall of it", b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nrest"]

    class Once(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            transport.write(replies.pop(0))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        assert await getter.get("127.0.0.1", port, "/", 100) == (200, b"all of it")
        assert await getter.get("127.0.0.1", port, "/", 100) == (200, b"rest")


async def test_status_and_no_body_statuses(getter: HttpGetter) -> None:
    server, port, _ = await serve(
        lambda head: b"HTTP/1.1 204 No Content\r\n\r\n" if b"/a" in head else fixed(503, b"busy")
    )
    async with server:
        assert await getter.get("127.0.0.1", port, "/a", 100) == (204, b"")
        assert await getter.get("127.0.0.1", port, "/b", 100) == (503, b"busy")


async def test_over_the_limit_fails_and_the_next_get_reconnects(getter: HttpGetter) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n0\r\n\r\n"
    server, port, log = await serve(lambda head: fixed(200, b"x" * 50) if b"/big" in head else chunked)
    async with server:
        with pytest.raises(HttpError, match="exceeds 10"):
            await getter.get("127.0.0.1", port, "/big", 10)
        with pytest.raises(HttpError, match="exceeds 4"):
            await getter.get("127.0.0.1", port, "/chunked", 4)
        assert await getter.get("127.0.0.1", port, "/chunked", 100) == (200, b"12345678")
    assert len(log) == 3


async def test_idle_close_is_retried_once(getter: HttpGetter) -> None:
    served = []

    def reply(head: bytes) -> bytes | None:
        served.append(head)
        return fixed(200, b"ok", Connection="keep-alive")

    server, port, _ = await serve(reply)
    async with server:
        assert await getter.get("127.0.0.1", port, "/", 100) == (200, b"ok")
        for conn in list(getter._conns.values()):  # the server side closing an idle connection
            assert conn.transport is not None
            conn.transport.abort()
        await asyncio.sleep(0.05)
        assert await getter.get("127.0.0.1", port, "/", 100) == (200, b"ok")
    assert len(served) == 2


async def test_malformed_and_silent_servers() -> None:
    server, port, _ = await serve(lambda head: b"SPDY/9 200\r\n\r\n")
    hung, hung_port, _ = await serve(lambda head: b"")
    getter = HttpGetter(timeout=0.2, headers={})
    try:
        async with server, hung:
            with pytest.raises(HttpError, match="bad status line"):
                await getter.get("127.0.0.1", port, "/", 100)
            with pytest.raises(TimeoutError):
                await getter.get("127.0.0.1", hung_port, "/", 100)
            with pytest.raises(OSError):
                await getter.get("127.0.0.1", 1, "/", 100)  # nothing listens on port 1
    finally:
        getter.close()
