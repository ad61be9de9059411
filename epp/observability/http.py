"""The HTTP side port (--metrics-port, 9090): Prometheus /metrics and debug endpoints."""

from __future__ import annotations

import ssl

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from epp.observability import exposition, metrics

WILDCARDS = frozenset({"0.0.0.0", "::"})
"""Bind addresses that mean every address of the host, IPv4 and IPv6 alike."""


async def _metrics(_: web.Request) -> web.Response:
    body = await exposition.render(metrics.REGISTRY)  # not in one hold of the loop
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/metrics", _metrics)
    return app


async def start(
    app: web.Application, *, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner:
    """Serve `app` on `host:port` (TLS with `ssl_context`). A wildcard host (0.0.0.0, ::) listens
    on every address, IPv4 and IPv6 where the host has it, as the gRPC ports do for either."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        # host None: asyncio binds every address getaddrinfo gives for it, one socket per family
        # (skipping a family the kernel lacks).
        site = web.TCPSite(runner, None if host in WILDCARDS else host, port, ssl_context=ssl_context)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
