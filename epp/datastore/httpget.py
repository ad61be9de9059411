"""Keep-alive HTTP/1.1 GETs for the scraper: one connection per target, a response read into one
buffer, nothing else.

Why not aiohttp (which epp uses everywhere else): the scraper fetches every endpoint's 55 KB
/metrics page 20 times a second, and aiohttp's client machinery (request and response objects,
header multidicts, a stream reader, cookie and redirect handling) cost ~175-200 us of CPU per GET
of a real vLLM 0.32 page on this project's machine, against 60-95 us for this module's protocol in
the same run (/tmp-style script: 2,000 GETs each, `time.process_time`, the page served by
`epp.bench.fleet_pods`). At 100 pods that is the difference between ~40% and ~15% of a core.

What it speaks: `GET path HTTP/1.1` with the given headers; responses with Content-Length,
chunked transfer encoding, or neither (read to the connection's end); `Connection: close`
honoured; TLS through an `ssl.SSLContext`. A keep-alive connection the server closed while idle is
reopened once, transparently, when nothing of the response had arrived (a GET may be retried).
Bodies over `limit` bytes fail the GET (and drop the connection, its state unknown). Errors raise
`HttpError` (bad status lines, oversized bodies) or what the socket raises (OSError,
ConnectionError; TimeoutError past `timeout`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from typing import Final

MAX_HEAD_BYTES: Final = 64 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class TLSFiles:
    """PEM files for scraping over https: a CA bundle to verify the servers with, and a client
    certificate and key to present (each "" when not given)."""

    ca_cert: str = ""
    client_cert: str = ""
    client_key: str = ""

    def context(self, *, verify: bool) -> ssl.SSLContext:
        """The SSL context; raises OSError / ssl.SSLError for files that cannot be used."""
        ctx = ssl.create_default_context(cafile=self.ca_cert or None)
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key or None)
        return ctx


class HttpError(Exception):
    """A response that could not be read (malformed, or over its size limit)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one GET at a time (the caller holds `lock`)."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._error: BaseException | None = None

    # --- protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._eof = True
        self._error = exc
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _more(self) -> None:
        """Wait for more bytes (or the end); raise ConnectionError at the end."""
        if self._eof:
            raise ConnectionError(f"connection closed: {self._error}" if self._error else "connection closed")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- one GET ---

    async def get(self, request: bytes, limit: int) -> tuple[int, bytes, bool]:
        """(status, body, anything received); the connection is closed after it unless kept alive."""
        assert self.transport is not None
        self._buf.clear()
        self.transport.write(request)
        buf = self._buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise HttpError("response head over 64 KiB")
            try:
                await self._more()
            except ConnectionError:
                if buf:
                    raise
                return 0, b"", False  # closed before answering: the caller may retry once
        status, length, chunked, keep = _head(bytes(buf[:end]))
        start = end + 4
        if status < 200 or status in (204, 304):  # no body (RFC 9112 6.3)
            body = b""
        elif chunked:
            body = await self._chunked(start, limit)
        elif length is not None:
            if length > limit:
                self.close()
                raise HttpError(f"body of {length} bytes exceeds {limit}")
            while len(buf) - start < length:
                await self._more()
            body = bytes(buf[start : start + length])
        else:  # no length: the body ends with the connection
            keep = False
            while not self._eof:
                if len(buf) - start > limit:
                    self.close()
                    raise HttpError(f"body exceeds {limit} bytes")
                await self._more()
            body = bytes(buf[start:])
        if not keep:
            self.close()
        return status, body, True

    async def _chunked(self, pos: int, limit: int) -> bytes:
        buf = self._buf
        parts: list[bytes] = []
        size = 0
        while True:
            while (eol := buf.find(b"\r\n", pos)) < 0:
                await self._more()
            try:
                n = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            except ValueError:
                self.close()
                raise HttpError("bad chunk size") from None
            pos = eol + 2
            if n == 0:  # trailers, then an empty line
                while buf.find(b"\r\n", pos) != pos:
                    while (eol := buf.find(b"\r\n", pos)) < 0:
                        await self._more()
                    pos = eol + 2
                return b"".join(parts)
            size += n
            if size > limit:
                self.close()
                raise HttpError(f"body exceeds {limit} bytes")
            while len(buf) < pos + n + 2:
                await self._more()
            parts.append(bytes(buf[pos : pos + n]))
            pos += n + 2


def _head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """(status, content length, chunked, keep-alive) of a response head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"bad status line {lines[0][:60]!r}")
    status = int(parts[1])
    keep = parts[0] != b"HTTP/1.0"
    length: int | None = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise HttpError(f"bad Content-Length {value.strip()[:20]!r}") from None
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            v = value.strip().lower()
            keep = v != b"close" and (keep or v == b"keep-alive")
    return status, length, chunked, keep


class HttpGetter:
    """GETs to many (host, port) targets over one keep-alive connection each."""

    def __init__(
        self, *, timeout: float, headers: dict[str, str], ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.timeout = timeout
        self._ssl = ssl_context
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._conns: dict[tuple[str, int], _Connection] = {}
        self._requests: dict[tuple[str, int, str], bytes] = {}

    async def get(self, host: str, port: int, path: str, limit: int) -> tuple[int, bytes]:
        """(status, body) of `GET path` on host:port."""
        key = (host, port)
        conn = self._conns.get(key)
        if conn is None or conn.closed:
            conn = self._conns[key] = _Connection()
        request = self._requests.get((host, port, path))
        if request is None:
            hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            request = f"GET {path} HTTP/1.1\r\nHost: {hostport}\r\n{self._headers}\r\n".encode()
            if len(self._requests) > 4096:  # only the encoding is cached; endpoints come and go
                self._requests.clear()
            self._requests[(host, port, path)] = request
        async with conn.lock:
            try:
                async with asyncio.timeout(self.timeout):
                    for attempt in (0, 1):
                        if conn.transport is None or conn.closed:
                            conn = self._conns[key] = await self._connect(host, port, conn.lock)
                        status, body, answered = await conn.get(request, limit)
                        if answered:
                            return status, body
                        conn.close()  # closed while idle: once more on a new connection
                        if attempt:
                            raise ConnectionError("connection closed before any response")
                    raise AssertionError("unreachable")
            except BaseException:
                conn.close()  # a cancelled or failed GET leaves the connection's state unknown
                raise

    async def _connect(self, host: str, port: int, lock: asyncio.Lock) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, host, port, ssl=self._ssl)
        conn.lock = lock  # the caller holds it
        return conn

    def forget(self, host: str, port: int) -> None:
        """Close the connection to host:port (its endpoint is gone)."""
        conn = self._conns.pop((host, port), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
