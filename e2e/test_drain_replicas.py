"""A replica's SIGTERM under load costs no request (issue 19, "no graceful drain").

Two `epp serve` replicas behind a real Envoy with the generated gRPC health check on the ext-proc
cluster, as `epp envoy-config` writes it; clients keep requests going while one replica gets
SIGTERM. It turns NOT_SERVING at once but keeps serving new streams for --drain-delay (default
5 s), until Envoy's health check has moved them to the other replica; then it drains and exits 0.
Before the delay, it refused new streams at once, and Envoy answered 500 to every one it still
sent there (~2-3 s of that replica's share: ~25 requests per SIGTERM in the hour-long soak,
docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import aiohttp
import pytest

from e2e.harness import Stack, StackOptions, grpc_health_status, parse_prometheus, request, wait_routable
from epp.flags import DEFAULT_DRAIN_DELAY_S

pytestmark = pytest.mark.e2e

MODEL = "sim-model"
CLIENTS = 8
BEFORE_S = 1.5  # steady load before the SIGTERM
AFTER_EXIT_S = 1.0  # and after the replica has exited


def routed(text: str) -> float:
    return sum(parse_prometheus(text, "inference_objective_request_total").values())


# With `--workers 2` the supervisor turns the pod's health NOT_SERVING at once and passes the
# SIGTERM on; each worker (Envoy's health check reaches one of them on the shared port) serves
# through the delay, then drains.
@pytest.mark.parametrize("workers", ["1", "2"])
async def test_sigterm_of_one_replica_under_load_costs_no_request(
    stacks: Any, session: aiohttp.ClientSession, workers: str
) -> None:
    options = StackOptions(
        n_backends=2, epp_replicas=2, epp_health_check=True, epp_args=["--workers", workers]
    )
    stack: Stack = stacks(options)
    await wait_routable(session, stack.url)
    leaving = stack.epps[1]
    assert leaving.process.proc is not None
    replies: list[tuple[float, int, str]] = []  # (monotonic time, status, body head)
    done = asyncio.Event()

    async def client(c: int) -> None:
        i = 0
        while not done.is_set():
            body = {"model": MODEL, "prompt": f"client {c} request {i}: say something", "max_tokens": 2}
            try:
                reply = await request(session, "POST", stack.url + "/v1/completions", body=body, total=20)
                replies.append((time.monotonic(), reply.status, reply.text[:200]))
            except (TimeoutError, aiohttp.ClientError) as exc:
                replies.append((time.monotonic(), 0, repr(exc)))
            i += 1

    clients = [asyncio.create_task(client(c)) for c in range(CLIENTS)]
    try:
        await asyncio.sleep(BEFORE_S)
        before = routed(leaving.metrics_text())
        assert before > 0, "Envoy sent the replica nothing before its SIGTERM"
        signalled = time.monotonic()
        os.kill(leaving.process.pid, signal.SIGTERM)
        # NOT_SERVING at once: that is what takes the replica out of Envoy's rotation.
        status = await asyncio.to_thread(grpc_health_status, leaving.health_port)
        assert status in ("NOT_SERVING", "UNREACHABLE"), status
        await asyncio.sleep(0.5)
        later = await asyncio.to_thread(grpc_health_status, leaving.health_port)
        code = await asyncio.to_thread(leaving.process.proc.wait, 60)
        exited = time.monotonic()
        await asyncio.sleep(AFTER_EXIT_S)
    finally:
        done.set()
        await asyncio.gather(*clients, return_exceptions=True)

    log = leaving.process.log_text(6000)
    assert code == 0, f"exit {code} after SIGTERM:\n{log}"
    failed = [r for r in replies if r[1] != 200]
    assert not failed, (
        f"{len(failed)} of {len(replies)} requests failed around the SIGTERM (first: {failed[:5]}); "
        f"envoy stats: { {k: v for k, v in stack.envoy.stats().items() if 'ext_proc' in k and v != '0'} }"
    )
    assert later == "NOT_SERVING", later  # still up (in its delay), and saying it is leaving
    during = [r for r in replies if signalled <= r[0] <= exited]
    assert len(during) >= 20, f"too little load while the replica drained: {len(during)}"
    # It served on through the delay (no in-flight stream could have kept it: each takes ms).
    assert exited - signalled >= DEFAULT_DRAIN_DELAY_S - 0.5, (exited - signalled, log)
    assert exited - signalled < DEFAULT_DRAIN_DELAY_S + 10, (exited - signalled, log)
    # The other replica took the traffic and is still up.
    assert stack.epps[0].process.alive()
    assert grpc_health_status(stack.epps[0].health_port) == "SERVING"
