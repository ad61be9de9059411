"""A real HTTP server on 127.0.0.1 that serves a vLLM-like /metrics page tests can change."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
from collections.abc import Callable

from aiohttp import web

from epp.sim.metrics_page import as_vllm_serves

from . import vllm_sample


def free_port() -> int:
    """A port nothing listens on (bound then released), for connection-refused cases."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.lru_cache(maxsize=64)
def _page(waiting: int, running: int, kv_usage: float) -> bytes:
    # Rendering a page costs milliseconds; scrapes come every 10 ms in the tests.
    return vllm_sample.vllm_metrics_page(
        engines=1, waiting=(waiting,), running=(running,), kv_usage=(kv_usage,), lora=False
    )


class FakeVLLM:
    """Serves `/metrics` from the current `waiting`/`running`/`kv_usage`, or a scripted failure.

    As vLLM does, `/metrics/` serves the page restricted to the `name[]` series asked for
    (prometheus_client's filter) and `/metrics` the whole page whatever the query; `filtered`
    False answers `/metrics/` 404, `filtered_body` replaces its page. `status` != 200 answers with
    that status; `body` (bytes) replaces the page; `delay` stalls each answer. Records each
    request's path (with its query), headers and the client port of its connection.
    """

    def __init__(self) -> None:
        self.waiting = 0
        self.running = 0
        self.kv_usage = 0.0
        self.status = 200
        self.body: bytes | None = None
        self.delay = 0.0
        self.requests = 0
        self.filtered = True
        self.filtered_body: bytes | None = None
        self.paths: list[str] = []
        self.client_ports: set[int] = set()
        self.headers: list[dict[str, str]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        # GET /v1/models: the body to answer (None: 404, as a server without the page).
        self.models: bytes | None = None
        self.model_requests = 0

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/metrics/" and not self.filtered:
            return web.Response(status=404, text="not found")
        self.requests += 1
        self.paths.append(request.path_qs)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            self.client_ports.add(peer[1])
        self.headers.append(dict(request.headers))
        if self.delay:
            # Cut short by stop(): aiohttp does not cancel a handler whose client went away.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.delay)
        if self.status != 200:
            return web.Response(status=self.status, text="unavailable")
        body = self.body if self.body is not None else _page(self.waiting, self.running, self.kv_usage)
        if self.filtered_body is not None and request.path == "/metrics/":
            body = self.filtered_body
        else:
            body = as_vllm_serves(body.decode(), request.path, request.query.getall("name[]", [])).encode()
        return web.Response(body=body, content_type="text/plain")

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self.model_requests += 1
        if self.models is None:
            return web.Response(status=404, text="not found")
        return web.Response(body=self.models, content_type="application/json")

    async def start(self, port: int = 0, *, ssl_context: ssl.SSLContext | None = None) -> FakeVLLM:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/metrics/", self._metrics)
        app.router.add_get("/prometheus/metrics", self._metrics)  # GIE's trtllm-serve path
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, reuse_address=True, ssl_context=ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def until(cond: Callable[[], bool], what: str = "condition", within: float = 2.0) -> None:
    """Poll `cond` every 5 ms; fail the test if it does not hold `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
