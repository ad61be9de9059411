"""How `epp serve` (and each worker of `--workers N`) stops its ext-proc server.

The caller has already set health NOT_SERVING. Then, for SIGTERM (what Kubernetes, Docker and
systemd send):
1. the drain delay (`--drain-delay`, default 5 s): new ext-proc streams are still accepted and
   served. The gateway learns of NOT_SERVING only at its next health checks (Envoy marks a host
   unhealthy after `unhealthy_threshold` failed checks, one per `interval`), and every stream it
   sends meanwhile to a server that already refuses them fails (Envoy answers 500: issue 19,
   ~25 requests per SIGTERM in the soak). Kubernetes' endpoint removal takes seconds too.
2. the drain: new streams are refused, the in-flight ones (a long streamed response is one
   stream) get `--drain-timeout` to end; the rest are cancelled. Requests flow control holds
   are in-flight streams too, dispatched as capacity frees; a second before the drain ends,
   `before_cut` (flow control's close) answers those still held 503 rather than cutting them.
SIGINT (a terminal's Ctrl-C; no gateway withdraws traffic because of it) skips the delay. A
second SIGTERM/SIGINT, in either phase, cancels every stream left at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable

import grpc

from epp.observability import metrics

log = logging.getLogger("epp")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def delay_for(signum: int | None, delay: float) -> float:
    """The drain delay after `signum` (None: stopped for another reason, e.g. a lost supervisor)."""
    return 0.0 if signum == signal.SIGINT else delay


def open_streams() -> int:
    return int(metrics.REGISTRY.get_sample_value("epp_extproc_active_streams") or 0)


CUT_NOTICE = 1.0
"""Seconds before the drain's end at which `before_cut` runs (answers need a moment to go out)."""


async def drain(
    server: grpc.aio.Server, grace: float, delay: float = 0.0, before_cut: Callable[[], None] | None = None
) -> None:
    """Keep serving for `delay` seconds, then refuse new streams and give in-flight ones `grace`;
    `before_cut` runs shortly before the streams left are cancelled."""
    loop = asyncio.get_running_loop()
    again = asyncio.Event()
    for sig in SIGNALS:
        loop.add_signal_handler(sig, again.set)
    try:
        if delay > 0:
            log.info(
                "stopping: readiness NOT_SERVING; still accepting ext-proc streams for %.1fs "
                "(--drain-delay) while the gateway's health check takes this replica out",
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(again.wait(), delay)
        await _stop(server, grace, again, before_cut)
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)


async def _stop(
    server: grpc.aio.Server, grace: float, again: asyncio.Event, before_cut: Callable[[], None] | None
) -> None:
    log.info(
        "stopping: refusing new ext-proc streams; %d in flight get up to %.0fs",
        open_streams(),
        grace,
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    # grpc.aio refuses new RPCs from here on, returns as soon as the last one ends, and cancels
    # the ones left when the grace is over.
    stopping = asyncio.ensure_future(server.stop(grace))
    cut = 0
    # Polled, not awaited from gRPC, to know (and log) how many streams the deadline cuts.
    while not stopping.done() and open_streams() > 0 and not again.is_set():
        if before_cut is not None and loop.time() - started >= grace - CUT_NOTICE:
            before_cut()
            before_cut = None
        if loop.time() - started >= grace - 0.05:
            cut = open_streams()
            break
        await asyncio.sleep(0.05)
    if before_cut is not None and not stopping.done():
        before_cut()  # a second signal: the held requests are answered before the streams go
        await asyncio.sleep(0.05)
    if again.is_set() and not stopping.done():
        cut = open_streams()
        log.warning("second signal: cancelling the %d ext-proc stream(s) still in flight", cut)
        await server.stop(0)
    await stopping
    log.info(
        "ext-proc server stopped after %.1fs; %d stream(s) cut",
        loop.time() - started,
        cut,
        extra={"streams_cut": cut},
    )
