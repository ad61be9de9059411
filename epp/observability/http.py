"""The HTTP side port (--metrics-port, 9090): Prometheus /metrics and debug endpoints."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epp.observability import metrics


async def _metrics(_: web.Request) -> web.Response:
    body = generate_latest(metrics.REGISTRY)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/metrics", _metrics)
    return app


async def start(app: web.Application, *, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
