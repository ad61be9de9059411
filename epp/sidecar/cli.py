"""`epp sidecar`: run the prefill/decode sidecar beside a decode pod's vLLM (epp.sidecar.proxy).

Flags follow llm-d's routing sidecar where it has one (`--port`, `--vllm-port`, `--kv-connector`,
`--prefill-max-retries`, `--prefill-retry-backoff`); epp's own bound what llm-d leaves unbounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

from aiohttp import web
from prometheus_client import generate_latest

from epp.flags import types as flags
from epp.sidecar import proxy

CONNECTORS = ("nixlv2",)
"""llm-d's `--kv-connector` values this sidecar speaks. NixlConnector's protocol is the one
checked against real vLLM here; llm-d's others (shared-storage, sglang, mooncake, offloading) are
refused at start-up: run llm-d's routing sidecar for those."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    parser.add_argument(
        "--port", type=flags.port_number, default=8000, help="port to listen on (default: %(default)s)"
    )
    parser.add_argument(
        "--vllm-port",
        type=flags.port_number,
        default=8200,
        help="the local vLLM's port on 127.0.0.1 (default: %(default)s); see --decoder-url",
    )
    parser.add_argument(
        "--decoder-url", default="", help="the local vLLM's URL (default: http://127.0.0.1:VLLM_PORT)"
    )
    parser.add_argument(
        "--kv-connector",
        default="nixlv2",
        help="the KV transfer protocol; nixlv2 (vLLM's NixlConnector) only (default: %(default)s)",
    )
    parser.add_argument(
        "--prefill-max-retries",
        type=int,
        default=2,
        help="retries of a prefill leg refused, reset or answered 502/503/504 (default: %(default)s)",
    )
    parser.add_argument(
        "--prefill-retry-backoff",
        type=flags.duration,
        default=0.1,
        help="wait between prefill retries, a Go duration or seconds (default: 100ms)",
    )
    parser.add_argument(
        "--prefill-timeout",
        type=flags.duration,
        default=120.0,
        help="the whole prefill leg, queueing included (default: 2m)",
    )
    parser.add_argument(
        "--prefill-fallback",
        choices=("local", "error"),
        default="local",
        help="when the prefill leg or the KV pull fails: prefill on the local vLLM, or answer 502 "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--connect-timeout", type=flags.duration, default=5.0, help="TCP connect, both legs (default: 5s)"
    )
    parser.add_argument(
        "--decode-idle-timeout",
        type=flags.duration,
        default=300.0,
        help="the longest the local vLLM may send nothing (default: 5m)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the sidecar's own /metrics on this port (default: off); "
        "other paths, /metrics included, go to the local vLLM",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def settings_from(args: argparse.Namespace) -> proxy.Settings:
    if args.kv_connector not in CONNECTORS:
        raise ValueError(
            f"--kv-connector {args.kv_connector!r}: epp sidecar speaks {', '.join(CONNECTORS)} "
            "(vLLM's NixlConnector); for shared-storage, sglang, mooncake or offloading run llm-d's "
            "routing sidecar"
        )
    if args.prefill_max_retries < 0:
        raise ValueError("--prefill-max-retries must be >= 0")
    return proxy.Settings(
        decoder_url=args.decoder_url or f"http://127.0.0.1:{args.vllm_port}",
        prefill_timeout_s=args.prefill_timeout,
        prefill_max_retries=args.prefill_max_retries,
        prefill_retry_backoff_s=args.prefill_retry_backoff,
        prefill_fallback=args.prefill_fallback,
        connect_timeout_s=args.connect_timeout,
        decode_idle_timeout_s=args.decode_idle_timeout,
    )


async def _metrics(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(proxy.REGISTRY), content_type="text/plain")


async def serve(args: argparse.Namespace, settings: proxy.Settings) -> None:
    # Handler cancellation: a client that goes away cancels its handler, closing both legs.
    runner = web.AppRunner(proxy.Sidecar(settings).app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    metrics_runner = None
    if args.metrics_port:
        metrics_app = web.Application()
        metrics_app.router.add_get("/metrics", _metrics)
        metrics_runner = web.AppRunner(metrics_app, access_log=None)
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, args.host, args.metrics_port).start()
    logging.getLogger("epp.sidecar").info(
        "epp sidecar on %s:%d in front of %s", args.host, args.port, settings.decoder_url
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            if metrics_runner is not None:
                await metrics_runner.cleanup()
        await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = settings_from(args)
    except ValueError as err:
        logging.getLogger("epp.sidecar").error("%s", err)
        return 2
    asyncio.run(serve(args, settings))
    return 0
